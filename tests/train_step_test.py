"""The jitted train step: learning signal,
zero-variance filtering, NaN guard."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scalerl_jax import optim
from scalerl_jax.models import model_config
from scalerl_jax.models import transformer
from scalerl_jax.rl import logprobs
from scalerl_jax.rl import losses
from scalerl_jax.rl import train_step as ts
from tests import helpers
from tests.buffer_test import _group as buffer_group

P, G, S = 2, 2, 12
# Jitted, as the train step runs it (eager, each operation compiles alone).
_policy_logprobs = jax.jit(logprobs.policy_logprobs, static_argnums=(0, 3))


def _spec(
    model,
    num_prompts=P,
    aggregation="prompt",
    zero_variance_filter=True,
    loss="cispo",
):
  config = helpers.tiny_config()
  config.rl.loss = loss
  config.rl.aggregation = aggregation
  config.optim.warmup_steps = 0
  return ts.StepSpec(
      model=model,
      optimizer=optim.make_optimizer(config.optim),
      loss=losses.LossParams.from_config(config.rl),
      adv_norm="batch",
      zero_variance_filter=zero_variance_filter,
      num_prompts=num_prompts,
      num_generations=G,
      temperature=1.0,
  )


def _setup(**spec_args):
  cfg = model_config.ModelConfig.from_config(helpers.tiny_config().model)
  model = transformer.Transformer(cfg)
  params = helpers.init_params(model)
  spec = _spec(model, **spec_args)
  step = jax.jit(functools.partial(ts.train_step, spec=spec))
  return model, params, ts.init_state(params, spec.optimizer), step


def _batch(model, params, rewards):
  rows = np.size(rewards)
  rng = np.random.RandomState(0)
  tokens = rng.randint(0, 128, (rows, S)).astype(np.int32)
  mask = np.zeros((rows, S), np.float32)
  mask[:, 4:10] = 1
  logp, _ = _policy_logprobs(model, params, jnp.asarray(tokens), 1.0)
  return {
      "tokens_BxS": tokens,
      "mask_BxS": mask,
      "gen_logp_BxS": np.asarray(logp) * mask,  # On-policy: rho = 1.
      "rewards_PxG": np.asarray(rewards, np.float32),
  }


def _same(a, b):
  return all(
      np.array_equal(x, y)
      for x, y in zip(
          jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
      )
  )


def test_step_updates_params_and_filters_zero_variance_groups():
  model, params, state, step = _setup()
  batch = _batch(model, params, [[1, 0], [1, 1]])  # Group 1 has zero variance.
  new_state, metrics = step(state, batch)
  assert int(new_state.step) == 1
  assert not _same(new_state.params, params)
  # Only group 0's 2 completions x 6 tokens remain in the loss.
  assert float(metrics["loss_tokens"]) == 12.0
  assert float(metrics["zero_variance_frac"]) == 0.5
  assert float(metrics["nonfinite"]) == 0.0
  np.testing.assert_allclose(float(metrics["ratio_mean"]), 1.0, atol=1e-5)


def test_entropy_covers_every_generated_token_dropped_groups_included():
  model, params, state, step = _setup()
  # Group 1 is dropped from the loss.
  batch = _batch(model, params, [[1, 0], [1, 1]])
  _, metrics = step(state, batch)
  _, entropy_BxS = _policy_logprobs(
      model, params, jnp.asarray(batch["tokens_BxS"]), 1.0
  )
  entropy_BxS, mask = np.asarray(entropy_BxS, np.float64), batch["mask_BxS"]
  # All 4 completions x 6 tokens.
  every = (entropy_BxS * mask).sum() / mask.sum()
  kept = (entropy_BxS[:2] * mask[:2]).sum() / mask[:2].sum()
  assert abs(every - kept) > 1e-4  # The two means differ on this batch ...
  # ... all is reported.
  np.testing.assert_allclose(float(metrics["entropy"]), every, rtol=1e-5)


def test_all_zero_variance_leaves_params_and_optimizer_state_bit_identical():
  model, params, state, step = _setup()
  # A step with signal first, so AdamW carries momentum that would move the
  # parameters on a zero gradient (with weight decay, as it did before).
  state, _ = step(state, _batch(model, params, [[1, 0], [0, 1]]))
  before = jax.device_get(state)
  new_state, metrics = step(state, _batch(model, params, [[0, 0], [1, 1]]))
  assert (
      float(metrics["loss_tokens"]) == 0.0 and float(metrics["l2_grads"]) == 0.0
  )
  assert (
      float(metrics["no_signal"]) == 1.0 and float(metrics["l2_updates"]) == 0.0
  )
  assert float(metrics["nonfinite"]) == 0.0
  assert int(new_state.step) == 2  # The policy version still advances.
  assert _same(new_state.params, before.params)
  assert _same(new_state.opt_state, before.opt_state)
  # A batch with signal is applied and reports no_signal = 0.
  newer, metrics = step(new_state, _batch(model, params, [[1, 0], [0, 1]]))
  assert float(metrics["no_signal"]) == 0.0 and not _same(
      newer.params, before.params
  )


def test_a_zero_gradient_without_the_filter_leaves_the_state_unchanged():
  # Without zero-variance filtering, a batch whose every group has equal
  # rewards keeps its loss tokens but has zero advantages: the gradient is
  # exactly 0, and AdamW's momentum and weight decay must not move the
  # parameters on it (they did: update L2 0.064, issue 39).
  model, params, state, step = _setup(zero_variance_filter=False)
  state, _ = step(state, _batch(model, params, [[1, 0], [0, 1]]))
  before = jax.device_get(state)
  new_state, metrics = step(state, _batch(model, params, [[0, 0], [1, 1]]))
  assert float(metrics["loss_tokens"]) == 24.0
  assert float(metrics["l2_grads"]) == 0.0
  assert float(metrics["no_signal"]) == 1.0
  assert float(metrics["l2_updates"]) == 0.0
  assert _same(new_state.params, before.params)
  assert _same(new_state.opt_state, before.opt_state)


def test_filtered_groups_count_in_no_denominator():
  # Zero-variance filtering drops a group from the loss entirely, the
  # aggregation's denominators included: the loss of groups {0: [1, 0],
  # 1: [1, 1]} equals the loss of group 0 alone as a batch of one prompt,
  # under every aggregation. Zeroing only the dropped group's advantages
  # would keep its prompt and tokens in the denominators and halve it.
  model, params, _, _ = _setup()
  for aggregation in losses.AGGREGATIONS.names():
    loss = {}
    for rewards in ([[1, 0], [1, 1]], [[1, 0]]):
      spec = _spec(model, len(rewards), aggregation)
      batch = _batch(model, params, rewards)
      loss_fn = jax.jit(functools.partial(ts.loss_and_grads, spec=spec))
      loss[len(rewards)] = loss_fn(params, batch)[0]
    assert abs(float(loss[1])) > 1e-6, aggregation
    np.testing.assert_allclose(loss[2], loss[1], rtol=1e-4, err_msg=aggregation)


def test_non_finite_gradient_leaves_state_unchanged():
  model, params, state, step = _setup()
  batch = _batch(model, params, [[1, 0], [0, 1]])
  batch["gen_logp_BxS"][0, 5] = np.nan  # Poisons the IS ratio of one token.
  new_state, metrics = step(state, batch)
  assert float(metrics["nonfinite"]) == 1.0
  assert int(new_state.step) == 1
  assert _same(new_state.params, params)
  assert _same(new_state.opt_state, state.opt_state)
  # And the next, finite step proceeds normally from the unchanged state.
  batch["gen_logp_BxS"][0, 5] = 0.0
  newer, metrics = step(new_state, batch)
  assert float(metrics["nonfinite"]) == 0.0 and not _same(newer.params, params)


def test_policy_logprobs_align_with_targets():
  model, params, _, _ = _setup()
  tokens = jnp.asarray(
      np.random.RandomState(1).randint(0, 128, (2, 7)), jnp.int32
  )
  logp, entropy = _policy_logprobs(model, params, tokens, 1.0)
  logits = jax.jit(model.apply)({"params": params}, tokens)
  want = jax.nn.log_softmax(logits[:, 2])[np.arange(2), tokens[:, 3]]
  np.testing.assert_allclose(logp[:, 3], want, atol=1e-6)
  assert float(logp[0, 0]) == 0.0 and float(entropy[0, 0]) == 0.0
  assert float(entropy[0, 3]) > 0
