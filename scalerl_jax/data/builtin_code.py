"""The built-in code domain: f(x) from a recipe, scored in the sandbox.

  prompt:  Code f: add 5, times 3, minus 4
  target:  <think> x+5 x*3 x-4 </think>, then `def f(x)` in a python fence

A level is a recipe's length; `answer` holds asserts on three inputs, for the
`code` verifier. A hash of the recipe picks its split; the recipe is the
prompt id. Design: docs/design/data.md.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from scalerl_jax.data import builtin_task

SOURCE = "builtin_code"
VERIFIER = "code"
_OPS = {"add": "+", "minus": "-", "times": "*"}
_CONSTANTS = range(1, 10)
_TEST_INPUTS = (2, 5, 9)
_VAL_BUCKETS = 16  # One recipe in 16 (by hash) is a validation recipe.

Step = tuple[str, int]  # (operation word, constant)


def _split_of(steps: Sequence[Step]) -> str:
  digest = hashlib.blake2b(recipe(steps).encode(), digest_size=8).digest()
  return (
      "val" if int.from_bytes(digest, "little") % _VAL_BUCKETS == 0 else "train"
  )


def recipe(steps: Sequence[Step]) -> str:
  """The prompt's words for a chain of operations: `add 5, times 3`."""
  return ", ".join(f"{op} {c}" for op, c in steps)


def apply(steps: Sequence[Step], x: int) -> int:
  """The value of the recipe on `x`, left to right."""
  for op, c in steps:
    x = x + c if op == "add" else x - c if op == "minus" else x * c
  return x


def solution_text(
    steps: Sequence[Step],
    slip_prob: float = 0.0,
    rng: Optional[np.random.Generator] = None,
) -> str:
  """The worked target: the recipe as code in the thinking, then the program.

  `slip_prob` misstates one constant of the program (by one of
  `builtin_task.SLIP_OFFSETS`), drawn by `rng`; the thinking stays right.
  """
  if slip_prob and rng is None:
    raise ValueError("solution_text: slip_prob > 0 needs an rng")
  lines = [f"x{_OPS[op]}{c}" for op, c in steps]
  code = list(lines)
  if slip_prob and rng.random() < slip_prob:
    i = int(rng.integers(len(steps)))
    op, c = steps[i]
    code[i] = f"x{_OPS[op]}{c + int(rng.choice(builtin_task.SLIP_OFFSETS))}"
  body = [f"  x={line}" for line in code[:-1]] + [f"  return {code[-1]}"]
  return (
      f"{builtin_task.THINK_OPEN} {' '.join(lines)} {builtin_task.THINK_CLOSE}\n"
      "```python\ndef f(x):\n" + "\n".join(body) + "\n```"
  )


def make_record(steps: Sequence[Step]) -> dict[str, str]:
  """The prompt record of a recipe (see sources.py for the record fields)."""
  tests = "\n".join(f"assert f({x})=={apply(steps, x)}" for x in _TEST_INPUTS)
  return {
      "id": f"{SOURCE}:{recipe(steps)}",
      "prompt": f"Code f: {recipe(steps)}",
      "answer": tests,
      "source": SOURCE,
      "verifier": VERIFIER,
      "metadata": json.dumps(
          {"level": len(steps), "steps": [list(s) for s in steps]}
      ),
  }


def target_text(
    record: Mapping[str, Any],
    slip_prob: float = 0.0,
    rng: Optional[np.random.Generator] = None,
) -> str:
  """`solution_text` of a built-in code record (supervised warm start)."""
  steps = [tuple(s) for s in json.loads(record["metadata"])["steps"]]
  return solution_text(steps, slip_prob, rng)


def code_prompts(
    levels: Sequence[int], num: int, seed: int, split: str
) -> list[dict[str, str]]:
  """`num` distinct records of `split`, spread evenly over `levels`, shuffled.

  Raises:
    ValueError: bad levels, or fewer than `num` recipes in them.
  """
  if (
      num <= 0
      or not levels
      or any(not isinstance(d, int) or d < 1 for d in levels)
  ):
    raise ValueError(
        f"builtin_code: levels {levels} must be integers >= 1 and num {num} > 0"
    )
  rng = np.random.default_rng([seed, builtin_task.SPLITS.index(split), 7])
  step_choices = [(op, c) for op in _OPS for c in _CONSTANTS]
  chosen = []
  levels = sorted(set(levels))
  for i, level in enumerate(levels):
    share = -(-(num - len(chosen)) // (len(levels) - i))
    if len(step_choices) ** level <= 50_000:
      pool = [
          s
          for s in itertools.product(step_choices, repeat=level)
          if _split_of(s) == split
      ]
      chosen += [pool[j] for j in rng.permutation(len(pool))[:share]]
      continue
    seen = set()
    while len(seen) < share:
      steps = tuple(
          step_choices[j] for j in rng.integers(len(step_choices), size=level)
      )
      if steps not in seen and _split_of(steps) == split:
        seen.add(steps)
        chosen.append(steps)
  if len(chosen) < num:
    raise ValueError(
        f"builtin_code: {num} {split} recipes asked for, levels {tuple(levels)} "
        f"hold {len(chosen)}; lower the number or add levels"
    )
  return [make_record(chosen[j]) for j in rng.permutation(len(chosen))]
