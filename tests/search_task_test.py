"""Tests of the built-in search task: problems, splits, worked targets,
the length budget and the verifier."""

import collections
import json

import numpy as np
import pytest

from configs import search
from scalerl_jax import config as config_lib
from scalerl_jax import warm_start
from scalerl_jax.data import builtin_tokenizer
from scalerl_jax.data import search_task
from scalerl_jax.data import sources
from scalerl_jax.data import tokenizer as tokenizer_lib
from scalerl_jax.rewards import registry

SIZES = {1: 900, 2: 2700, 3: 32400}  # Problems per level.


def test_hand_worked_problems_and_targets():
  # 3*7+45 = 66 -> 6; the try of 8 is 8*7+45 = 101 -> 1.
  problem = search_task.Problem(level=2, digit=3, a=7, b=45)
  assert problem.expression == "?*7+45=6"
  assert problem.try_text(8) == "8*7+45=1"
  assert search_task.prompt_text(problem) == "Compute ?*7+45=6"
  assert search_task.solution_text(problem, [8, 3, 5]) == (
      "<think> 8*7+45=1 3*7+45=6 </think>\nAnswer: 3"
  )
  # 5+47 = 52 -> 2; tries 9 -> 56 -> 6, 0 -> 47 -> 7, then 5.
  level1 = search_task.Problem(level=1, digit=5, a=47)
  assert level1.expression == "?+47=2"
  assert search_task.solution_text(level1, [9, 0, 5]) == (
      "<think> 9+47=6 0+47=7 5+47=2 </think>\nAnswer: 5"
  )
  # 0*13+28 = 28 -> 8: the right first guess ends the trace at once.
  level3 = search_task.Problem(level=3, digit=0, a=13, b=28)
  assert search_task.solution_text(level3, [0, 1]) == (
      "<think> 0*13+28=8 </think>\nAnswer: 0"
  )
  with pytest.raises(ValueError, match="never reach"):
    search_task.solution_text(level3, [1, 2])


def test_levels_hold_every_problem_once_and_parse_back():
  for level, size in SIZES.items():
    problems = search_task.level_problems(level)
    assert len({p.expression for p in problems}) == size
    for p in problems[:: 1 if level < 3 else 7]:
      assert search_task.parse_expression(p.expression) == p
      # One digit solves it: the reward names a single right answer.
      solving = [d for d in search_task.DIGITS if p.value_at(d) == p.c]
      assert solving == [p.digit]


