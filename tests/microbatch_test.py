"""Gradient accumulation and chunked log-probs in the train
step (rl/train_step.py).

Both must leave the numbers alone: M microbatches give the whole batch's loss,
metrics and gradient, and log-probs recomputed C positions at a time equal
those of one pass over the whole sequence, values and gradients.

Every loss and aggregation is checked on a bigram policy, all in one
compilation: the step's code is the same for any network, and compiling it 30
times around the transformer would take minutes on 2 cores. The transformer
then goes through the step with microbatches, chunks and TIS at once.
"""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scalerl_jax import config as config_lib
from scalerl_jax import optim
from scalerl_jax.models import model_config
from scalerl_jax.models import transformer
from scalerl_jax.rl import logprobs
from scalerl_jax.rl import losses
from scalerl_jax.rl import train_step as ts
from tests import helpers

# 3 prompts x 4 completions; with M = 4 microbatches of rows {j, j+4, j+8}
# every prompt's completions fall into 4 different microbatches.
P, G, S = 3, 4, 12
TOL = 1e-6  # Relative to the largest entry of an array, where that is > 1.
# The trainer's log-probs of a row may differ by an ulp between batch shapes
# (~5e-7 at log-probs near -4); exp turns that into a relative error of the
# IS ratios' statistics, seen up to 1.02e-6.
RATIO_TOL = 4e-6


def _model(**overrides):
  config = helpers.tiny_config(
      vocab_size=64,
      embed_dim=32,
      num_layers=1,
      num_heads=2,
      num_kv_heads=1,
      head_dim=16,
      mlp_dim=64,
      **overrides
  )
  model = transformer.Transformer(
      model_config.ModelConfig.from_config(config.model)
  )
  params = helpers.init_params(model)
  return config, model, params


class _Bigram(nn.Module):
  """A policy whose logits [B, T, V] are a learned
  function of the last token."""

  @nn.compact
  def __call__(self, tokens_BxT):
    return nn.Embed(64, 64, embedding_init=nn.initializers.normal(0.3))(
        tokens_BxT
    )


def _batch():
  """Off-policy rows of uneven lengths (one empty); prompt 2's
  rewards are all equal."""
  rng = np.random.RandomState(0)
  tokens = rng.randint(0, 64, (P * G, S)).astype(np.int32)
  mask = np.zeros((P * G, S), np.float32)
  for row, length in enumerate([7, 3, 0, 5, 1, 7, 2, 6, 4, 4, 7, 3]):
    mask[row, 4 : 4 + length] = 1
  # Log-probs near the trainer's (about -4.2 on 64 tokens), so ratios spread
  # around 1, and two far from it, so that every loss clips or caps a token.
  gen_logp = -4.2 + 0.3 * rng.randn(P * G, S)
  gen_logp[0, 5], gen_logp[1, 4] = -9.0, -1.0
  gen_logp = gen_logp.astype(np.float32) * mask
  rewards = np.array([[1, 0, 0, 1], [0, 0, 1, 0], [1, 1, 1, 1]], np.float32)
  return {
      "tokens_BxS": tokens,
      "mask_BxS": mask,
      "gen_logp_BxS": gen_logp,
      "rewards_PxG": rewards,
  }


def _max_diff(a, b):
  """Largest |a - b| over the leaves, each divided by
  max(1, max |a|) of its leaf."""
  diffs = []
  for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    diffs.append(np.max(np.abs(x - y)) / max(1.0, np.max(np.abs(x))))
  return float(max(diffs))


def _loss_and_grads(config, model, **spec_fields):
  spec = ts.StepSpec(
      model=model,
      optimizer=optim.make_optimizer(config.optim),
      loss=losses.LossParams.from_config(config.rl),
      adv_norm="batch",
      zero_variance_filter=True,
      num_prompts=P,
      num_generations=G,
      temperature=0.7,
      **spec_fields
  )
  return functools.partial(ts.loss_and_grads, spec=spec)


@functools.lru_cache(maxsize=None)
def _bigram_results():
  """(loss, metrics, grads) of every loss x aggregation,
  whole batch and M = 4."""
  config, _, _ = _model()
  model = _Bigram()
  params = model.init(jax.random.key(0), jnp.zeros((1, 1), jnp.int32))["params"]

  def run_all(params, batch):
    results = {}
    for loss in losses.LOSSES.names():
      for aggregation in losses.AGGREGATIONS.names():
        config.rl.loss, config.rl.aggregation = loss, aggregation
        for m in (1, 4):
          results[loss, aggregation, m] = _loss_and_grads(
              config, model, microbatches=m
          )(params, batch)
    return results

  return jax.device_get(jax.jit(run_all)(params, _batch()))


