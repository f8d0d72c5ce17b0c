"""Task scorers: the built-in task and reasoning-gym datasets.

`builtin` is `data.builtin_task.score_builtin`; `reasoning_gym:<name>` scores
the extracted final answer with that dataset's `score_answer`, given the
entry the record carries in its metadata. Design: docs/design/rewards.md.
"""

from __future__ import annotations

import functools
import json
from typing import Any, Callable, Mapping

from scalerl_jax.data.builtin_task import score_builtin
from scalerl_jax.rewards import extract
from scalerl_jax.rewards import registry


@registry.register_verifier("builtin", kind="task")
def verify_builtin(
    completion: str,
    record: Mapping[str, Any],
    ctx: registry.VerifyContext,
    option: str,
) -> float:
  """The built-in task's score of the completion against `record["answer"]`."""
  del ctx, option
  return score_builtin(completion, record["answer"])


@functools.cache
def _score_answer_fn(name: str) -> Callable[..., float]:
  try:
    from reasoning_gym import factory
  except ImportError as e:
    raise ImportError(
        "reasoning_gym verifiers need the reasoning-gym package: "
        "pip install 'scalerl_jax[tasks]'"
    ) from e
  return factory.get_score_answer_fn(name)


@registry.register_verifier(
    "reasoning_gym",
    kind="task",
    takes_option=True,
    required_fields=("metadata",),
)
def verify_reasoning_gym(
    completion: str,
    record: Mapping[str, Any],
    ctx: registry.VerifyContext,
    option: str,
) -> float:
  """reasoning-gym's `score_answer` of dataset `option`, on the final answer."""
  del ctx
  answer = extract.extract_final_answer(completion)
  if answer is None:
    return 0.0
  entry = json.loads(record["metadata"])
  return float(_score_answer_fn(option)(answer=answer, entry=entry))
