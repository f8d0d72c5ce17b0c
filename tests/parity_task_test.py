"""Tests of the built-in parity task: problems, targets, splits, the budgets
of its pilot, the shared base and the verifier."""

import collections
import json

import numpy as np
import pytest

from configs import parity
from configs import parity_skip
from configs import search
from scalerl_jax import config as config_lib
from scalerl_jax import warm_start
from scalerl_jax.data import builtin_tokenizer
from scalerl_jax.data import parity_task
from scalerl_jax.data import search_task
from scalerl_jax.data import sources
from scalerl_jax.data import tokenizer as tokenizer_lib
from scalerl_jax.rewards import registry


def test_hand_worked_problems_and_targets():
  problem = parity_task.Problem((3, 7, 2, 8))
  # 3 and 7: two odd digits, parity 0.
  assert (problem.level, problem.answer) == (2, 0)
  assert parity_task.prompt_text(problem) == "Compute 3 7 2 8"
  assert parity_task.chain_text(problem) == (
      "<think> 3=1 7=0 2=0 8=0 </think>\nAnswer: 0"
  )
  assert parity_task.direct_text(problem) == "<think> </think>\nAnswer: 0"
  level4 = parity_task.parse_expression("9 9 9 0 0 1 2 2")
  assert (level4.level, level4.answer) == (4, 0)
  assert parity_task.chain_text(level4).startswith(
      "<think> 9=1 9=0 9=1 0=1 0=1 1=0 2=0 2=0 </think>"
  )
  assert parity_task.Problem((1, 4)).answer == 1


@pytest.mark.parametrize(
    "expression", ["3 7 2", "3 7  2 8", "37 2 8", "3 7 2 8 1 1 1 1 1 1", ""]
)
def test_parse_refuses_what_the_task_never_writes(expression):
  with pytest.raises(ValueError):
    parity_task.parse_expression(expression)


def test_chain_lengths_and_the_pilot_budgets(tmp_path):
  path = str(tmp_path / "tok.model")
  builtin_tokenizer.write_model(path, 512)
  tok = tokenizer_lib.load_tokenizer(path)
  config = parity.get_config()
  for level, n in parity_task.DIGITS_PER_LEVEL.items():
    problem = parity_task.Problem(tuple(range(n)))
    chain = len(tok.encode(parity_task.chain_text(problem))) + 1  # EOS.
    assert chain == parity_task.chain_tokens(n) == 9 + 4 * n
    assert len(tok.encode(parity_task.direct_text(problem))) + 1 == 9
    prompt = len(tok.encode(parity_task.prompt_text(problem))) + 1  # BOS.
    assert prompt <= config.sampling.max_prompt_len
    # The long budget fits every chain, the short one levels 1 and 2 only.
    assert chain <= parity.LONG
    assert (chain <= parity.SHORT) == (level <= 2)
  assert (parity.LONG, parity.SHORT) == (41, 25)


def test_splits_are_disjoint_deterministic_and_spread_over_levels():
  config = parity.get_config()
  config_lib.validate(config)
  train = sources.load_prompts(config, "train")
  val = sources.load_prompts(config, "val")
  warm = warm_start._WORKED[parity_task.SOURCE](
      config.data.builtin_difficulty, 2000, warm_start.base_seed(config), "x"
  )
  prompts = [{r["prompt"] for r in rs} for rs in (warm, train, val)]
  assert [len(p) for p in prompts] == [len(warm), 2000, 150]
  assert not prompts[0] & prompts[1] and not prompts[0] & prompts[2]
  assert not prompts[1] & prompts[2]
  for records, split in ((warm, "warm"), (train, "train"), (val, "val")):
    for r in records:
      expression = json.loads(r["metadata"])["expression"]
      assert search_task.split_of(expression) == split
  # Level 1 (100 problems in all) gives what its split holds; the others
  # share the rest evenly.
  levels = collections.Counter(json.loads(r["metadata"])["level"] for r in val)
  assert levels[1] < 10 and sum(levels.values()) == 150
  assert (
      max(levels[l] for l in (2, 3, 4)) - min(levels[l] for l in (2, 3, 4)) <= 1
  )
  # The warm start: every level-1 problem of its split, the other levels
  # making up WARM_PER_LEVEL per level.
  level1_warm = sum(
      search_task.split_of(f"{i // 10} {i % 10}") == "warm" for i in range(100)
  )
  warm_levels = collections.Counter(
      json.loads(r["metadata"])["level"] for r in warm
  )
  assert warm_levels[1] == level1_warm < 100
  assert len(warm) == 4 * parity_task.WARM_PER_LEVEL
  # Validation is the same for every seed; RL prompts are not.
  config.seed = 1
  assert sources.load_prompts(config, "val") == val
  assert sources.load_prompts(config, "train") != train
  with pytest.raises(ValueError, match="levels are"):
    parity_task.parity_prompts((5,), 10, 0, "train")


def test_warm_targets_take_the_chain_at_chain_prob():
  rng = np.random.default_rng(0)
  problem = parity_task.Problem((5, 0, 0, 3, 8, 1))
  record = parity_task.make_record(problem)
  texts = collections.Counter(
      parity_task.target_text(record, rng) for _ in range(4000)
  )
  chain = parity_task.chain_text(problem)
  right, wrong = (parity_task.direct_text(problem, a) for a in (1, 0))
  assert problem.answer == 1 and right == parity_task.direct_text(problem)
  assert set(texts) == {chain, right, wrong}
  # Binomial std of 4000 draws at 0.5: 0.0079. The direct answers guess:
  # right half of the time (std 0.011 of 2000).
  assert abs(texts[chain] / 4000 - parity_task.CHAIN_PROB) < 0.03
  assert abs(texts[right] / (texts[right] + texts[wrong]) - 0.5) < 0.04
  with pytest.raises(ValueError, match="needs a builtin_parity record"):
    parity_task.target_text(
        search_task.make_record(search_task.Problem((6, 1, 8, 4))), rng
    )


