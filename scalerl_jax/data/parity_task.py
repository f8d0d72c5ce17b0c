"""The built-in parity task: a ceiling that the generation budget can decide.

  prompt:  Compute 3 7 2 8
  chain:   <think> 3=1 7=0 2=0 8=0 </think>
           Answer: 0
  direct:  <think> </think>
           Answer: 0

The answer is the parity of the count of odd digits in the prompt (digits
may repeat). A chain step writes the next digit of the prompt and the parity
of the odd digits so far (`7=0`: 3 and 7 are two odd digits), a serial
computation that a small model does one step at a time but not in one
forward pass for long prompts. The direct answer skips the chain and must
compute the parity at one token.

The warm start writes a chain for a fraction `CHAIN_PROB` of its targets and
a guessed direct answer for the rest, so the base first decides, at the
token after `<think>`, between a chain that is right whenever it fits in
the budget and a direct answer that is right only as far as the policy
learns to compute parity in one pass (the base guesses: half right). A
chain of k digits is 9 + 4k tokens with EOS, so `sampling.max_new_tokens`
decides which levels a chain fits: that is the truncation through which the
paper says generation length moves the ceiling (docs/parity_task.md).

Levels, graded by the digits to read: 1: 2 digits, 2: 4, 3: 6, 4: 8. A
problem's split (`warm`, `train`, `val`) is a hash of its prompt
(search_task.split_of). Rewards read only the Answer line (verifier
`builtin`).
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from scalerl_jax.data import builtin_task
from scalerl_jax.data import search_task

SOURCE = "builtin_parity"
VERIFIER = builtin_task.VERIFIER  # The integer after the last `Answer:`.
SPLITS = search_task.SPLITS
DIGITS_PER_LEVEL = {1: 2, 2: 4, 3: 6, 4: 8}
LEVELS = tuple(DIGITS_PER_LEVEL)
# Fraction of warm-start targets that write the chain; the rest guess the
# answer directly. At 0.2 the 1,500-step warm start did not learn the chain
# (bits at chance; with chains only it learns them after ~450 steps), so the
# base takes the chain half the time and RL must raise or drop it per level.
CHAIN_PROB = 0.5
# Warm-start problems drawn per level (a level with fewer in its `warm` split
# gives all it has: level 1 holds 100 problems in all).
WARM_PER_LEVEL = 2_000
# What the warm start's targets depend on beside the config
# (warm_start.fingerprint).
WARM_SETTINGS = {
    "chain_prob": CHAIN_PROB,
    "warm_per_level": WARM_PER_LEVEL,
    "direct": "guess",
}
# Tokens of a chain beside its steps: `<think>`, ` `, `</think>`, `\n`,
# `Answer`, `:`, ` `, the answer digit and EOS; each step is 4 (`7=0 `).
CHAIN_FIXED_TOKENS = 9
STEP_TOKENS = 4


class Problem(search_task.DigitProblem):
  """The prompt's digits, in order; repeats allowed."""

  LEVEL_DIGITS = DIGITS_PER_LEVEL

  @property
  def answer(self) -> int:
    """Parity of the count of odd digits: 1 when it is odd."""
    return sum(d % 2 for d in self.digits) % 2


def chain_tokens(num_digits: int) -> int:
  """Completion tokens (with EOS) of the chain over `num_digits` digits."""
  return CHAIN_FIXED_TOKENS + STEP_TOKENS * num_digits


def parse_expression(expression: str) -> Problem:
  """The Problem of an expression such as `3 7 2 8`.

  Raises:
    ValueError: not an expression the task writes.
  """
  digits = search_task.digits_of(expression, "parity task")
  if len(digits) not in DIGITS_PER_LEVEL.values():
    raise ValueError(
        f"{expression!r}: a parity task problem has "
        f"{sorted(DIGITS_PER_LEVEL.values())} digits, not {len(digits)}"
    )
  return Problem(digits)


prompt_text = search_task.prompt_text  # "Compute 3 7 2 8".


def chain_text(problem: Problem, skip: Sequence[int] = ()) -> str:
  """The worked target that reads the digits in order, keeping the running
  parity, and leaves out the digits at the indices `skip`.

  Raises:
    ValueError: `skip` names an odd digit (leaving it out would change the
      parity) or no index of the problem.
  """
  for i in skip:
    if not 0 <= i < len(problem.digits) or problem.digits[i] % 2:
      raise ValueError(
          f"a chain of {problem.expression} may skip only even digits, not "
          f"index {i}"
      )
  steps, parity = [], 0
  for i, d in enumerate(problem.digits):
    parity ^= d % 2
    if i not in skip:
      steps.append(f"{d}={parity} ")
  return (
      f"{builtin_task.THINK_OPEN} {''.join(steps)}"
      f"{builtin_task.THINK_CLOSE}\n{builtin_task.ANSWER_PREFIX} "
      f"{problem.answer}"
  )


