"""The built-in task: integer arithmetic with a short thinking trace.

  prompt:  Compute 7+5*3-4
  target:  <think> 7+5*3-4 = 7+15-4 = 22-4 = 18 </think>
           Answer: 18

Operands are digits 1-9; a level is the number of operators. A hash of the
expression picks its split; the expression is the prompt id.
Design: docs/design/data.md.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import re
from typing import Any, Mapping, Optional, Sequence

import numpy as np

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
ANSWER_PREFIX = "Answer:"
SOURCE = "builtin"
VERIFIER = "builtin"
SPLITS = ("train", "val")

_OPERATORS = "+-*"
_MIN_OPERAND, _MAX_OPERAND = 1, 9
# One expression in `_VAL_BUCKETS` (by hash) belongs to the validation split.
_VAL_BUCKETS = 16
# A level is sampled with rejection while at most `_SAMPLE_MAX_FRACTION` of its
# expressions in the split are asked for; beyond that it is enumerated, which
# levels of up to `_ENUMERATE_MAX` expressions (levels 1-3) allow.
_SAMPLE_MAX_FRACTION = 0.25
_ENUMERATE_MAX = 200_000
# A slipped rewrite or Answer line (trainer.warm_start_slip_prob,
# warm_start_answer_slip_prob) is off by one of these: the carry and sign
# slips of mental arithmetic.
SLIP_OFFSETS = (-10, -2, -1, 1, 2, 10)
_ANSWER_VALUE = re.compile(r"\s*([+-]?)([0-9]+)\s*")


@dataclasses.dataclass(frozen=True)
class Problem:
  """One arithmetic expression: `operands[0] ops[0] operands[1] ...`."""

  operands: tuple[int, ...]
  ops: str

  @property
  def level(self) -> int:
    return len(self.ops)

  @property
  def expression(self) -> str:
    return _format(self.operands, self.ops)

  def steps(
      self, slip_prob: float = 0.0, rng: Optional[np.random.Generator] = None
  ) -> list[str]:
    """The expression after each rewrite, from the original to the value.

    With probability `slip_prob` a rewrite is off by one of `SLIP_OFFSETS`
    and the chain goes on from it; `rng`, which draws it, is then required.
    """
    if slip_prob and rng is None:
      raise ValueError("Problem.steps: slip_prob > 0 needs an rng")
    operands, ops = list(self.operands), list(self.ops)
    chain = [_format(operands, ops)]
    while ops:
      i = ops.index("*") if "*" in ops else 0
      a, b = operands[i], operands[i + 1]
      value = a * b if ops[i] == "*" else a + b if ops[i] == "+" else a - b
      if slip_prob and rng.random() < slip_prob:
        value += int(rng.choice(SLIP_OFFSETS))
      operands[i : i + 2] = [value]
      del ops[i]
      chain.append(_format(operands, ops))
    return chain

  @property
  def value(self) -> int:
    return int(self.steps()[-1])


def _format(operands: Sequence[int], ops: Sequence[str]) -> str:
  parts = [str(operands[0])]
  for op, operand in zip(ops, operands[1:]):
    parts += [op, str(operand)]
  return "".join(parts)


def parse_expression(expression: str) -> Problem:
  """The Problem of an expression such as `7+5*3-4`; ValueError if not one."""
  if not re.fullmatch(r"[1-9]([-+*][1-9])+", expression):
    raise ValueError(
        f"{expression!r} is not a built-in task expression (digits 1-9 joined by + - *)"
    )
  return Problem(tuple(int(c) for c in expression[0::2]), expression[1::2])


def split_of(expression: str) -> str:
  """The split ('train' or 'val') that an expression belongs to, by its hash."""
  digest = hashlib.blake2b(expression.encode(), digest_size=8).digest()
  return (
      "val" if int.from_bytes(digest, "little") % _VAL_BUCKETS == 0 else "train"
  )


def prompt_text(problem: Problem) -> str:
  """The prompt shown to the model."""
  return f"Compute {problem.expression}"


def solution_text(
    problem: Problem,
    slip_prob: float = 0.0,
    rng: Optional[np.random.Generator] = None,
    answer_slip_prob: float = 0.0,
) -> str:
  """The worked target: the `<think>` trace of rewrites, then the Answer line.

  `slip_prob` slips rewrites (`Problem.steps`); `answer_slip_prob` misstates
  the Answer line by one of `SLIP_OFFSETS`, the thinking unchanged. `rng`
  draws the slips; required when either is > 0.
  """
  if answer_slip_prob and rng is None:
    raise ValueError("solution_text: answer_slip_prob > 0 needs an rng")
  steps = problem.steps(slip_prob, rng)
  answer = steps[-1]
  if answer_slip_prob and rng.random() < answer_slip_prob:
    answer = str(int(answer) + int(rng.choice(SLIP_OFFSETS)))
  return f"{THINK_OPEN} {' = '.join(steps)} {THINK_CLOSE}\n{ANSWER_PREFIX} {answer}"


def target_text(
    record: Mapping[str, Any],
    slip_prob: float = 0.0,
    rng: Optional[np.random.Generator] = None,
    answer_slip_prob: float = 0.0,
) -> str:
  """`solution_text` of a built-in record; ValueError for any other record."""
  if record.get("source") != SOURCE:
    raise ValueError(
        f"prompt {record.get('id')!r}: target_text needs a built-in task record, got "
        f"source {record.get('source')!r}"
    )
  return solution_text(
      parse_expression(json.loads(record["metadata"])["expression"]),
      slip_prob,
      rng,
      answer_slip_prob,
  )


def make_record(problem: Problem) -> dict[str, str]:
  """The prompt record of a problem (see sources.py for the record fields)."""
  return {
      "id": f"{SOURCE}:{problem.expression}",
      "prompt": prompt_text(problem),
      "answer": str(problem.value),
      "source": SOURCE,
      "verifier": VERIFIER,
      "metadata": json.dumps(
          {"level": problem.level, "expression": problem.expression}
      ),
  }


def _canonical_integer(sign: str, digits: str) -> str:
  digits = digits.lstrip("0") or "0"
  return digits if sign != "-" or digits == "0" else "-" + digits


def score_builtin(completion: Optional[str], answer: Optional[str]) -> float:
  """1.0 if all that follows the last `Answer:` is the integer `answer`.

  Linear in the input; never raises (a non-string scores 0.0). `completion`
  is the answer region: `rewards.registry.verify` strips the thinking.
  """
  if not isinstance(completion, str) or not isinstance(answer, str):
    return 0.0
  reference = _ANSWER_VALUE.fullmatch(answer)
  start = completion.rfind(ANSWER_PREFIX)
  if reference is None or start < 0:
    return 0.0
  value = _ANSWER_VALUE.fullmatch(completion, start + len(ANSWER_PREFIX))
  if value is None:
    return 0.0
  return float(
      _canonical_integer(*value.groups())
      == _canonical_integer(*reference.groups())
  )


def _num_expressions(level: int) -> int:
  return (_MAX_OPERAND - _MIN_OPERAND + 1) ** (level + 1) * len(
      _OPERATORS
  ) ** level


def _random_problem(level: int, rng: np.random.Generator) -> Problem:
  operands = rng.integers(_MIN_OPERAND, _MAX_OPERAND + 1, size=level + 1)
  ops = rng.integers(0, len(_OPERATORS), size=level)
  return Problem(
      tuple(int(v) for v in operands), "".join(_OPERATORS[i] for i in ops)
  )


def _draw_level(
    level: int, count: int, split: str, rng: np.random.Generator
) -> list[Problem]:
  """Up to `count` distinct problems of one level in `split`."""
  total = _num_expressions(level)
  in_split = (
      total / _VAL_BUCKETS if split == "val" else total * (1 - 1 / _VAL_BUCKETS)
  )
  if count <= _SAMPLE_MAX_FRACTION * in_split:
    problems, seen = [], set()
    while len(problems) < count:
      problem = _random_problem(level, rng)
      expression = problem.expression
      if expression not in seen and split_of(expression) == split:
        seen.add(expression)
        problems.append(problem)
    return problems
  if total > _ENUMERATE_MAX:
    raise ValueError(
        f"data.builtin_num_{split}: {count} distinct level-{level} problems asked for, more "
        f"than the sampler can draw from the ~{int(in_split)} in the {split} split; "
        "lower the number of problems or add levels to data.builtin_difficulty"
    )
  digits = range(_MIN_OPERAND, _MAX_OPERAND + 1)
  candidates = []
  for operands in itertools.product(digits, repeat=level + 1):
    for ops in itertools.product(_OPERATORS, repeat=level):
      problem = Problem(operands, "".join(ops))
      if split_of(problem.expression) == split:
        candidates.append(problem)
  chosen = rng.permutation(len(candidates))[:count]
  return [candidates[i] for i in sorted(chosen)]


def builtin_problems(
    levels: Sequence[int], num: int, seed: int, split: str
) -> list[Problem]:
  """`num` distinct problems of `split`, spread evenly over `levels`, shuffled.

  Deterministic; a level short of its share gives all it has.

  Raises:
    ValueError: bad arguments, or the levels hold fewer than `num` problems.
  """
  if split not in SPLITS:
    raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
  field = f"data.builtin_num_{split}"
  if num <= 0:
    raise ValueError(f"{field}: must be > 0, got {num}")
  if not levels or any(
      isinstance(d, bool) or not isinstance(d, int) or d < 1 for d in levels
  ):
    raise ValueError(
        f"data.builtin_difficulty: levels must be integers >= 1, got {levels}"
    )
  levels = sorted(set(levels))
  rng = np.random.default_rng([seed, SPLITS.index(split)])
  problems = []
  for i, level in enumerate(levels):
    levels_left = len(levels) - i
    share = -(-(num - len(problems)) // levels_left)  # Ceiling division.
    problems += _draw_level(level, share, split, rng)
  if len(problems) < num:
    raise ValueError(
        f"{field}: {num} problems asked for, but levels {tuple(levels)} hold only "
        f"{len(problems)} distinct {split} problems; lower it or add harder levels to "
        "data.builtin_difficulty"
    )
  return [problems[i] for i in rng.permutation(len(problems))]


def builtin_prompts(
    levels: Sequence[int], num: int, seed: int, split: str
) -> list[dict[str, str]]:
  """Prompt records of `builtin_problems(levels, num, seed, split)`."""
  return [make_record(p) for p in builtin_problems(levels, num, seed, split)]
