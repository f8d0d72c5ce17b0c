"""Mixed precision: the accelerator variants' dtype policy
learns at the recipe's lr.

AdamW at lr 5e-7 moves a weight by ~5e-7 per step, far below one bfloat16 ulp
of a weight of 0.02 (2^-14 ~ 6e-5): bfloat16 parameters round every update
away. The variants keep float32 master weights and moments and compute in
bfloat16; these tests hold them to an all-float32 reference and show that the
old policy (bfloat16 parameters) fails the same check.
"""

import dataclasses
import functools
import warnings

import jax
import jax.numpy as jnp
import optax
import pytest

from configs import scalerl
from scalerl_jax import config as config_lib
from scalerl_jax import optim
from scalerl_jax.models import lm_head
from scalerl_jax.models import model_config
from scalerl_jax.models import transformer
from tests import helpers

_STEPS = 20
# A small network with the variant's dtype policy, norms and head.
_SHAPE = dict(
    vocab_size=256,
    embed_dim=128,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=32,
    mlp_dim=256,
    max_seq_len=64,
    remat=False,
)


def _summed_updates(cfg, params0, optimizer, tokens_BxS):
  """Every entry's total displacement after _STEPS AdamW
  steps on the LM loss."""
  model = transformer.Transformer(cfg)

  def loss(params):
    logits = model.apply({"params": params}, tokens_BxS[:, :-1])
    return -jnp.mean(lm_head.token_logprobs(logits, tokens_BxS[:, 1:]))

  @jax.jit
  def step(params, opt_state):
    updates, opt_state = optimizer.update(
        jax.grad(loss)(params), opt_state, params
    )
    return optax.apply_updates(params, updates), opt_state

  params = jax.tree.map(lambda x: x.astype(cfg.pdtype), params0)
  start = jax.tree.map(lambda x: x.astype(jnp.float32), params)
  opt_state = optimizer.init(params)
  for _ in range(_STEPS):
    params, opt_state = step(params, opt_state)
  moved = jax.tree.map(lambda p, s: p.astype(jnp.float32) - s, params, start)
  return jnp.concatenate([x.ravel() for x in jax.tree.leaves(moved)])


@functools.cache
def _moved(name):
  """_summed_updates of "variant", "reference" (all float32) or
  "bfloat16_params", each run once per process and only where a test asks."""
  config = scalerl.get_config("qwen3_0.6b")
  # lr 5e-7, eps 1e-15, warmup 100.
  optimizer = optim.make_optimizer(config.optim)
  variant = dataclasses.replace(
      model_config.ModelConfig.from_config(config.model), **_SHAPE
  )
  reference = dataclasses.replace(
      variant, param_dtype="float32", compute_dtype="float32"
  )
  cfg = {
      "variant": variant,
      "reference": reference,
      "bfloat16_params": dataclasses.replace(variant, param_dtype="bfloat16"),
  }[name]
  tokens_BxS = jax.random.randint(
      jax.random.key(2), (8, 33), 0, _SHAPE["vocab_size"]
  )
  params0 = helpers.init_params(transformer.Transformer(reference))
  return _summed_updates(cfg, params0, optimizer, tokens_BxS)


def _agreement(moved, reference):
  """(relative error of the summed update, of its norm, cosine)
  against the reference."""
  sum_err = abs(moved.sum() - reference.sum()) / abs(reference.sum())
  norm_err = abs(jnp.linalg.norm(moved) / jnp.linalg.norm(reference) - 1)
  cosine = (
      moved @ reference / (jnp.linalg.norm(moved) * jnp.linalg.norm(reference))
  )
  return float(sum_err), float(norm_err), float(cosine)


def test_variant_policy_is_float32_master_with_bfloat16_compute():
  for variant in ("qwen3_0.6b", "qwen2.5_0.5b", "llama3_8b"):
    m = scalerl.get_config(variant).model
    assert (m.param_dtype, m.compute_dtype, m.fp32_lm_head) == (
        "float32",
        "bfloat16",
        True,
    )


@pytest.mark.slow(seconds=10)  # Two runs per variant.
def test_variant_weights_move_as_float32_reference():
  # Measured: norm error 0.0043, cosine 0.993 on both lines; the summed
  # update's error 0.0046 (Python 3.11, JAX 0.10.2), 0.0055 (3.12, JAX
  # 0.12.0.1) and 0.0115 in CI's 3.12 run beside another worker: a sum over
  # entries of both signs cancels, so it carries bfloat16 compute's noise
  # (XLA's threaded reductions) several times over. Lost updates read 0.996
  # (3.12 here; test_bfloat16_parameters_fail_the_same_check holds them above
  # 0.9 on both lines); 0.05 is 4x the largest measured and 18x below 0.9.
  sum_err, norm_err, cosine = _agreement(_moved("variant"), _moved("reference"))
  assert sum_err <= 0.05 and norm_err <= 1e-2 and cosine >= 0.98
  # Nearly every entry moved.
  assert float(jnp.mean(_moved("variant") != 0)) > 0.99


def test_bfloat16_parameters_fail_the_same_check():
  # The defect the variants had: ~0.03% of entries move at all.
  sum_err, norm_err, _ = _agreement(
      _moved("bfloat16_params"), _moved("reference")
  )
  assert sum_err > 0.9 and norm_err > 0.9
  assert float(jnp.mean(_moved("bfloat16_params") != 0)) < 0.01


def test_bfloat16_parameters_warn_by_name():
  config = scalerl.get_config("qwen3_0.6b")
  with config.unlocked():
    config.model.param_dtype = "bfloat16"
  with pytest.warns(
      config_lib.PrecisionWarning, match="model.param_dtype='bfloat16'"
  ):
    config_lib.validate(config)
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    # The shipped policy: silent.
    config_lib.validate(scalerl.get_config("qwen3_0.6b"))
