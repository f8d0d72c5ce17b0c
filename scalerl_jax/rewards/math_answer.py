"""Math verifier: the final answer compared with the record's by math-verify.

math-verify's own timeouts are off: the pool's kill bounds every call.
Design: docs/design/rewards.md.
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Mapping

from scalerl_jax.rewards import extract
from scalerl_jax.rewards import registry

# Longer answers score 0 unparsed: no gold answer comes close, and sympy's
# parsing is super-linear, so a 10^5-digit one would cost a timeout.
MAX_ANSWER_CHARS = 2048


@functools.cache
def _math_verify():
  try:
    import math_verify
  except ImportError as e:
    raise ImportError(
        "The math verifier needs the math-verify package: pip install 'scalerl_jax[tasks]'"
    ) from e
  # With the timeouts off it warns once per process, and it logs every failed
  # parse; scores and error counts already report both.
  logging.getLogger("math_verify").setLevel(logging.CRITICAL)
  return math_verify


def _as_math(text: str) -> str:
  """Wraps an answer in `$...$`, the form math-verify parses most reliably."""
  return f"${text.strip().strip('$')}$"


@functools.lru_cache(maxsize=4096)
def _parse_gold(answer: str) -> list:
  # Gold answers repeat once per generation of a prompt; parse each once.
  parsed = _math_verify().parse(_as_math(answer), parsing_timeout=None)
  if not parsed:
    raise ValueError(
        f"math-verify cannot parse the gold answer {answer[:200]!r}"
    )
  return parsed


def is_equivalent(predicted: str, gold: str) -> bool:
  """Whether math-verify finds two answers (LaTeX or plain) equivalent.

  Raises:
    ValueError: the gold answer does not parse (a data error).
  """
  mv = _math_verify()
  gold_parsed = _parse_gold(gold)
  if len(predicted) > MAX_ANSWER_CHARS:
    return False
  pred_parsed = mv.parse(_as_math(predicted), parsing_timeout=None)
  return bool(pred_parsed) and bool(
      mv.verify(gold_parsed, pred_parsed, timeout_seconds=None)
  )


@registry.register_verifier("math", kind="math")
def verify_math(
    completion: str,
    record: Mapping[str, Any],
    ctx: registry.VerifyContext,
    option: str,
) -> float:
  """1.0 if the completion's final answer equals `record["answer"]`."""
  del ctx, option  # Pure computation; the pool's timeout bounds it.
  answer = extract.extract_final_answer(completion)
  if answer is None:
    return 0.0
  return float(is_equivalent(answer, record["answer"]))