def test_budgets_share_one_base_and_differ_only_in_budget(monkeypatch):
  config = parity.get_config()
  points = []
  for point in parity.get_sweep():
    c = parity.get_config()
    c.update_from_flattened_dict(
        {k: v for k, v in point.items() if k != "name"}
    )
    config_lib.validate(c)
    points.append(c)
  long, short = points
  assert long.to_dict() == config.to_dict()
  assert short.sampling.max_new_tokens == parity.SHORT
  assert short.buffer.decode_steps_per_train_step == search.RUN_AHEAD * 25
  assert warm_start.fingerprint(long, 512) == warm_start.fingerprint(short, 512)
  # Without the fixed warm-start length, each budget would cut the targets
  # at its own length and so train its own base.
  for c in points:
    c.trainer.warm_start_max_new_tokens = 0
  assert warm_start.fingerprint(long, 512) != warm_start.fingerprint(short, 512)
  # Every seed shares seed 0's base.
  other_seed = parity.get_config()
  other_seed.seed = 2
  assert warm_start.base_seed(other_seed) == 0
  assert warm_start.fingerprint(other_seed, 512) == warm_start.fingerprint(
      config, 512
  )
  # A change to how the task writes its warm targets trains a new base.
  before = warm_start.fingerprint(config, 512)
  monkeypatch.setitem(parity_task.WARM_SETTINGS, "chain_prob", 0.25)
  assert warm_start.fingerprint(config, 512) != before
  # The RL pool's size leaves the base alone: the warm start draws from its
  # own split (a smaller pool, for No-Positive-Resampling, shares the base).
  pool = parity.get_config()
  pool.data.builtin_num_train = 320
  assert warm_start.fingerprint(pool, 512) == warm_start.fingerprint(
      config, 512
  )
  # The search task's base is apart from the parity task's.
  assert warm_start.fingerprint(config, 512) != warm_start.fingerprint(
      search.get_config(), 512
  )


def test_the_verifier_scores_only_the_answer_line():
  problem = parity_task.Problem((3, 4, 4, 4))
  record = parity_task.make_record(problem)
  assert (record["prompt"], record["answer"]) == ("Compute 3 4 4 4", "1")
  spec = registry.resolve_spec(record)
  assert registry.verify(parity_task.chain_text(problem), record, spec) == 1.0
  assert registry.verify(parity_task.direct_text(problem), record, spec) == 1.0
  wrong = parity_task.direct_text(problem).replace("Answer: 1", "Answer: 0")
  assert registry.verify(wrong, record, spec) == 0.0
  # A chain cut off by the budget has no Answer line: no reward.
  assert registry.verify("<think> 3=1 4=1 4=1", record, spec) == 0.0


def test_chains_skip_only_even_digits_and_stay_right():
  problem = parity_task.Problem((3, 4, 2, 7, 6, 8))
  assert parity_task.chain_text(problem, [1, 2, 4, 5]) == (
      "<think> 3=1 7=0 </think>\nAnswer: 0"
  )
  # Skipping nothing is the full chain; skipping every digit of an all-even
  # problem is the direct answer.
  assert parity_task.chain_text(problem, []) == parity_task.chain_text(problem)
  evens = parity_task.Problem((2, 4))
  assert parity_task.chain_text(evens, [0, 1]) == parity_task.direct_text(evens)
  for bad in ([0], [3], [6]):  # Odd digits, or past the end.
    with pytest.raises(ValueError, match="may skip only even digits"):
      parity_task.chain_text(problem, bad)
  # Drawn at 0.3 per even digit: every chain parses to the prompt's digits
  # in order, with only even ones left out and the right parity at each.
  rng = np.random.default_rng(1)
  record = parity_task.make_record(problem)
  skipped = 0
  for _ in range(400):
    text = parity_task.target_text(record, rng, 0.3)
    steps = text.split("<think> ")[1].split("</think>")[0].split()
    if not steps:
      continue  # A guessed direct answer.
    assert text.endswith("Answer: 0")
    digits = [int(s[0]) for s in steps]
    left_out = list(problem.digits)
    for d in digits:
      left_out.remove(d)
    assert all(d % 2 == 0 for d in left_out)
    skipped += len(left_out)
    parity = 0
    for step in steps:
      parity ^= int(step[0]) % 2
      assert step == f"{step[0]}={parity}"
  # ~200 chains x 4 even digits x 0.3 = 240 (std ~13).
  assert 180 < skipped < 300


def test_skip_prob_is_the_parity_tasks_and_trains_its_own_base():
  config = parity_skip.get_config()
  config_lib.validate(config)
  assert config.sampling.max_new_tokens == parity.SHORT
  assert config.trainer.warm_start_skip_prob == parity_skip.SKIP_PROB
  plain = parity.get_config()
  plain.update_from_flattened_dict(parity.budget(parity.SHORT))
  assert warm_start.fingerprint(config, 512) != warm_start.fingerprint(
      plain, 512
  )
  # At 0 the fingerprint is the one from before the field existed.
  plain.trainer.warm_start_skip_prob = 0.0
  assert warm_start.fingerprint(plain, 512) == warm_start.fingerprint(
      parity.get_config(), 512
  )
  search_config = search.get_config()
  search_config.trainer.warm_start_skip_prob = 0.1
  with pytest.raises(config_lib.ConfigError, match="warm_start_skip_prob"):
    config_lib.validate(search_config)
