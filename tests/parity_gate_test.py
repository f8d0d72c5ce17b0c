"""Tests of the parity base's gate, the chain-first warm start, the per-base
validation draw and the denser early validation (issue 58)."""

import json

import numpy as np
import pytest

from configs import parity
from configs.plans import parity_v1
from scalerl_jax import config as config_lib
from scalerl_jax import evaluation
from scalerl_jax import warm_start
from scalerl_jax.data import builtin_tokenizer
from scalerl_jax.data import parity_gate
from scalerl_jax.data import parity_task
from scalerl_jax.data import sources
from scalerl_jax.data import tokenizer as tokenizer_lib


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
  path = str(tmp_path_factory.mktemp("tok") / "tok.model")
  builtin_tokenizer.write_model(path, 512)
  return tokenizer_lib.load_tokenizer(path)


class _Oracle:
  """A 'model' whose logits put 20 on the next token of every row (0
  elsewhere), except at `wrong_at` (row -> position), where token 0 gets
  40."""

  def __init__(self, vocab, wrong_at=None, direct_at=None, end_think=None):
    self.vocab, self.wrong_at = vocab, wrong_at or {}
    self.direct_at, self.end_think = direct_at or {}, end_think

  def apply(self, variables, tokens_XxS):
    del variables
    tokens = np.asarray(tokens_XxS)
    x, s = tokens.shape
    logits = np.zeros((x, s, self.vocab), np.float32)
    nxt = np.concatenate([tokens[:, 1:], tokens[:, -1:]], axis=1)
    logits[np.arange(x)[:, None], np.arange(s)[None], nxt] = 20.0
    for row, pos in self.wrong_at.items():
      logits[row, pos, 0] = 40.0
    for row, pos in self.direct_at.items():
      logits[row, pos, self.end_think] = 20.0
    return logits


def test_chain_examples_put_the_decision_at_the_first_digit(tok):
  problems = [parity_task.Problem((3, 7, 2, 8))]
  tokens, decision = parity_gate.chain_examples(problems, tok)
  # BOS + "Compute 3 7 2 8" then `<think>`, ` `: the first digit follows.
  prompt = tok.encode("Compute 3 7 2 8")
  assert decision[0] == 1 + len(prompt) + 2
  assert tok.decode([int(tokens[0, decision[0]])]).strip() == "3"


def test_measure_counts_a_chain_exact_only_when_every_token_is_the_argmax(
    tok,
):
  model = _Oracle(tok.vocab_size)
  right = parity_gate.measure(model, None, tok, levels=(2,), per_level=10)
  assert right["chain_exact/2"] == 1.0
  # A logit of 20 on the chain's first digit over 511 zeros: P(`</think>`)
  # = 1 / (e^20 + 511).
  assert right["p_chain/2"] == pytest.approx(1 - 1 / (np.exp(20) + 511))
  problems = parity_task.parity_problems((2,), 10, 0, "val")
  _, decisions = parity_gate.chain_examples(problems, tok)
  # One wrong argmax after the decision spoils that row's chain; one before
  # it (inside the prompt) does not count.
  wrong = _Oracle(
      tok.vocab_size,
      {0: int(decisions[0]) + 3, 1: int(decisions[1]) - 4},
  )
  measured = parity_gate.measure(wrong, None, tok, levels=(2,), per_level=10)
  assert measured["chain_exact/2"] == pytest.approx(0.9)
  # `</think>` as likely as the first digit on 4 of 10 rows: P(chain) there
  # is 1 - e^20 / (2 e^20 + 510), else 1 - 1 / (e^20 + 511).
  torn = _Oracle(
      tok.vocab_size,
      direct_at={i: int(decisions[i]) - 1 for i in range(4)},
      end_think=tok.end_think_id,
  )
  measured = parity_gate.measure(torn, None, tok, levels=(2,), per_level=10)
  half = 1 - 1 / (2 + 510 * np.exp(-20))
  assert measured["p_chain/2"] == pytest.approx((4 * half + 6) / 10, abs=1e-6)
  assert measured["chain_exact/2"] == 1.0


