"""Math verifier: the completion's final answer checked with math-verify.

The final answer is extracted by `extract.extract_final_answer` (`\\boxed{}`,
`<answer>` tag or `Answer:` line) from the text after the thinking trace (see
`registry.verify`), and compared with the record's `answer` by
math-verify (symbolic and numeric equivalence: `0.5` == `\\frac{1}{2}`,
`1+x^2` == `x^2+1`). math-verify's own signal-based timeouts are switched
off: the reward pool's hard kill bounds every call instead.
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Mapping

from scalerl_jax.rewards import extract
from scalerl_jax.rewards import registry

# Extracted answers longer than this are scored wrong without parsing. No math
# gold answer comes close, and sympy's parsing is super-linear in the length,
# so a 10^5-digit "answer" would otherwise cost a worker restart on timeout.
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
    raise ValueError(f"math-verify cannot parse the gold answer {answer[:200]!r}")
  return parsed


def is_equivalent(predicted: str, gold: str) -> bool:
  """Whether two math answers are equivalent according to math-verify.

  Args:
    predicted: an extracted answer (LaTeX or plain).
    gold: the reference answer.

  Returns:
    True when math-verify finds them equal.

  Raises:
    ValueError: the gold answer does not parse (a data error, not a wrong
      completion).
  """
  mv = _math_verify()
  gold_parsed = _parse_gold(gold)
  if len(predicted) > MAX_ANSWER_CHARS:
    return False
  pred_parsed = mv.parse(_as_math(predicted), parsing_timeout=None)
  return bool(pred_parsed) and bool(mv.verify(gold_parsed, pred_parsed, timeout_seconds=None))


@registry.register_verifier("math", kind="math")
def verify_math(completion: str, record: Mapping[str, Any], ctx: registry.VerifyContext,
                option: str) -> float:
  """1.0 if the completion's final answer equals `record["answer"]`, else 0.0."""
  del ctx, option  # Pure computation; the pool's timeout bounds it.
  answer = extract.extract_final_answer(completion)
  if answer is None:
    return 0.0
  return float(is_equivalent(answer, record["answer"]))
