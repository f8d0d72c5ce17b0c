"""Tests of the built-in search task: problems, splits, worked targets,
the length budget and the verifier."""

import collections
import json

import numpy as np
import pytest

from configs import search
from configs import search_one_try
from scalerl_jax import config as config_lib
from scalerl_jax import warm_start
from scalerl_jax.data import builtin_tokenizer
from scalerl_jax.data import search_task
from scalerl_jax.data import sources
from scalerl_jax.data import tokenizer as tokenizer_lib
from scalerl_jax.rewards import registry

# Problems per level: C(5, k - 1) even digits x 5 odd ones x k! orders.
SIZES = {1: 10 * 5 * 6, 2: 10 * 5 * 24, 3: 1 * 5 * 720}


def test_hand_worked_problems_and_targets():
  problem = search_task.Problem((6, 1, 8, 4))
  assert (problem.level, problem.answer) == (2, 1)
  assert search_task.prompt_text(problem) == "Compute 6 1 8 4"
  assert search_task.try_text(8) == "8=0" and search_task.try_text(1) == "1=1"
  assert search_task.solution_text(problem, [8, 1, 6, 4]) == (
      "<think> 8=0 1=1 </think>\nAnswer: 1"
  )
  # The odd digit first ends the trace at once.
  assert search_task.solution_text(problem, [1, 8]) == (
      "<think> 1=1 </think>\nAnswer: 1"
  )
  with pytest.raises(ValueError, match="never reach"):
    search_task.solution_text(problem, [6, 8, 4])
  level3 = search_task.Problem((0, 2, 8, 9, 6, 4))
  assert (level3.level, level3.answer) == (3, 9)
  assert search_task.parse_expression("0 2 8 9 6 4") == level3


def test_levels_hold_every_problem_once_and_parse_back():
  for level, size in SIZES.items():
    problems = search_task.level_problems(level)
    assert len({p.expression for p in problems}) == size
    for p in problems:
      assert search_task.parse_expression(p.expression) == p
      assert len(p.digits) == search_task.DIGITS_PER_LEVEL[level]
      # One odd digit: the reward names a single right answer.
      assert [d for d in p.digits if d % 2] == [p.answer]


@pytest.mark.parametrize(
    "expression",
    [
        "6 1 8 3",  # Two odd digits.
        "6 2 8 4",  # None.
        "6 1 6 4",  # A digit twice.
        "6 1 8 4 2",  # 5 digits is no level.
        "6 1  8 4",  # Not how the task writes it.
        "61 8 4",
    ],
)
def test_parse_refuses_what_the_task_never_writes(expression):
  with pytest.raises(ValueError):
    search_task.parse_expression(expression)


def test_warm_train_and_val_splits_are_disjoint_for_every_seed():
  levels = search_task.LEVELS
  sets = {
      (split, seed): {
          r["prompt"]
          for r in search_task.search_prompts(levels, None, seed, split)
      }
      for split in search_task.SPLITS
      for seed in (0, 1)
  }
  for seed in (0, 1):
    warm, train, val = (sets[s, seed] for s in search_task.SPLITS)
    assert not warm & train and not warm & val and not train & val
    assert len(warm) + len(train) + len(val) == sum(SIZES.values())
  # Each split is its hash's, whatever the seed.
  for split in search_task.SPLITS:
    assert sets[split, 0] == sets[split, 1]


def test_the_config_keeps_warm_start_apart_from_rl_and_validation():
  config = search.get_config()
  config_lib.validate(config)
  train = sources.load_prompts(config, "train")
  val = sources.load_prompts(config, "val")
  warm = warm_start._WORKED[search_task.SOURCE](
      config.data.builtin_difficulty,
      config.data.builtin_num_train,
      warm_start.base_seed(config),
      "train",
  )
  assert (len(train), len(val)) == (2000, 150)
  prompts = [{r["prompt"] for r in rs} for rs in (warm, train, val)]
  # Every warm problem: 148 + 604 + 1,829.
  assert len(prompts[0]) == len(warm) == 2581
  assert not prompts[0] & prompts[1] and not prompts[0] & prompts[2]
  assert not prompts[1] & prompts[2]
  # Validation: all 20 of level 1, then 65 of each other level, the same
  # for every seed.
  levels = collections.Counter(json.loads(r["metadata"])["level"] for r in val)
  assert levels == {1: 20, 2: 65, 3: 65}
  config.seed = 1
  assert sources.load_prompts(config, "val") == val
  assert sources.load_prompts(config, "train") != train


