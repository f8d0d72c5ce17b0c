"""Tests of the built-in arithmetic task: problems, worked targets, scorer."""

import itertools
import json
import re
import time

import numpy as np
import pytest

from configs import scalerl
from scalerl_jax.data import builtin_task


def _reference_value(expression):
  # Python's own precedence and left associativity are the task's rules; the
  # regex guarantees eval only sees digits and + - *.
  assert re.fullmatch(r"[1-9]([-+*][1-9])+", expression)
  return eval(expression)  # pylint: disable=eval-used


def test_answers_are_correct_and_pass_the_task_checker():
  for split in builtin_task.SPLITS:
    for record in builtin_task.builtin_prompts((1, 2, 3, 4, 5), 500, 7, split):
      expression = json.loads(record["metadata"])["expression"]
      assert record["answer"] == str(_reference_value(expression))
      assert record["prompt"] == f"Compute {expression}"
      assert (
          builtin_task.score_builtin(
              builtin_task.target_text(record), record["answer"]
          )
          == 1.0
      )
      wrong = str(int(record["answer"]) + 1)
      assert (
          builtin_task.score_builtin(builtin_task.target_text(record), wrong)
          == 0.0
      )


def test_train_and_val_share_no_prompt_across_seeds():
  config = scalerl.get_config()
  levels = config.data.builtin_difficulty
  train = builtin_task.builtin_prompts(
      levels, config.data.builtin_num_train, 0, "train"
  )
  val = builtin_task.builtin_prompts(
      levels, config.data.builtin_num_val, 0, "val"
  )
  val_other_seed = builtin_task.builtin_prompts(
      levels, config.data.builtin_num_val, 1, "val"
  )
  assert len(train) == config.data.builtin_num_train
  assert len(val) == config.data.builtin_num_val
  train_prompts = {r["prompt"] for r in train}
  assert len(train_prompts) == len(train)  # Distinct problems within a split.
  assert not train_prompts & {r["prompt"] for r in val}
  assert not train_prompts & {r["prompt"] for r in val_other_seed}
  assert all(
      builtin_task.split_of(r["id"].split(":", 1)[1]) == "val" for r in val
  )


def test_same_seed_same_problems_other_seed_other_problems():
  first = builtin_task.builtin_prompts((2, 3), 300, 5, "train")
  assert first == builtin_task.builtin_prompts((2, 3), 300, 5, "train")
  other = builtin_task.builtin_prompts((2, 3), 300, 6, "train")
  assert [r["id"] for r in first] != [r["id"] for r in other]