def direct_text(problem: Problem, answer: Optional[int] = None) -> str:
  """The target that answers `answer` (default: the right one) without a
  chain."""
  answer = problem.answer if answer is None else answer
  return (
      f"{builtin_task.THINK_OPEN} {builtin_task.THINK_CLOSE}\n"
      f"{builtin_task.ANSWER_PREFIX} {answer}"
  )


def target_text(
    record: Mapping[str, Any],
    rng: np.random.Generator,
    skip_prob: float = 0.0,
    chain_only: bool = False,
) -> str:
  """A warm-start target: the chain with probability CHAIN_PROB (always under
  `chain_only`, without a draw), else a direct answer drawn at random, right
  half of the time. A chain leaves out each even digit with probability
  `skip_prob` (trainer.warm_start_skip_prob): a shorter chain, just as right,
  that a tight budget rewards.

  The direct answers are guesses, not the right parity: trained on right
  ones, the 0.85M policy memorised the warm problems' answers instead of
  learning the chain (P(chain) 0.03 where the data held 0.2, chain bits at
  chance; docs/parity_task.md).
  """
  if record.get("source") != SOURCE:
    raise ValueError(
        f"prompt {record.get('id')!r}: parity_task.target_text needs a "
        f"{SOURCE} record, got source {record.get('source')!r}"
    )
  problem = parse_expression(json.loads(record["metadata"])["expression"])
  if chain_only or rng.random() < CHAIN_PROB:
    # No draws at 0, so that bases warm-started before skips existed are
    # drawn again exactly.
    skip = [
        i
        for i, d in enumerate(problem.digits)
        if skip_prob and d % 2 == 0 and rng.random() < skip_prob
    ]
    return chain_text(problem, skip)
  return direct_text(problem, int(rng.integers(2)))


def make_record(problem: Problem) -> dict[str, str]:
  """The prompt record of a problem."""
  return search_task.digit_record(problem, SOURCE)


def _split_pool(level: int, split: str, want: int, rng) -> list[Problem]:
  """Up to `want` distinct problems of `level` in `split`, in draw order."""
  n = DIGITS_PER_LEVEL[level]
  if 10**n <= 100 * want:  # Small level: enumerate it.
    every = [tuple(int(c) for c in f"{i:0{n}d}") for i in range(10**n)]
    pool = [
        Problem(d)
        for d in every
        if search_task.split_of(Problem(d).expression) == split
    ]
    return [pool[i] for i in rng.permutation(len(pool))[:want]]
  chosen: dict[str, Problem] = {}
  while len(chosen) < want:
    for digits in rng.integers(0, 10, size=(2 * want, n)):
      p = Problem(tuple(int(d) for d in digits))
      if search_task.split_of(p.expression) == split:
        chosen.setdefault(p.expression, p)
        if len(chosen) == want:
          break
  return list(chosen.values())


def parity_problems(
    levels: Sequence[int], num: int, seed: int, split: str
) -> list[Problem]:
  """`num` distinct problems of `split`, spread evenly over `levels`, shuffled.

  A level short of its share (level 1 holds 100 problems in all) gives all it
  has and the later levels make up for it. Deterministic in (levels, num,
  seed, split).

  Raises:
    ValueError: bad arguments.
  """
  if split not in SPLITS:
    raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
  if num <= 0:
    raise ValueError(f"data.builtin_num_{split}: must be > 0, got {num}")
  bad = sorted(set(levels) - set(LEVELS))
  if bad or not levels:
    raise ValueError(
        f"data.builtin_difficulty: parity task levels are {LEVELS}, got "
        f"{tuple(levels)}"
    )
  levels = sorted(set(levels))
  rng = np.random.default_rng([seed, SPLITS.index(split), 2])
  problems = []
  for i, level in enumerate(levels):
    share = -(-(num - len(problems)) // (len(levels) - i))  # Ceiling.
    problems += _split_pool(level, split, share, rng)
  return [problems[i] for i in rng.permutation(len(problems))]


def parity_prompts(
    levels: Sequence[int], num: Optional[int], seed: int, split: str
) -> list[dict[str, str]]:
  """Prompt records of `parity_problems`; `num=None` on `warm` draws
  WARM_PER_LEVEL per level."""
  if num is None:
    num = WARM_PER_LEVEL * len(set(levels))
  return [make_record(p) for p in parity_problems(levels, num, seed, split)]