def test_levels_short_of_their_share_give_all_they_have():
  records = search_task.search_prompts((1, 3), 100, 0, "val")
  levels = collections.Counter(
      json.loads(r["metadata"])["level"] for r in records
  )
  assert levels == {1: 20, 3: 80}
  with pytest.raises(ValueError, match="hold only"):
    search_task.search_prompts((1, 2), 101, 0, "val")
  with pytest.raises(ValueError, match="levels are"):
    search_task.search_prompts((4,), 10, 0, "train")


def test_worked_targets_pick_uniformly_without_repeats():
  rng = np.random.default_rng(0)
  problem = search_task.Problem((0, 2, 8, 7, 6, 4))
  record = search_task.make_record(problem)
  first_right, lengths = 0, []
  for _ in range(3000):
    text = search_task.target_text(record, rng)
    thinking = text.split("<think> ")[1].split(" </think>")[0]
    guesses = [int(t.split("=")[0]) for t in thinking.split(" ")]
    assert thinking.split(" ") == [search_task.try_text(g) for g in guesses]
    assert len(set(guesses)) == len(guesses) and set(guesses) <= {
        0,
        2,
        4,
        6,
        7,
        8,
    }
    assert guesses[-1] == 7 and text.endswith("Answer: 7")
    first_right += len(guesses) == 1
    lengths.append(len(guesses))
  # Uniform over 6 digits: odd first 1/6 of the time, 3.5 tries on average
  # (binomial std of 3000 draws: 0.0068 and 0.031).
  assert abs(first_right / 3000 - 1 / 6) < 0.03
  assert abs(np.mean(lengths) - 3.5) < 0.15


def _tries_that_fit(tmp_path, config):
  """For n = 0..5 tries at a 6-digit problem, whether the worked answer and
  its EOS fit `config`'s generation budget; and the tokenizer, the problem."""
  path = str(tmp_path / "tok.model")
  builtin_tokenizer.write_model(path, 512)
  tok = tokenizer_lib.load_tokenizer(path)
  problem = search_task.Problem((0, 2, 8, 6, 4, 9))
  fits = [
      len(
          tok.encode(
              search_task.solution_text(problem, problem.digits[5 - n :])
          )
      )
      + 1  # EOS.
      <= config.sampling.max_new_tokens
      for n in range(6)
  ]
  return fits, tok, problem


def test_the_budget_admits_two_tries(tmp_path):
  config = search.get_config()
  fits, tok, problem = _tries_that_fit(tmp_path, config)
  # "<think> " + n tries ("8=0 ": 4 tokens) + "</think>\nAnswer: 9" + EOS =
  # 9 + 4n tokens: 17 for two tries, 21 for three, against 18.
  assert fits == [True, True, False, False, False, False]
  prompt = search_task.prompt_text(problem)
  assert len(tok.encode(prompt)) + 1 <= config.sampling.max_prompt_len


def test_the_one_try_budget_admits_one_try(tmp_path):
  config = search_one_try.get_config()
  fits, _, _ = _tries_that_fit(tmp_path, config)
  # 9 + 4n tokens: 13 for one try, 17 for two, against 13.
  assert fits == [True, False, False, False, False, False]
  # Only the budget and the run-ahead that follows it differ from search.py.
  base = search.get_config().to_dict()
  one_try = config.to_dict()
  assert one_try["sampling"].pop("max_new_tokens") == 13
  assert base["sampling"].pop("max_new_tokens") == 18
  assert one_try["buffer"].pop("decode_steps_per_train_step") == 4 * 13
  assert base["buffer"].pop("decode_steps_per_train_step") == 4 * 18
  assert one_try == base
  assert search_one_try.get_sweep() == search.get_sweep()


def test_the_verifier_scores_only_the_answer_line():
  problem = search_task.Problem((4, 3, 2, 0))
  record = search_task.make_record(problem)
  assert (record["prompt"], record["answer"]) == ("Compute 4 3 2 0", "3")
  spec = registry.resolve_spec(record)
  right = search_task.solution_text(problem, [2, 3])
  assert registry.verify(right, record, spec) == 1.0
  # A right try in the thinking does not count when the answer is wrong.
  wrong = right.replace("Answer: 3", "Answer: 2")
  assert registry.verify(wrong, record, spec) == 0.0
  # Cut off by the budget before </think>: no answer, no reward.
  assert registry.verify("<think> 2=0 4=0 0=0", record, spec) == 0.0


def test_the_search_base_is_cached_apart_from_the_arithmetic_base():
  config = search.get_config()
  arithmetic = search.get_config()
  with arithmetic.unlocked():
    arithmetic.data.source = "builtin"
  assert warm_start.fingerprint(config, 512) != warm_start.fingerprint(
      arithmetic, 512
  )
