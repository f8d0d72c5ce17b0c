"""The built-in search task: find the key of a value by guessing and checking.

  prompt:  Compute 0=62 1=17 2=93 3=40 ?=40
  target:  <think> 2=93 3=40 </think>
           Answer: 3

The prompt lists keys 0, 1, ... with distinct two-digit values and asks for
the key of the last value. A worked target tries keys in a fresh random
order, copying each one's value, until the value matches; the warm-started
policy therefore checks by copying (which a small model learns well) but
guesses uniformly, an entropy of up to ln 10 at each guess. A length budget
(`sampling.max_new_tokens`) admits only a few tries, so the base solves a
problem only when it guesses early, and RL lifts the ceiling only as far as
it learns to find the value in the prompt (docs/search_task.md).

Levels, graded by the number of keys to search: 1: 4 keys, 2: 7, 3: 10.

A hash of the prompt puts a problem in one of three disjoint splits: `warm`
(the supervised warm start), `train` (RL prompts) and `val` (validation).
Rewards read only the Answer line (verifier `builtin`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from typing import Any, Mapping, Sequence

import numpy as np

from scalerl_jax.data import builtin_task

SOURCE = "builtin_search"
VERIFIER = builtin_task.VERIFIER  # The integer after the last `Answer:`.
SPLITS = ("warm", "train", "val")
KEYS = {1: 4, 2: 7, 3: 10}  # Level -> number of keys.
LEVELS = tuple(KEYS)
VALUES = range(10, 100)  # Two-digit values, distinct within a problem.
# Problems of the warm split the supervised warm start trains on.
WARM_PROBLEMS = 12_000

# Of `_BUCKETS` hash buckets, bucket 0 is validation, buckets 1 to
# `_TRAIN_BUCKETS` are RL training, the rest warm start.
_BUCKETS = 16
_TRAIN_BUCKETS = 7
_ENTRY = re.compile(r"(\d)=(\d\d)")


@dataclasses.dataclass(frozen=True)
class Problem:
  """Keys 0 .. len(values) - 1 with `values`; the answer is key `digit`."""

  values: tuple[int, ...]
  digit: int

  @property
  def level(self) -> int:
    return {n: level for level, n in KEYS.items()}[len(self.values)]

  @property
  def target(self) -> int:
    return self.values[self.digit]

  @property
  def expression(self) -> str:
    table = " ".join(self.try_text(k) for k in range(len(self.values)))
    return f"{table} ?={self.target}"

  def try_text(self, key: int) -> str:
    """One try of the thinking trace, e.g. `2=93`."""
    return f"{key}={self.values[key]}"


def parse_expression(expression: str) -> Problem:
  """The Problem of an expression such as `0=62 1=17 2=93 3=40 ?=40`.

  Raises:
    ValueError: not an expression the task writes.
  """
  *entries, question = expression.split(" ")
  matches = [_ENTRY.fullmatch(e) for e in entries]
  asked = re.fullmatch(r"\?=(\d\d)", question)
  if asked is None or not all(matches):
    raise ValueError(f"{expression!r} is not a search task expression")
  keys = [int(m.group(1)) for m in matches]
  values = tuple(int(m.group(2)) for m in matches)
  if (
      len(values) not in KEYS.values()
      or keys != list(range(len(keys)))
      or len(set(values)) != len(values)
      or int(asked.group(1)) not in values
  ):
    raise ValueError(
        f"{expression!r}: keys must run 0, 1, ... over {sorted(KEYS.values())} "
        "distinct values, one of them asked for"
    )
  return Problem(values, values.index(int(asked.group(1))))


def split_of(expression: str) -> str:
  """The split ('warm', 'train' or 'val') of an expression, by its hash."""
  digest = hashlib.blake2b(expression.encode(), digest_size=8).digest()
  bucket = int.from_bytes(digest, "little") % _BUCKETS
  if bucket == 0:
    return "val"
  return "train" if bucket <= _TRAIN_BUCKETS else "warm"


def random_problem(level: int, rng: np.random.Generator) -> Problem:
  """A problem of `level`: distinct values, the asked key uniform."""
  if level not in KEYS:
    raise ValueError(
        f"data.builtin_difficulty: search task levels are {LEVELS}, got {level}"
    )
  values = rng.choice(len(VALUES), KEYS[level], replace=False) + VALUES.start
  return Problem(tuple(int(v) for v in values), int(rng.integers(KEYS[level])))


def prompt_text(problem: Problem) -> str:
  """The prompt shown to the model."""
  return f"Compute {problem.expression}"


def solution_text(problem: Problem, guesses: Sequence[int]) -> str:
  """The worked target that tries `guesses` in order up to the right key.

  Raises:
    ValueError: `guesses` never reaches the key asked for.
  """
  if problem.digit not in guesses:
    raise ValueError(
        f"guesses {list(guesses)} never reach the key of {problem.expression}"
    )
  tries = guesses[: list(guesses).index(problem.digit) + 1]
  thinking = " ".join(problem.try_text(g) for g in tries)
  return (
      f"{builtin_task.THINK_OPEN} {thinking} {builtin_task.THINK_CLOSE}\n"
      f"{builtin_task.ANSWER_PREFIX} {problem.digit}"
  )


def target_text(record: Mapping[str, Any], rng: np.random.Generator) -> str:
  """`solution_text` of a search record, keys tried in an order `rng` draws."""
  if record.get("source") != SOURCE:
    raise ValueError(
        f"prompt {record.get('id')!r}: search_task.target_text needs a "
        f"{SOURCE} record, got source {record.get('source')!r}"
    )
  problem = parse_expression(json.loads(record["metadata"])["expression"])
  order = rng.permutation(len(problem.values))
  return solution_text(problem, [int(g) for g in order])


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
    levels: Sequence[int], num: int, seed: int, split: str
) -> list[Problem]:
  """`num` distinct problems of `split`, spread evenly over `levels`, shuffled.

  Deterministic in (levels, num, seed, split).

  Raises:
    ValueError: bad arguments.
  """
  if split not in SPLITS:
    raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
  if num <= 0:
    raise ValueError(f"data.builtin_num_{split}: must be > 0, got {num}")
  levels = sorted(set(levels))
  rng = np.random.default_rng([seed, SPLITS.index(split)])
  problems, seen = [], set()
  for i, level in enumerate(levels):
    share = -(-(num - len(problems)) // (len(levels) - i))  # Ceiling.
    # Each level holds far more problems (10 x 90!/80! at level 3) than a
    # split asks for; 4 keys have 2.4e8.
    while share:
      problem = random_problem(level, rng)
      if (
          problem.expression not in seen
          and split_of(problem.expression) == split
      ):
        seen.add(problem.expression)
        problems.append(problem)
        share -= 1
  return [problems[i] for i in rng.permutation(len(problems))]


def search_prompts(
    levels: Sequence[int], num: int, seed: int, split: str
) -> list[dict[str, str]]:
  """Prompt records of `search_problems(levels, num, seed, split)`."""
  return [make_record(p) for p in search_problems(levels, num, seed, split)]
