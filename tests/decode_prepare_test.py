"""`decode.prepare`: the regrouped weights, bit for bit, against a reference
regroup written here; on 8 simulated devices (in a subprocess), the weights
are cast before they are gathered."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scalerl_jax.models import decode
from scalerl_jax.models import model_config
from scalerl_jax.models import transformer
from tests import helpers

# Regrouped in bfloat16: prepare casts every kernel before it regroups.
OVERRIDES = [
    {},
    {"qkv_bias": True, "qk_norm": True},
    {"tie_embeddings": False, "fp32_lm_head": True},
    {"fp32_lm_head": True, "lm_head_algorithm": "highest"},
]


def _cfg_and_params(**overrides):
  """A bfloat16 tiny model and float32 parameters drawn at random (the
  initial biases are zeros, where a misplaced one would not show)."""
  cfg = model_config.ModelConfig.from_config(
      helpers.tiny_config(compute_dtype="bfloat16", **overrides).model
  )
  shapes = helpers.init_params(transformer.Transformer(cfg))
  leaves, tree = jax.tree.flatten(shapes)
  rng = np.random.RandomState(0)
  return cfg, jax.tree.unflatten(
      tree, [rng.randn(*x.shape).astype(np.float32) for x in leaves]
  )


def _reference_layer(cfg, stacked, i):
  """Layer i as `forward` expects it, head by head in numpy, then cast."""
  attn, mlp = stacked["attn"], stacked["mlp"]
  q = cfg.num_heads // cfg.num_kv_heads
  bf16 = lambda x: np.asarray(x).astype(jnp.bfloat16)
  kernel = lambda tree: np.asarray(tree["kernel"][i])

  def kv_major(part, axis):
    # Kv head g's query heads g * Q .. g * Q + Q - 1, then its k and its v.
    pieces = []
    for g in range(cfg.num_kv_heads):
      pieces += [part("q", g * q + j) for j in range(q)]
      pieces += [part("k", g), part("v", g)]
    return np.concatenate(pieces, axis=axis)

  layer = {
      "attn_norm": stacked["attn_norm"]["scale"][i],
      "mlp_norm": stacked["mlp_norm"]["scale"][i],
      "qkv": bf16(kv_major(lambda n, h: kernel(attn[n])[:, h], axis=1)),
      "o": bf16(np.concatenate(list(kernel(attn["o"])), axis=0)),
      **{name: bf16(kernel(mlp[name])) for name in ("gate", "up", "down")},
  }
  if cfg.qkv_bias:
    layer["qkv_bias"] = bf16(
        kv_major(lambda n, h: attn[n]["bias"][i][h], axis=0)
    )
  if cfg.qk_norm:
    layer["q_norm"] = attn["q_norm"]["scale"][i]
    layer["k_norm"] = attn["k_norm"]["scale"][i]
  return layer


def _reference_top(cfg, params):
  head = params["embedding"].T if cfg.tie_embeddings else params["lm_head"]
  top = {
      "embedding": params["embedding"].astype(jnp.bfloat16),
      "final_norm": params["final_norm"]["scale"],
  }
  if not cfg.fp32_lm_head:
    return top | {"head": head.astype(jnp.bfloat16)}
  if cfg.lm_head_algorithm == "highest":
    return top | {"head": head}
  # bf16_3x: head rounded to nearest bfloat16, and what that leaves, rounded.
  hi = head.astype(jnp.bfloat16)
  return top | {
      "head": hi,
      "head_lo": (head - hi.astype(np.float32)).astype(jnp.bfloat16),
  }


@pytest.mark.parametrize("overrides", OVERRIDES)
def test_prepare_equals_reference_regroup_bit_for_bit(overrides):
  cfg, params = _cfg_and_params(**overrides)
  got = jax.jit(decode.prepare, static_argnums=0)(cfg, params)
  want = _reference_top(cfg, params) | {
      "layers": tuple(
          _reference_layer(cfg, params["layers"], i)
          for i in range(cfg.num_layers)
      )
  }
  assert jax.tree.structure(got) == jax.tree.structure(want)
  for (path, g), w in zip(
      jax.tree_util.tree_flatten_with_path(got)[0], jax.tree.leaves(want)
  ):
    assert g.dtype == w.dtype, path
    np.testing.assert_array_equal(g, w, err_msg=str(path))


@pytest.mark.parametrize(
    "overrides", OVERRIDES + [{"tie_embeddings": False, "fp32_lm_head": False}]
)
def test_weights_cast_before_prepare_prepare_the_same(overrides):
  """mesh.transfer_dtype='bfloat16': the weights sent cast, the sampler's
  regroup is bit for bit the float32 weights' (so are its tokens)."""
  cfg, params = _cfg_and_params(**overrides)
  cast = decode.cast_for_prepare(cfg, params)
  prepare = jax.jit(decode.prepare, static_argnums=0)
  for g, w in zip(
      jax.tree.leaves(prepare(cfg, cast)),
      jax.tree.leaves(prepare(cfg, params)),
      strict=True,
  ):
    assert g.dtype == w.dtype
    np.testing.assert_array_equal(g, w)
  # What stays float32: the norm scales, and the head where it is the FP32
  # head (the embedding too when tied to it).
  kept = {
      jax.tree_util.keystr(path)
      for path, x in jax.tree_util.tree_flatten_with_path(cast)[0]
      if x.dtype == jnp.float32
  }
  norms = {
      jax.tree_util.keystr(path)
      for path, _ in jax.tree_util.tree_flatten_with_path(params)[0]
      if "norm" in jax.tree_util.keystr(path)
  }
  head = "['embedding']" if cfg.tie_embeddings else "['lm_head']"
  assert kept == norms | ({head} if cfg.fp32_lm_head else set())


@pytest.fixture(scope="module")
def sharded_results():
  return helpers.run_on_8_devices("tests.scripts.prepare_sharded")


@pytest.mark.slow(seconds=30)  # An 8-device subprocess.
@pytest.mark.parametrize("shape", [(1, 8, 1), (2, 2, 2)])
def test_sharded_prepare_equals_one_device(sharded_results, shape):
  assert sharded_results[shape]["equal_to_one_device"]


@pytest.mark.slow(seconds=30)
@pytest.mark.parametrize("shape", [(1, 8, 1), (2, 2, 2)])
def test_resident_weights_are_gathered_in_bfloat16(sharded_results, shape):
  # Left to itself, XLA:CPU's SPMD partitioner gathered the float32 kernels,
  # embedding and head, then cast (9 of 13 gathers here). Read after the
  # partitioner: XLA:CPU widens bfloat16 collectives to float32 in a later
  # pass, so the final program cannot show it. Every gather moves bfloat16:
  # the kernels, the embedding and the FP32 head's two bfloat16 parts.
  gathers = sharded_results[shape]["all_gathers"]
  assert set(gathers) == {"bf16"} and gathers["bf16"] > 0
