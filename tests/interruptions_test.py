"""Thinking-budget interruptions: the phrase lands exactly
at the drawn budget."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scalerl_jax import sharding
from scalerl_jax.models.model_config import ModelConfig
from scalerl_jax.models.transformer import Transformer
from scalerl_jax.sampling import interruptions
from scalerl_jax.sampling.interruptions import InterruptionSettings
from scalerl_jax.sampling.sampler import Sampler
from scalerl_jax.sampling.settings import SamplingSettings
from tests import helpers

PHRASE = (7, 8, 9, 10)  # Stands for "Okay, time is up. ... </think>".
THINK_CLOSE = 10
MAX_NEW, ANSWER = 24, 5
LENS = np.array([2, 7, 16, 1, 11, 5, 9, 13])


@pytest.fixture(scope="module")
def setup():
  config = helpers.tiny_config()
  config.sampling.max_prompt_len = 16
  config.sampling.max_new_tokens = MAX_NEW
  it = config.sampling.interruption
  (
      it.enabled,
      it.thinking_budget_min,
      it.thinking_budget_max,
      it.answer_budget,
  ) = (True, 4, 9, ANSWER)
  cfg = ModelConfig.from_config(config.model)
  mesh = sharding.make_mesh(config.mesh)
  rules = sharding.logical_rules(config.mesh)
  params, _ = sharding.init_model_params(
      Transformer(cfg), jax.random.key(0), mesh, rules
  )
  settings = SamplingSettings.from_config(
      config.sampling,
      eos_ids=(),
      pad_id=0,
      think_close_id=THINK_CLOSE,
      phrase_ids=PHRASE,
  )
  prompts = np.random.RandomState(0).randint(
      11, cfg.vocab_size, (len(LENS), 16)
  )

  def make(**overrides):
    return Sampler(cfg, dataclasses.replace(settings, **overrides), mesh, rules)

  return dict(make=make, params=params, prompts=prompts, settings=settings)


def test_phrase_at_the_sampled_budget_with_mask_zero_then_answer_budget(setup):
  out = setup["make"]().generate(
      setup["params"], setup["prompts"], LENS, jax.random.key(4)
  )
  r = len(PHRASE)
  assert ((out.thinking_budget >= 4) & (out.thinking_budget <= 9)).all()
  assert len(set(out.thinking_budget.tolist())) > 1
  for i, n in enumerate(LENS):
    b = int(out.thinking_budget[i])
    completion, mask = (
        out.tokens[i, n : out.seq_len[i]],
        out.mask[i, n : out.seq_len[i]],
    )
    if THINK_CLOSE in completion[:b]:  # The policy closed its thinking in time.
      assert not out.interrupted[i]
      continue
    assert out.interrupted[i]
    np.testing.assert_array_equal(completion[b : b + r], PHRASE)
    assert mask[:b].all() and not mask[b : b + r].any() and mask[b + r :].all()
    assert (out.version[i, n + b : n + b + r] == -1).all()
    assert (out.gen_logp[i, n + b : n + b + r] == 0).all()
    # No EOS configured, so the answer budget is used up exactly.
    assert len(completion) == b + r + ANSWER and out.truncated[i]
  assert out.interrupted.sum() >= 6


def test_closing_thinking_early_prevents_the_interruption(setup):
  greedy = setup["make"](temperature=0.0)
  first = greedy.generate(
      setup["params"], setup["prompts"], LENS, jax.random.key(0)
  )
  # Make the token greedy decoding emits second for prompt 0 the think-close
  # marker: that sequence now closes thinking before any budget (>= 4).
  marker = int(first.tokens[0, LENS[0] + 1])
  early = dataclasses.replace(
      setup["settings"].interruption, think_close_id=marker
  )
  out = setup["make"](temperature=0.0, interruption=early).generate(
      setup["params"], setup["prompts"], LENS, jax.random.key(0)
  )
  assert first.interrupted[0] and not out.interrupted[0]
  assert (
      out.seq_len[0] == LENS[0] + MAX_NEW
      and out.mask[0, LENS[0] : LENS[0] + MAX_NEW].all()
  )
  np.testing.assert_array_equal(
      out.tokens[0, : LENS[0] + 2], first.tokens[0, : LENS[0] + 2]
  )


def test_apply_step_by_step():
  # Phrase (7, 8, 9), marker 9, answer budget 2, max_new_tokens 10.
  # Row 0: budget 2, thinks on -> phrase at completion indices 2, 3, 4; the
  #   limit becomes min(2 + 3 + 2, 10) = 7.
  # Row 1: budget 2, but samples the marker (9) at index 0 -> never interrupted.
  # Row 2: budget 0 would trigger at once, but the row is not live.
  settings = InterruptionSettings(True, 1, 1, 2, (7, 8, 9), 9)
  state = interruptions.InterruptionState(
      thinking_budget=jnp.array([2, 2, 0]),
      phrase_pos=jnp.array([-1, -1, -1]),
      think_closed=jnp.zeros(3, bool),
      interrupted=jnp.zeros(3, bool),
  )
  limit = jnp.array([10, 10, 10])
  live = jnp.array([True, True, False])
  sampled = [
      [50, 9, 50],
      [51, 51, 51],
      [52, 52, 52],
      [53, 53, 53],
      [54, 54, 54],
      [55, 55, 55],
  ]
  expected_tokens = [
      [50, 9, 50],
      [51, 51, 51],
      [7, 52, 52],
      [8, 53, 53],
      [9, 54, 54],
      [55, 55, 55],
  ]
  expected_forced = [
      [0, 0, 0],
      [0, 0, 0],
      [1, 0, 0],
      [1, 0, 0],
      [1, 0, 0],
      [0, 0, 0],
  ]
  for step, tokens in enumerate(sampled):
    completion = jnp.array([step, step, 0])
    out, forced, state, limit = interruptions.apply(
        settings,
        state,
        jnp.array(tokens),
        completion,
        limit,
        live,
        max_new_tokens=10,
    )
    np.testing.assert_array_equal(out, expected_tokens[step])
    np.testing.assert_array_equal(forced, expected_forced[step])
  np.testing.assert_array_equal(limit, [7, 10, 10])
  np.testing.assert_array_equal(state.interrupted, [True, False, False])
  np.testing.assert_array_equal(state.think_closed, [False, True, False])
  np.testing.assert_array_equal(state.phrase_pos, [-1, -1, -1])


def test_budgets_are_uniform_over_the_closed_range():
  settings = InterruptionSettings(True, 4, 9, 5, PHRASE, THINK_CLOSE)
  keys = jax.random.split(jax.random.key(0), 6000)
  budgets = np.asarray(interruptions.draw(settings, keys).thinking_budget)
  counts = np.bincount(budgets, minlength=12)
  assert counts[:4].sum() == 0 and counts[10:].sum() == 0
  assert (np.abs(counts[4:10] - 1000) < 150).all()  # ~4.5 standard deviations.


def test_bad_settings_are_clear_errors(setup):
  it = setup["settings"].interruption
  with pytest.raises(ValueError, match="no phrase token ids"):
    setup["make"](interruption=dataclasses.replace(it, phrase_ids=()))
  with pytest.raises(ValueError, match="think-close"):
    setup["make"](interruption=dataclasses.replace(it, think_close_id=None))
  with pytest.raises(ValueError, match="exceeds sampling.max_new_tokens 24"):
    setup["make"](interruption=dataclasses.replace(it, thinking_budget_max=21))
  with pytest.raises(ValueError, match="min <= max"):
    setup["make"](interruption=dataclasses.replace(it, thinking_budget_min=10))
  with pytest.raises(ValueError, match="outside the vocabulary"):
    setup["make"](interruption=dataclasses.replace(it, phrase_ids=(7, 128)))
