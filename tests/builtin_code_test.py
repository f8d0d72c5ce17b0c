"""Tests of the built-in code domain: records, worked solutions, splits."""

import collections
import json

import numpy as np
import pytest

from scalerl_jax import rewards
from scalerl_jax.data import builtin_code


@pytest.mark.needs_bwrap
def test_worked_solution_passes_the_sandbox_and_a_slip_fails():
  record = builtin_code.make_record([("add", 5), ("times", 3), ("minus", 4)])
  assert record["prompt"] == "Code f: add 5, times 3, minus 4"
  # f(2) = (2+5)*3-4 = 17; f(5) = 26; f(9) = 38.
  assert record["answer"] == "assert f(2)==17\nassert f(5)==26\nassert f(9)==38"
  target = builtin_code.target_text(record)
  assert target == (
      "<think> x+5 x*3 x-4 </think>\n```python\ndef f(x):\n  x=x+5\n  x=x*3\n"
      "  return x-4\n```"
  )
  assert rewards.verify(target, record, rewards.resolve_spec(record)) == 1.0
  slipped = builtin_code.target_text(record, 1.0, np.random.default_rng(0))
  assert (
      slipped != target
      and slipped.split("</think>")[0] == target.split("</think>")[0]
  )
  assert rewards.verify(slipped, record, "code") == 0.0
  assert rewards.verify("<think> x </think>no program", record, "code") == 0.0


def test_splits_are_disjoint_distinct_and_spread_over_levels():
  train = builtin_code.code_prompts((1, 2, 3), 300, 0, "train")
  val = builtin_code.code_prompts((1, 2, 3), 40, 0, "val")
  assert (
      len({r["id"] for r in train}) == 300 and len({r["id"] for r in val}) == 40
  )
  assert not {r["id"] for r in train} & {r["id"] for r in val}
  levels = collections.Counter(
      json.loads(r["metadata"])["level"] for r in train
  )
  # Level 1 holds 25 train recipes.
  assert levels[1] == 25 and levels[2] + levels[3] == 275
  assert builtin_code.code_prompts((1, 2, 3), 300, 0, "train") == train
  assert builtin_code.code_prompts((1, 2, 3), 300, 1, "train") != train


def test_too_many_recipes_raise():
  with pytest.raises(ValueError, match="recipes asked for"):
    builtin_code.code_prompts((1,), 100, 0, "train")
