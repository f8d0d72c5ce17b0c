"""The built-in search task: find the odd digit by guessing and checking.

  prompt:  Compute 6 1 8 4
  target:  <think> 8=0 1=1 </think>
           Answer: 1

The prompt lists distinct digits, exactly one of them odd. A try writes a
digit of the prompt and its parity (`8=0`: even, `1=1`: odd), a check the
warm-started policy learns exactly. A worked target tries the digits in a
fresh random order until the odd one; the base therefore picks each try
uniformly among the digits it has not tried, a decision at a token of real
entropy (ln k for k digits). A length budget (`sampling.max_new_tokens`)
admits only a few tries, so the base solves a problem only when it picks
the odd digit early, and RL lifts the ceiling only as far as it learns to
pick it (docs/search_task.md).

Levels, graded by the digits to search: 1: 3 digits (300 problems),
2: 4 digits (1,200), 3: 6 digits, every even one (3,600).

A hash of the prompt puts a problem in one of three disjoint splits: `warm`
(the supervised warm start), `train` (RL prompts) and `val` (validation).
Rewards read only the Answer line (verifier `builtin`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import re
from typing import Any, ClassVar, Mapping, Optional, Sequence

import numpy as np

from scalerl_jax.data import builtin_task

SOURCE = "builtin_search"
VERIFIER = builtin_task.VERIFIER  # The integer after the last `Answer:`.
SPLITS = ("warm", "train", "val")
DIGITS_PER_LEVEL = {1: 3, 2: 4, 3: 6}
LEVELS = tuple(DIGITS_PER_LEVEL)
_EVEN, _ODD = (0, 2, 4, 6, 8), (1, 3, 5, 7, 9)

# Of `_BUCKETS` hash buckets, bucket 0 is validation, buckets 1 to
# `_TRAIN_BUCKETS` are RL training, the rest warm start.
_BUCKETS = 16
_TRAIN_BUCKETS = 7


@dataclasses.dataclass(frozen=True)
class DigitProblem:
  """Digits in prompt order. A task's subclass names its levels'
  `LEVEL_DIGITS` (level -> number of digits) and its `answer`."""

  digits: tuple[int, ...]
  LEVEL_DIGITS: ClassVar[Mapping[int, int]] = {}

  @property
  def level(self) -> int:
    return {n: level for level, n in self.LEVEL_DIGITS.items()}[
        len(self.digits)
    ]

  @property
  def answer(self) -> int:
    raise NotImplementedError

  @property
  def expression(self) -> str:
    return " ".join(str(d) for d in self.digits)


class Problem(DigitProblem):
  """Distinct digits in prompt order, exactly one of them odd."""

  LEVEL_DIGITS = DIGITS_PER_LEVEL

  @property
  def answer(self) -> int:
    """The odd digit."""
    return next(d for d in self.digits if d % 2)


def digit_record(problem: DigitProblem, source: str) -> dict[str, str]:
  """The prompt record of a digit task's problem (see sources.py for the
  record fields); rewards read the Answer line (verifier `builtin`)."""
  return {
      "id": f"{source}:{problem.expression}",
      "prompt": prompt_text(problem),
      "answer": str(problem.answer),
      "source": source,
      "verifier": VERIFIER,
      "metadata": json.dumps(
          {"level": problem.level, "expression": problem.expression}
      ),
  }


def try_text(digit: int) -> str:
  """One try of the thinking trace: the digit and its parity, e.g. `8=0`."""
  return f"{digit}={digit % 2}"


def digits_of(expression: str, task: str) -> tuple[int, ...]:
  """The digits of a digit task's expression, such as `6 1 8 4`.

  Raises:
    ValueError: not single digits joined by single spaces; the message
      names `task` (e.g. "search task").
  """
  if not re.fullmatch(r"\d( \d)*", expression):
    raise ValueError(f"{expression!r} is not a {task} expression")
  return tuple(int(d) for d in expression.split(" "))


def parse_expression(expression: str) -> Problem:
  """The Problem of an expression such as `6 1 8 4`.

  Raises:
    ValueError: not an expression the task writes.
  """
  digits = digits_of(expression, "search task")
  if (
      len(digits) not in DIGITS_PER_LEVEL.values()
      or len(set(digits)) != len(digits)
      or sum(d % 2 for d in digits) != 1
  ):
    raise ValueError(
        f"{expression!r}: a search task problem is "
        f"{sorted(DIGITS_PER_LEVEL.values())} distinct digits, one of them odd"
    )
  return Problem(digits)


def split_of(expression: str) -> str:
  """The split ('warm', 'train' or 'val') of an expression, by its hash."""
  digest = hashlib.blake2b(expression.encode(), digest_size=8).digest()
  bucket = int.from_bytes(digest, "little") % _BUCKETS
  if bucket == 0:
    return "val"
  return "train" if bucket <= _TRAIN_BUCKETS else "warm"


def level_problems(level: int) -> list[Problem]:
  """Every problem of a level, in a fixed order."""
  if level not in DIGITS_PER_LEVEL:
    raise ValueError(
        f"data.builtin_difficulty: search task levels are {LEVELS}, got {level}"
    )
  num_even = DIGITS_PER_LEVEL[level] - 1
  return [
      Problem(order)
      for evens in itertools.combinations(_EVEN, num_even)
      for odd in _ODD
      for order in itertools.permutations(evens + (odd,))
  ]


def prompt_text(problem: DigitProblem) -> str:
  """The prompt shown to the model."""
  return f"Compute {problem.expression}"


def solution_text(problem: Problem, guesses: Sequence[int]) -> str:
  """The worked target that tries `guesses` in order up to the odd digit.

  Raises:
    ValueError: `guesses` never reaches the odd digit.
  """
  if problem.answer not in guesses:
    raise ValueError(
        f"guesses {list(guesses)} never reach the odd digit of "
        f"{problem.expression}"
    )
  tries = guesses[: list(guesses).index(problem.answer) + 1]
  thinking = " ".join(try_text(g) for g in tries)
  return (
      f"{builtin_task.THINK_OPEN} {thinking} {builtin_task.THINK_CLOSE}\n"
      f"{builtin_task.ANSWER_PREFIX} {problem.answer}"
  )


def target_text(record: Mapping[str, Any], rng: np.random.Generator) -> str:
  """`solution_text` of a search record, tried in an order `rng` draws."""
  if record.get("source") != SOURCE:
    raise ValueError(
        f"prompt {record.get('id')!r}: search_task.target_text needs a "
        f"{SOURCE} record, got source {record.get('source')!r}"
    )
  problem = parse_expression(json.loads(record["metadata"])["expression"])
  order = rng.permutation(len(problem.digits))
  return solution_text(problem, [problem.digits[i] for i in order])


def make_record(problem: Problem) -> dict[str, str]:
  """The prompt record of a problem."""
  return digit_record(problem, SOURCE)


def search_problems(
    levels: Sequence[int], num: Optional[int], seed: int, split: str
) -> list[Problem]:
  """`num` distinct problems of `split`, spread evenly over `levels`, shuffled.

  A level short of its share gives all it has; `num=None` takes every
  problem of the split. Deterministic in (levels, num, seed, split).

  Raises:
    ValueError: bad arguments, or the levels hold fewer than `num` problems.
  """
  if split not in SPLITS:
    raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
  if num is not None and num <= 0:
    raise ValueError(f"data.builtin_num_{split}: must be > 0, got {num}")
  levels = sorted(set(levels))
  rng = np.random.default_rng([seed, SPLITS.index(split)])
  problems = []
  for i, level in enumerate(levels):
    pool = [p for p in level_problems(level) if split_of(p.expression) == split]
    share = len(pool)
    if num is not None:
      share = -(-(num - len(problems)) // (len(levels) - i))  # Ceiling.
    chosen = rng.permutation(len(pool))[:share]
    problems += [pool[j] for j in sorted(chosen)]
  if num is not None and len(problems) < num:
    raise ValueError(
        f"data.builtin_num_{split}: {num} problems asked for, but search task "
        f"levels {tuple(levels)} hold only {len(problems)} {split} problems"
    )
  return [problems[i] for i in rng.permutation(len(problems))]


def search_prompts(
    levels: Sequence[int], num: Optional[int], seed: int, split: str
) -> list[dict[str, str]]:
  """Prompt records of `search_problems(levels, num, seed, split)`."""
  return [make_record(p) for p in search_problems(levels, num, seed, split)]