@pytest.mark.parametrize(
    "expression",
    [
        "?+5=7",  # a below 10 at level 1.
        "?+47=12",  # The units digit is one digit.
        "?*5+13=8",  # 5 has no inverse modulo 10: not a level-2 multiplier.
        "?*15+13=8",  # Nor 15 at level 3.
        "?*7+5=2",  # b below 10.
        "3*7+45=6",  # No hidden digit.
        "?*7+045=6",  # Not how the task writes 45.
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
  assert (len(train), len(val)) == (3000, 150)
  prompts = [{r["prompt"] for r in rs} for rs in (warm, train, val)]
  # Every warm problem: 440 + 1,331 + 16,216.
  assert len(prompts[0]) == len(warm) == 17987
  assert not prompts[0] & prompts[1] and not prompts[0] & prompts[2]
  assert not prompts[1] & prompts[2]
  # Validation: 50 of each level, the same for every seed.
  levels = collections.Counter(json.loads(r["metadata"])["level"] for r in val)
  assert levels == {1: 50, 2: 50, 3: 50}
  config.seed = 1
  assert sources.load_prompts(config, "val") == val
  assert sources.load_prompts(config, "train") != train


def test_levels_short_of_their_share_give_all_they_have():
  # Level 1 holds 69 val problems; 300 over levels (1, 3): 69 + 231.
  records = search_task.search_prompts((1, 3), 300, 0, "val")
  levels = collections.Counter(
      json.loads(r["metadata"])["level"] for r in records
  )
  assert levels == {1: 69, 3: 231}
  with pytest.raises(ValueError, match="hold only"):
    search_task.search_prompts((1, 2), 300, 0, "val")
  with pytest.raises(ValueError, match="levels are"):
    search_task.search_prompts((4,), 10, 0, "train")


def test_worked_targets_guess_uniformly_without_repeats():
  rng = np.random.default_rng(0)
  problem = search_task.Problem(level=1, digit=7, a=30)
  record = search_task.make_record(problem)
  first_right, lengths = 0, []
  for _ in range(2000):
    text = search_task.target_text(record, rng)
    thinking = text.split("<think> ")[1].split(" </think>")[0]
    guesses = [int(t.split("+")[0]) for t in thinking.split(" ")]
    assert thinking.split(" ") == [problem.try_text(g) for g in guesses]
    assert len(set(guesses)) == len(guesses)
    assert guesses[-1] == 7 and 7 not in guesses[:-1]
    assert text.endswith("Answer: 7")
    first_right += len(guesses) == 1
    lengths.append(len(guesses))
  # Uniform over 10 digits: right first 1/10 of the time, 5.5 tries on
  # average (binomial std of 2000 draws: 0.0067 and 0.064).
  assert abs(first_right / 2000 - 0.1) < 0.03
  assert abs(np.mean(lengths) - 5.5) < 0.3


def test_the_budget_admits_fewer_tries_at_harder_levels(tmp_path):
  path = str(tmp_path / "tok.model")
  builtin_tokenizer.write_model(path, 512)
  tok = tokenizer_lib.load_tokenizer(path)
  config = search.get_config()
  problems = {
      1: search_task.Problem(level=1, digit=9, a=47),
      2: search_task.Problem(level=2, digit=9, a=7, b=45),
      3: search_task.Problem(level=3, digit=9, a=17, b=45),
  }
  most_tries = {}
  for level, problem in problems.items():
    fits = [
        len(tok.encode(search_task.solution_text(problem, range(9 - n, 10))))
        + 1  # EOS.
        <= config.sampling.max_new_tokens
        for n in range(10)
    ]
    most_tries[level] = sum(fits)
    assert fits == sorted(fits, reverse=True)
    prompt = search_task.prompt_text(problem)
    assert len(tok.encode(prompt)) + 1 <= config.sampling.max_prompt_len
  # "<think> " + n tries ("8+47=5 ", "8*7+45=1 ", "8*17+45=1 ": 7, 9 and 10
  # tokens) + "</think>\nAnswer: 9" + EOS = 9 + 7n, 9 + 9n, 9 + 10n tokens
  # against 30: a uniform guesser solves level 1 3 times in 10, levels 2
  # and 3 2 times.
  assert most_tries == {1: 3, 2: 2, 3: 2}


def test_the_verifier_scores_only_the_answer_line():
  problem = search_task.Problem(level=2, digit=4, a=3, b=12)
  record = search_task.make_record(problem)
  assert (record["prompt"], record["answer"]) == ("Compute ?*3+12=4", "4")
  spec = registry.resolve_spec(record)
  right = search_task.solution_text(problem, [4])
  assert registry.verify(right, record, spec) == 1.0
  # A right try in the thinking does not count when the answer is wrong.
  wrong = right.replace("Answer: 4", "Answer: 5")
  assert registry.verify(wrong, record, spec) == 0.0
  # The try's value is not the answer.
  assert (
      registry.verify(right.replace("Answer: 4", "Answer: 24"), record, spec)
      == 0.0
  )
  # Cut off by the budget before </think>: no answer, no reward.
  assert registry.verify("<think> 1*3+12=5 4*3+12=4", record, spec) == 0.0


def test_the_search_base_is_cached_apart_from_the_arithmetic_base():
  config = search.get_config()
  arithmetic = search.get_config()
  with arithmetic.unlocked():
    arithmetic.data.source = "builtin"
  assert warm_start.fingerprint(config, 512) != warm_start.fingerprint(
      arithmetic, 512
  )