def test_small_levels_give_all_they_have_and_the_rest_is_shared():
  level_one_train = sum(
      builtin_task.split_of(
          builtin_task.Problem(operands, "".join(ops)).expression
      )
      == "train"
      for operands in itertools.product(range(1, 10), repeat=2)
      for ops in itertools.product("+-*", repeat=1)
  )
  records = builtin_task.builtin_prompts((1, 2, 3), 3000, 0, "train")
  levels = [json.loads(r["metadata"])["level"] for r in records]
  # 1000 asked of level 1; it has fewer, so levels 2 and 3 split the rest.
  remainder = 3000 - level_one_train
  assert levels.count(1) == level_one_train
  assert levels.count(2) == -(-remainder // 2)
  assert levels.count(3) == remainder // 2


def test_asking_for_more_problems_than_exist_names_the_field():
  with pytest.raises(
      ValueError,
      match=r"data\.builtin_num_train: 1000 problems .* levels \(1,\)",
  ):
    builtin_task.builtin_prompts((1,), 1000, 0, "train")
  with pytest.raises(ValueError, match="data.builtin_difficulty"):
    builtin_task.builtin_prompts((0, 2), 10, 0, "train")
  with pytest.raises(ValueError, match="split"):
    builtin_task.builtin_prompts((2,), 10, 0, "test")


@pytest.mark.parametrize(
    "expression,target",
    [
        (
            "7+5*3-4",
            "<think> 7+5*3-4 = 7+15-4 = 22-4 = 18 </think>\nAnswer: 18",
        ),
        ("3-9*2", "<think> 3-9*2 = 3-18 = -15 </think>\nAnswer: -15"),
        ("8-3-2", "<think> 8-3-2 = 5-2 = 3 </think>\nAnswer: 3"),
        ("2*3*4+1", "<think> 2*3*4+1 = 6*4+1 = 24+1 = 25 </think>\nAnswer: 25"),
        ("9+9", "<think> 9+9 = 18 </think>\nAnswer: 18"),
    ],
)
def test_worked_target_rewrites_one_operation_per_step(expression, target):
  problem = builtin_task.parse_expression(expression)
  assert builtin_task.solution_text(problem) == target
  record = builtin_task.make_record(problem)
  assert record["id"] == f"builtin:{expression}"
  assert builtin_task.target_text(record) == target


@pytest.mark.parametrize(
    "bad", ["", "7", "7+", "0+1", "12+3", "7/2", "7 + 2", "-7+2"]
)
def test_parse_expression_rejects_other_text(bad):
  with pytest.raises(ValueError, match="not a built-in task expression"):
    builtin_task.parse_expression(bad)


def test_target_text_needs_a_builtin_record():
  record = {"id": "jsonl:1", "source": "jsonl", "metadata": "{}"}
  with pytest.raises(ValueError, match="prompt 'jsonl:1'.*source 'jsonl'"):
    builtin_task.target_text(record)


@pytest.mark.parametrize(
    "completion,answer,expected",
    [
        ("<think> 9+9 = 18 </think>\nAnswer: 18", "18", 1.0),
        ("Answer: 18", "18", 1.0),
        ("Answer:18", "18", 1.0),
        ("Answer: 018\n", "18", 1.0),
        ("Answer: +18", "18", 1.0),
        ("Answer: -0", "0", 1.0),
        ("Answer: -15", "-15", 1.0),
        ("Answer: 15", "-15", 0.0),
        ("Answer: 17", "18", 0.0),
        ("Answer: 17\nAnswer: 18", "18", 1.0),
        ("Answer: 18\nAnswer: 17", "18", 0.0),
        ("Answer: 18 Answer:", "18", 0.0),
        ("Answer: 18.0", "18", 0.0),
        ("Answer: 18abc", "18", 0.0),
        ("Answer: 1 8", "18", 0.0),
        ("answer: 18", "18", 0.0),
        ("18", "18", 0.0),
        (
            "Answer: \u0661\u0668",
            "18",
            0.0,
        ),  # Arabic-Indic digits are not [0-9].
        ("Answer: 18", "not a number", 0.0),
        ("Answer: 18\ud800", "18", 0.0),  # A lone surrogate (invalid Unicode).
        ("", "18", 0.0),
        (None, "18", 0.0),
        ("Answer: 18", None, 0.0),
        (b"Answer: 18", "18", 0.0),
        (18, "18", 0.0),
    ],
)
def test_score_builtin(completion, answer, expected):
  assert builtin_task.score_builtin(completion, answer) == expected


def test_score_builtin_on_huge_inputs_is_fast_and_exact():
  digits = "7" * 100_000  # Beyond int()'s 4300-digit conversion limit.
  start = time.perf_counter()
  assert builtin_task.score_builtin(f"Answer: {digits}", digits) == 1.0
  assert builtin_task.score_builtin(f"Answer: {digits}8", digits) == 0.0
  # 1.8 MB.
  assert builtin_task.score_builtin("Answer: 1" * 200_000, "1") == 1.0
  assert builtin_task.score_builtin("x" * 1_000_000 + "Answer:", "1") == 0.0
  assert builtin_task.score_builtin("5^{5^{5^{5^5}}}", "5") == 0.0
  assert time.perf_counter() - start < 1.0


def test_slipped_solutions_are_self_consistent_and_slip_at_the_given_rate():
  problem = builtin_task.parse_expression("7+5*3-4")
  # Every rewrite slips: 5*3 -> 15+a, then 7+(15+a) -> 22+a+b, then
  # (22+a+b)-4 -> 18+a+b+c, with a, b, c in SLIP_OFFSETS.
  steps = problem.steps(1.0, np.random.default_rng(0))
  a = int(steps[1].split("+")[1].split("-")[0]) - 15
  b = int(steps[2].split("-")[0]) - 22 - a
  c = int(steps[3]) - 18 - a - b
  assert {a, b, c} <= set(builtin_task.SLIP_OFFSETS)
  assert builtin_task.solution_text(
      problem, 1.0, np.random.default_rng(0)
  ).endswith(f"Answer: {steps[3]}")
  assert problem.steps(0.0) == ["7+5*3-4", "7+15-4", "22-4", "18"]
  rng = np.random.default_rng(1)
  problems = builtin_task.builtin_problems((1,), 200, 0, "train")
  slipped = [
      p.steps(0.3, rng)[1] != p.steps()[1] for p in problems for _ in range(10)
  ]
  # 2,000 draws: std of the rate ~0.01.
  assert abs(np.mean(slipped) - 0.3) < 0.03
  with pytest.raises(ValueError, match="needs an rng"):
    problem.steps(0.5)


def test_answer_slips_misstate_only_the_answer_line_at_the_given_rate():
  problem = builtin_task.parse_expression("7+5*3-4")
  exact = "<think> 7+5*3-4 = 7+15-4 = 22-4 = 18 </think>\nAnswer: 18"
  assert builtin_task.solution_text(problem) == exact
  rng = np.random.default_rng(0)
  texts = [
      builtin_task.solution_text(problem, 0.0, rng, answer_slip_prob=0.7)
      for _ in range(2_000)
  ]
  thinking = {t.split("\n")[0] for t in texts}
  assert thinking == {exact.split("\n")[0]}  # The thinking is never touched.
  answers = [int(t.rsplit("Answer: ", 1)[1]) for t in texts]
  assert {a - 18 for a in answers} <= set(builtin_task.SLIP_OFFSETS) | {0}
  # 2,000 draws: std of the rate ~0.01.
  assert abs(np.mean([a != 18 for a in answers]) - 0.7) < 0.035
  assert builtin_task.score_builtin(exact.split("\n")[1], "18") == 1.0
  with pytest.raises(ValueError, match="needs an rng"):
    builtin_task.solution_text(problem, answer_slip_prob=0.5)