@pytest.mark.parametrize("aggregation", losses.AGGREGATIONS.names())
@pytest.mark.parametrize("loss", losses.LOSSES.names())
def test_microbatches_give_the_whole_batch_gradient_and_metrics(
    loss, aggregation
):
  want, got = (_bigram_results()[loss, aggregation, m] for m in (1, 4))
  assert _max_diff(want[2], got[2]) < TOL
  # Something to compare.
  assert float(jnp.max(jnp.abs(want[2]["Embed_0"]["embedding"]))) > 1e-3
  assert _max_diff(want[0], got[0]) < TOL
  assert want[1].keys() == got[1].keys()
  for name in want[1]:
    assert _max_diff(want[1][name], got[1][name]) < (
        RATIO_TOL if "ratio" in name else TOL
    ), name
  clipped = (
      want[1]["clip_frac_high"]
      + want[1]["clip_frac_low"]
      + want[1]["capped_frac"]
  )
  assert float(clipped) > 0


def test_microbatches_with_tis_and_chunks_together():
  config, model, params = _model(tie_embeddings=False)
  config.rl.tis_cap = 1.5
  batch = _batch()
  want = jax.jit(_loss_and_grads(config, model))(params, batch)
  got = jax.jit(
      _loss_and_grads(config, model, microbatches=2, logprob_chunk=4)
  )(params, batch)
  assert _max_diff(want[2], got[2]) < TOL
  for name in want[1]:
    assert _max_diff(want[1][name], got[1][name]) < (
        RATIO_TOL if "ratio" in name else TOL
    ), name
  assert float(want[1]["tis_capped_frac"]) > 0


def test_accumulated_gradient_keeps_the_parameter_dtype():
  config, model, params = _model(
      param_dtype="bfloat16", compute_dtype="bfloat16"
  )
  _, _, grads = jax.jit(_loss_and_grads(config, model, microbatches=2))(
      params, _batch()
  )
  assert all(g.dtype == jnp.bfloat16 for g in jax.tree_util.tree_leaves(grads))


def test_chunked_logprobs_equal_the_whole_sequence():
  # T = S - 1 = 11 positions: chunks of 3 (4 chunks, 1 padded position), 7 (2
  # chunks, 3 padded) and 64 (one chunk of 11). The untied head
  # is in the test above.
  _, model, params = _model()
  tokens = jnp.asarray(_batch()["tokens_BxS"])
  weights = jnp.asarray(np.random.RandomState(1).randn(P * G, S), jnp.float32)

  def run(params, chunk):
    logp, entropy = logprobs.policy_logprobs(
        model, params, tokens, 0.7, chunk=chunk
    )
    return jnp.sum(logp * weights), (logp, entropy)

  grad = jax.grad(run, has_aux=True)
  results = jax.jit(lambda params: [grad(params, c) for c in (0, 3, 7, 64)])(
      params
  )
  (want_grads, want), chunked = results[0], results[1:]
  assert float(jnp.max(jnp.abs(want_grads["final_norm"]["scale"]))) > 0
  for got_grads, got in chunked:
    assert _max_diff(want, got) < TOL
    assert _max_diff(want_grads, got_grads) < TOL


def _validate(prompts, generations, microbatches, num_devices=None, chunk=0):
  config = helpers.tiny_config()
  config.data.prompts_per_step, config.data.generations_per_prompt = (
      prompts,
      generations,
  )
  config.trainer.microbatches, config.trainer.logprob_chunk = (
      microbatches,
      chunk,
  )
  config_lib.validate(config, num_devices)


def test_config_checks_that_microbatches_divide():
  _validate(3, 4, 12)
  _validate(8, 16, 16, num_devices=8)  # 8 rows per microbatch, one per device.
  with pytest.raises(
      config_lib.ConfigError, match=r"^trainer\.microbatches: 5 does not divide"
  ):
    _validate(3, 4, 5)
  with pytest.raises(
      config_lib.ConfigError,
      match=r"^trainer\.microbatches: 32 microbatches of 4 completions .* 8-way",
  ):
    _validate(8, 16, 32, num_devices=8)
  with pytest.raises(
      config_lib.ConfigError, match=r"^trainer\.microbatches: 0 must be > 0"
  ):
    _validate(3, 4, 0)
  with pytest.raises(
      config_lib.ConfigError, match=r"^trainer\.logprob_chunk: -1"
  ):
    _validate(3, 4, 1, chunk=-1)
