"""The built-in search task: find the hidden digit by guessing and checking.

  prompt:  Compute ?*7+45=6
  target:  <think> 8*7+45=1 3*7+45=6 </think>
           Answer: 3

Every `=` gives the units digit of its left side (8*7+45 = 101 -> 1), so a
try is one small table lookup, which the warm-started policy checks
reliably. The hidden `?` is a digit 0-9, the only one whose try gives the
digit after `=`. A worked target tries digits in a fresh random order until
one matches; the base therefore guesses uniformly, an entropy of up to
ln 10 at each guess. A length budget (`sampling.max_new_tokens`) admits only
a few tries, so the base solves a problem only when it guesses early, and RL
lifts the ceiling only as far as it learns to guess right
(docs/search_task.md).

Levels, graded by the table a try reads and by its length:

  1: ?+a=c     a in 10-99                        (900 problems)
  2: ?*a+b=c   a in 3, 7, 9; b in 10-99          (2,700 problems)
  3: ?*a+b=c   a in 11-99 ending in 1, 3, 7, 9;  (32,400 problems)
               b in 10-99

A multiplier ending in 1, 3, 7 or 9 has an inverse modulo 10, so one digit
solves each problem. A hash of the expression puts it in one of three
disjoint splits: `warm` (the supervised warm start), `train` (RL prompts)
and `val` (validation). Rewards read only the Answer line (verifier
`builtin`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import re
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from scalerl_jax.data import builtin_task

SOURCE = "builtin_search"
VERIFIER = builtin_task.VERIFIER  # The integer after the last `Answer:`.
SPLITS = ("warm", "train", "val")
LEVELS = (1, 2, 3)
DIGITS = tuple(range(10))  # Values the hidden `?` takes.

# Of `_BUCKETS` hash buckets, bucket 0 is validation, buckets 1 to
# `_TRAIN_BUCKETS` are RL training, the rest warm start.
_BUCKETS = 16
_TRAIN_BUCKETS = 7
# Level -> (values of a, values of b); b is unused at level 1 (`?+a=c`).
_RANGES = {
    1: (range(10, 100), (0,)),
    2: ((3, 7, 9), range(10, 100)),
    3: (
        tuple(a for a in range(11, 100) if a % 10 in (1, 3, 7, 9)),
        range(10, 100),
    ),
}
_EXPRESSION = re.compile(r"\?(?:\+(\d+)|\*(\d+)\+(\d+))=(\d)")


@dataclasses.dataclass(frozen=True)
class Problem:
  """`?+a=c` (level 1) or `?*a+b=c` (levels 2, 3), `?` = `digit`."""

  level: int
  digit: int
  a: int
  b: int = 0  # Unused at level 1.

  def value_at(self, guess: int) -> int:
    """The units digit of the left side with `guess` in place of `?`."""
    if self.level == 1:
      return (guess + self.a) % 10
    return (guess * self.a + self.b) % 10

  @property
  def c(self) -> int:
    return self.value_at(self.digit)

  @property
  def expression(self) -> str:
    return f"{self._left('?')}={self.c}"

  def _left(self, guess: str) -> str:
    if self.level == 1:
      return f"{guess}+{self.a}"
    return f"{guess}*{self.a}+{self.b}"

  def try_text(self, guess: int) -> str:
    """One try of the thinking trace, e.g. `8*7+45=1`."""
    return f"{self._left(str(guess))}={self.value_at(guess)}"


def parse_expression(expression: str) -> Problem:
  """The Problem of an expression such as `?*7+45=6`.

  Raises:
    ValueError: not an expression the task writes.
  """
  match = _EXPRESSION.fullmatch(expression)
  if match is None:
    raise ValueError(f"{expression!r} is not a search task expression")
  a1, a, b, c = match.groups()
  if a1 is not None:
    level, a, b = 1, int(a1), 0
  else:
    a, b = int(a), int(b)
    level = 2 if a < 10 else 3
  a_range, b_range = _RANGES[level]
  if a not in a_range or b not in b_range:
    raise ValueError(f"{expression!r}: a or b outside level {level}'s ranges")
  problem = Problem(level, 0, a, b)
  digits = [d for d in DIGITS if problem.value_at(d) == int(c)]
  problem = dataclasses.replace(problem, digit=digits[0])
  if problem.expression != expression:
    raise ValueError(f"{expression!r} is not how the task writes it")
  return problem


def split_of(expression: str) -> str:
  """The split ('warm', 'train' or 'val') of an expression, by its hash."""
  digest = hashlib.blake2b(expression.encode(), digest_size=8).digest()
  bucket = int.from_bytes(digest, "little") % _BUCKETS
  if bucket == 0:
    return "val"
  return "train" if bucket <= _TRAIN_BUCKETS else "warm"


def level_problems(level: int) -> list[Problem]:
  """Every problem of a level, in a fixed order."""
  if level not in _RANGES:
    raise ValueError(
        f"data.builtin_difficulty: search task levels are {LEVELS}, got {level}"
    )
  a_range, b_range = _RANGES[level]
  return [
      Problem(level, digit, a, b)
      for a, b in itertools.product(a_range, b_range)
      for digit in DIGITS
  ]


def prompt_text(problem: Problem) -> str:
  """The prompt shown to the model."""
  return f"Compute {problem.expression}"


def solution_text(problem: Problem, guesses: Sequence[int]) -> str:
  """The worked target that tries `guesses` in order up to the right digit.

  Raises:
    ValueError: `guesses` never reaches the hidden digit.
  """
  if problem.digit not in guesses:
    raise ValueError(
        f"guesses {list(guesses)} never reach the digit of {problem.expression}"
    )
  tries = guesses[: list(guesses).index(problem.digit) + 1]
  thinking = " ".join(problem.try_text(g) for g in tries)
  return (
      f"{builtin_task.THINK_OPEN} {thinking} {builtin_task.THINK_CLOSE}\n"
      f"{builtin_task.ANSWER_PREFIX} {problem.digit}"
  )


def target_text(record: Mapping[str, Any], rng: np.random.Generator) -> str:
  """`solution_text` of a search record, guesses in an order `rng` draws."""
  if record.get("source") != SOURCE:
    raise ValueError(
        f"prompt {record.get('id')!r}: search_task.target_text needs a "
        f"{SOURCE} record, got source {record.get('source')!r}"
    )
  problem = parse_expression(json.loads(record["metadata"])["expression"])
  return solution_text(problem, [int(g) for g in rng.permutation(len(DIGITS))])


def make_record(problem: Problem) -> dict[str, str]:
  """The prompt record of a problem (see sources.py for the record fields)."""
  return {
      "id": f"{SOURCE}:{problem.expression}",
      "prompt": prompt_text(problem),
      "answer": str(problem.digit),
      "source": SOURCE,
      "verifier": VERIFIER,
      "metadata": json.dumps(
          {"level": problem.level, "expression": problem.expression}
      ),
  }


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
