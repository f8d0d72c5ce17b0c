"""`model.remat_policy`: what a rematerialised block saves, the gradients it
gives, the planner's count of it, and the config's check of its name."""

import contextlib
import dataclasses
import io
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import scalerl
from scalerl_jax import config as config_lib
from scalerl_jax import sharding
from scalerl_jax.jobs.planner import activations
from scalerl_jax.jobs.planner import layout_bytes
from scalerl_jax.models import model_config
from scalerl_jax.models import transformer
from tests import helpers

_POLICIES = sorted(model_config.REMAT_POLICIES)


def _cfg(**overrides):
  return model_config.ModelConfig.from_config(
      helpers.tiny_config(qk_norm=True, **overrides).model
  )


def _loss_and_grads(cfg, params, tokens_BxT):
  model = transformer.Transformer(cfg)

  def loss(p):
    logp = jax.nn.log_softmax(model.apply({"params": p}, tokens_BxT))
    return jnp.sum(logp[..., 3])

  return jax.jit(jax.value_and_grad(loss))(params)


@pytest.mark.slow(seconds=30)  # Gradients of four models.
@pytest.mark.parametrize("scan_unroll", [0, 1])
@pytest.mark.parametrize("policy", _POLICIES)
def test_every_policy_gives_the_loss_and_gradients_of_no_remat(
    policy, scan_unroll
):
  # A policy only decides what the backward pass recomputes; the arithmetic
  # is the same, so float32 agrees to rounding: the compiler fuses and sums
  # in another order (seen: 3.6e-6 on an embedding gradient of 5.8e-3, whose
  # largest entry is ~0.1). Unrolled (the CPU default) and as a loop (the
  # accelerators').
  cfg = _cfg(remat=False, scan_unroll=scan_unroll)
  tokens_BxT = jnp.asarray(
      np.random.RandomState(0).randint(0, cfg.vocab_size, (2, 9)), jnp.int32
  )
  params = helpers.init_params(transformer.Transformer(cfg))
  remat = dataclasses.replace(cfg, remat=True, remat_policy=policy)
  loss, grads = _loss_and_grads(cfg, params, tokens_BxT)
  remat_loss, remat_grads = _loss_and_grads(remat, params, tokens_BxT)
  np.testing.assert_allclose(remat_loss, loss, rtol=1e-6)
  jax.tree.map(
      lambda a, b: np.testing.assert_allclose(
          a, b, rtol=1e-4, atol=1e-4 * float(jnp.max(jnp.abs(b)))
      ),
      remat_grads,
      grads,
  )


_RESIDUAL = re.compile(r"^(\w+)\[([\d,]*)\] output of scan")
_BYTES = {"f32": 4, "bf16": 2}


def _saved_layer_bytes(cfg, b, t):
  """Bytes JAX saves from the layer scan for the backward pass, as its own
  `print_saved_residuals` lists them."""
  model = transformer.Transformer(cfg)
  tokens_BxT = jnp.zeros((b, t), jnp.int32)
  params = helpers.init_params(model)

  def hidden_sum(p):
    out = model.apply({"params": p}, tokens_BxT, return_hidden=True)
    return jnp.sum(out.astype(jnp.float32))

  printed = io.StringIO()
  with contextlib.redirect_stdout(printed):
    jax.ad_checkpoint.print_saved_residuals(hidden_sum, params)
  total = 0
  for line in printed.getvalue().splitlines():
    match = _RESIDUAL.match(line)
    if match:
      shape = [int(n) for n in match.group(2).split(",")]
      total += _BYTES[match.group(1)] * int(np.prod(shape))
  return total


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("policy", _POLICIES)
def test_the_planner_counts_what_each_policy_saves(policy, dtype):
  # What the layer scan keeps for the backward, per the planner (each
  # layer's input and what the policy saves beyond it) and per JAX. Fails if
  # the policy is not applied (save_dots saving as little as full) or the
  # planner misses or invents a saved activation.
  cfg = _cfg(remat=True, remat_policy=policy, compute_dtype=dtype)
  b, t = 2, 9
  block_input = [((b, t, cfg.embed_dim), (), np.dtype(cfg.dtype).itemsize)]
  planned = cfg.num_layers * sum(
      int(np.prod(shape)) * nbytes
      for shape, _, nbytes in block_input
      + activations.REMAT_SAVES[policy](cfg, b, t)
  )
  assert _saved_layer_bytes(cfg, b, t) == planned
  if policy != "full":
    full = dataclasses.replace(cfg, remat_policy="full")
    assert _saved_layer_bytes(full, b, t) < planned


def test_the_planner_knows_every_policy():
  assert set(activations.REMAT_SAVES) == set(model_config.REMAT_POLICIES)


def test_save_dots_raises_the_planned_train_activations():
  config = helpers.tiny_config(compute_dtype="bfloat16", qk_norm=True)
  mesh = layout_bytes.abstract_mesh(config.mesh, 1)
  rules = sharding.logical_rules(config.mesh)

  def planned(policy):
    cfg = dataclasses.replace(
        model_config.ModelConfig.from_config(config.model),
        remat_policy=policy,
    )
    return activations.activation_bytes(
        cfg, mesh, rules, 1, 160, remat=True, platform="cpu"
    )

  # One sequence of 159 tokens, 2 layers, D 64, H 4, K 2, E 16, I 128,
  # bfloat16. A layer's backward: 4 x D + 2 x H*E + 2 x K*E + 3 x I = 832
  # entries = 1,664 B, the float32 softmax and its bfloat16 copy 4 x 159 x 6
  # = 3,816 B, q and k before their norms 96 x 2 = 192 B: 5,672 B a token.
  # Kept per layer: full, its input D x 2 = 128 B; save_dots also q, k, v,
  # o, gate, up = 64 + 32 + 32 + 64 + 128 + 128 = 448 entries = 896 B.
  assert planned("full") == 159 * (2 * 128 + 5_672)
  assert planned("save_dots") == 159 * (2 * (128 + 896) + 5_672)


def test_an_unknown_policy_is_refused_by_name():
  config = scalerl.get_config("qwen3_0.6b")
  with config.unlocked():
    config.model.remat_policy = "save_everything"
  with pytest.raises(
      config_lib.ConfigError,
      match=r"model.remat_policy: 'save_everything' is not one of "
      r"\('full', 'save_dots'\)",
  ):
    config_lib.validate(config)
