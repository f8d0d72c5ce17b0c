"""Tests of the built-in search task: problems, splits, worked targets,
the length budget and the verifier."""

import collections
import itertools
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


def test_hand_worked_problems_and_targets():
  problem = search_task.Problem(values=(62, 17, 93, 40), digit=3)
  assert problem.level == 1
  assert problem.expression == "0=62 1=17 2=93 3=40 ?=40"
  assert problem.try_text(2) == "2=93"
  assert search_task.prompt_text(problem) == "Compute 0=62 1=17 2=93 3=40 ?=40"
  assert search_task.solution_text(problem, [2, 3, 0, 1]) == (
      "<think> 2=93 3=40 </think>\nAnswer: 3"
  )
  # The right first guess ends the trace at once.
  assert search_task.solution_text(problem, [3, 2]) == (
      "<think> 3=40 </think>\nAnswer: 3"
  )
  with pytest.raises(ValueError, match="never reach"):
    search_task.solution_text(problem, [0, 1, 2])
  level3 = search_task.Problem(tuple(range(10, 100, 9)), digit=0)
  assert (level3.level, level3.target) == (3, 10)
  assert search_task.parse_expression(level3.expression) == level3


def test_random_problems_parse_back_with_one_answer():
  rng = np.random.default_rng(0)
  for level, keys in search_task.KEYS.items():
    for _ in range(200):
      p = search_task.random_problem(level, rng)
      assert len(p.values) == keys and p.level == level
      assert search_task.parse_expression(p.expression) == p
      # Distinct values: one key holds the value asked for.
      assert [k for k, v in enumerate(p.values) if v == p.target] == [p.digit]


@pytest.mark.parametrize(
    "expression",
    [
        "0=62 1=17 2=93 ?=40",  # 40 is no key's value.
        "0=62 1=17 2=93 3=40 4=55 ?=40",  # 5 keys is no level.
        "0=62 1=17 2=62 3=40 ?=62",  # A value held twice.
        "1=62 0=17 2=93 3=40 ?=40",  # Keys out of order.
        "0=62 1=17 2=93 3=40 ?=4",  # Not a two-digit value.
        "0=62 1=17 2=93 3=40",  # Nothing asked.
    ],
)
def test_parse_refuses_what_the_task_never_writes(expression):
  with pytest.raises(ValueError):
    search_task.parse_expression(expression)


def test_warm_train_and_val_splits_are_disjoint_and_seeded():
  levels = search_task.LEVELS
  prompts = {
      (split, seed): [
          r["prompt"]
          for r in search_task.search_prompts(levels, 600, seed, split)
      ]
      for split in search_task.SPLITS
      for seed in (0, 1)
  }
  for (split, seed), got in prompts.items():
    assert len(set(got)) == 600
    for p in got:
      assert search_task.split_of(p.removeprefix("Compute ")) == split
  for (s1, _), (s2, _) in itertools.combinations(prompts, 2):
    if s1 != s2:
      assert not set(prompts[s1, 0]) & set(prompts[s2, 1])
  assert prompts["train", 0] != prompts["train", 1]
  assert prompts["train", 0] == [
      r["prompt"] for r in search_task.search_prompts(levels, 600, 0, "train")
  ]


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
  assert len(prompts[0]) == len(warm) == search_task.WARM_PROBLEMS
  assert not prompts[0] & prompts[1] and not prompts[0] & prompts[2]
  assert not prompts[1] & prompts[2]
  # Validation: 50 of each level, the same for every seed.
  levels = collections.Counter(json.loads(r["metadata"])["level"] for r in val)
  assert levels == {1: 50, 2: 50, 3: 50}
  config.seed = 1
  assert sources.load_prompts(config, "val") == val
  assert sources.load_prompts(config, "train") != train


def test_levels_share_a_split_evenly():
  records = search_task.search_prompts((1, 3), 301, 0, "val")
  levels = collections.Counter(
      json.loads(r["metadata"])["level"] for r in records
  )
  assert levels == {1: 151, 3: 150}
  with pytest.raises(ValueError, match="levels are"):
    search_task.search_prompts((4,), 10, 0, "train")


def test_worked_targets_guess_uniformly_without_repeats():
  rng = np.random.default_rng(0)
  problem = search_task.Problem(tuple(range(10, 100, 9)), digit=7)
  record = search_task.make_record(problem)
  first_right, lengths = 0, []
  for _ in range(2000):
    text = search_task.target_text(record, rng)
    thinking = text.split("<think> ")[1].split(" </think>")[0]
    guesses = [int(t.split("=")[0]) for t in thinking.split(" ")]
    assert thinking.split(" ") == [problem.try_text(g) for g in guesses]
    assert len(set(guesses)) == len(guesses)
    assert guesses[-1] == 7 and 7 not in guesses[:-1]
    assert text.endswith("Answer: 7")
    first_right += len(guesses) == 1
    lengths.append(len(guesses))
  # Uniform over 10 keys: right first 1/10 of the time, 5.5 tries on
  # average (binomial std of 2000 draws: 0.0067 and 0.064).
  assert abs(first_right / 2000 - 0.1) < 0.03
  assert abs(np.mean(lengths) - 5.5) < 0.3


def test_the_budget_admits_two_tries(tmp_path):
  path = str(tmp_path / "tok.model")
  builtin_tokenizer.write_model(path, 512)
  tok = tokenizer_lib.load_tokenizer(path)
  config = search.get_config()
  problem = search_task.Problem(tuple(range(10, 100, 9)), digit=9)
  fits = [
      len(tok.encode(search_task.solution_text(problem, range(9 - n, 10))))
      + 1  # EOS.
      <= config.sampling.max_new_tokens
      for n in range(10)
  ]
  # "<think> " + n tries ("7=73 ": 5 tokens) + "</think>\nAnswer: 9" + EOS
  # = 9 + 5n tokens: 19 for two tries, 24 for three.
  assert fits == [True, True] + [False] * 8
  # The longest prompt, 10 keys, fits with its BOS.
  prompt = search_task.prompt_text(problem)
  assert len(tok.encode(prompt)) + 1 <= config.sampling.max_prompt_len


def test_the_verifier_scores_only_the_answer_line():
  problem = search_task.Problem((62, 17, 93, 40, 55, 18, 99), digit=4)
  record = search_task.make_record(problem)
  assert record["answer"] == "4"
  spec = registry.resolve_spec(record)
  right = search_task.solution_text(problem, [4])
  assert registry.verify(right, record, spec) == 1.0
  # A right try in the thinking does not count when the answer is wrong.
  wrong = right.replace("Answer: 4", "Answer: 5")
  assert registry.verify(wrong, record, spec) == 0.0
  # The value instead of its key is wrong.
  assert (
      registry.verify(right.replace("Answer: 4", "Answer: 55"), record, spec)
      == 0.0
  )
  # Cut off by the budget before </think>: no answer, no reward.
  assert registry.verify("<think> 1=17 4=55", record, spec) == 0.0


def test_the_search_base_is_cached_apart_from_the_arithmetic_base():
  config = search.get_config()
  arithmetic = search.get_config()
  with arithmetic.unlocked():
    arithmetic.data.source = "builtin"
  assert warm_start.fingerprint(config, 512) != warm_start.fingerprint(
      arithmetic, 512
  )