def test_check_names_each_failing_level_and_ignores_ungated_ones():
  gate = parity_v1.BASE_GATE
  good = {
      "chain_exact/1": 0.0,  # Level 1 is not gated.
      "p_chain/1": 0.04,
      **{f"chain_exact/{l}": 0.6 for l in (2, 3, 4)},
      **{f"p_chain/{l}": 0.5 for l in (2, 3, 4)},
  }
  assert parity_gate.check(good, gate) == []
  bad = {**good, "chain_exact/4": 0.0, "p_chain/3": 0.9}
  failures = parity_gate.check(bad, gate)
  assert len(failures) == 2
  assert "level 4" in failures[0] and "below 0.5" in failures[0]
  assert "level 3" in failures[1] and "outside [0.3, 0.7]" in failures[1]


def test_chain_first_rows_are_all_chains_then_the_mix(tok):
  config = parity.get_config()
  records = parity_task.parity_prompts((2,), 200, 0, "warm")
  rng = np.random.default_rng(0)
  tokens, mask = warm_start.supervised_examples(
      records, tok, 60, rng=rng, chain_first=100
  )
  del config, mask
  close = tok.end_think_id
  think = tok.encode("<think>")[-1]
  # A direct answer closes the thinking two tokens after it opens.
  direct = [
      int(np.argmax(row == think)) + 2 == int(np.argmax(row == close))
      for row in tokens
  ]
  assert not any(direct[:100])
  # The rest mix at CHAIN_PROB (binomial std of 100 draws at 0.5: 0.05).
  assert abs(np.mean(direct[100:]) - (1 - parity_task.CHAIN_PROB)) < 0.15
  # Without chain-first rows the draws are those of before the field.
  again = warm_start.supervised_examples(
      records, tok, 60, rng=np.random.default_rng(0)
  )[0]
  before = warm_start.supervised_examples(
      records, tok, 60, rng=np.random.default_rng(0), chain_first=0
  )[0]
  np.testing.assert_array_equal(again, before)


def test_chain_first_changes_the_fingerprint_only_when_set():
  config = parity.get_config()
  plain = warm_start.fingerprint(config, 512)
  config.trainer.warm_start_chain_first_steps = 0
  assert warm_start.fingerprint(config, 512) == plain
  config.trainer.warm_start_chain_first_steps = 750
  assert warm_start.fingerprint(config, 512) != plain
  config.trainer.warm_start_steps = 700
  with pytest.raises(config_lib.ConfigError, match="exceeds"):
    config_lib.validate(config)


def test_each_base_draws_its_own_validation_set():
  a = parity_v1.get_config("base=101")
  b = parity_v1.get_config("base=102")
  va, vb = (sources.load_prompts(c, "val") for c in (a, b))
  assert len(va) == len(vb) == 150
  assert {r["prompt"] for r in va} != {r["prompt"] for r in vb}
  # RL seeds of one base share it.
  a.seed = 1
  assert sources.load_prompts(a, "val") == va
  # -1 keeps the one fixed set of every earlier run.
  c = parity.get_config()
  assert c.data.builtin_val_seed == -1
  assert sources.val_seed(c) == sources.VAL_SEED


def test_early_validation_steps():
  t = parity_v1.get_config("base=101").trainer
  steps = [
      s for s in range(1, t.num_steps + 1) if evaluation.is_eval_step(t, s)
  ]
  assert steps[:10] == [5, 10, 15, 20, 25, 30, 35, 40, 45, 50]
  assert steps[10:] == list(range(60, 151, 10))
  t.eval_early_until = 0
  steps = [s for s in range(1, 35) if evaluation.is_eval_step(t, s)]
  assert steps == [10, 20, 30]


def test_plan_bases_are_registered_only():
  with pytest.raises(ValueError, match="not registered"):
    parity_v1.get_config("base=7")
  with pytest.raises(ValueError, match="takes 'base="):
    parity_v1.get_config(None)
  assert json.dumps(parity_v1.NEEDED)
