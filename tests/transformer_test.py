"""Properties of the policy transformer: causality, KV-cache
decode == full forward, dtypes."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import scalerl
from scalerl_jax.models import decode
from scalerl_jax.models import kv_cache
from scalerl_jax.models import lm_head
from scalerl_jax.models import model_config
from scalerl_jax.models import transformer
from tests import helpers


def _model(**overrides):
  cfg = model_config.ModelConfig.from_config(
      helpers.tiny_config(**overrides).model
  )
  model = transformer.Transformer(cfg)
  params = helpers.init_params(model)
  return cfg, _Jitted(model), params


class _Jitted:
  """The model with `apply` jitted (eager scans would recompile every call)."""

  def __init__(self, model):
    self.apply = jax.jit(model.apply)


def _tokens(shape, vocab, seed=0):
  return jnp.asarray(
      np.random.RandomState(seed).randint(0, vocab, shape), jnp.int32
  )


@pytest.mark.parametrize(
    "overrides",
    [{}, {"qkv_bias": True}, {"qk_norm": True}, {"tie_embeddings": False}],
)
def test_param_count_matches_formula(overrides):
  cfg, _, params = _model(**overrides)
  assert (
      sum(x.size for x in jax.tree_util.tree_leaves(params)) == cfg.num_params()
  )


def test_every_parameter_has_logical_axes():
  cfg = model_config.ModelConfig.from_config(
      helpers.tiny_config(
          qkv_bias=True, qk_norm=True, tie_embeddings=False
      ).model
  )
  boxed = jax.eval_shape(
      lambda: transformer.Transformer(cfg).init(
          jax.random.key(0), jnp.zeros((1, 1), jnp.int32)
      )
  )["params"]
  specs = jax.tree_util.tree_leaves(
      nn.get_partition_spec(boxed),
      is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec),
  )
  shapes = jax.tree_util.tree_leaves(nn.unbox(boxed))
  assert len(specs) == len(shapes) == 17
  for spec, shape in zip(specs, shapes):
    assert len(spec) == len(shape.shape) and all(
        isinstance(n, str) for n in spec
    )


def test_causality_future_token_does_not_change_past_logits():
  cfg, model, params = _model()
  tokens = _tokens((2, 12), cfg.vocab_size)
  changed = tokens.at[:, 7].set((tokens[:, 7] + 1) % cfg.vocab_size)
  a = model.apply({"params": params}, tokens)
  b = model.apply({"params": params}, changed)
  np.testing.assert_array_equal(np.asarray(a[:, :7]), np.asarray(b[:, :7]))
  assert np.abs(np.asarray(a[:, 7:] - b[:, 7:])).max() > 1e-3


_forward = jax.jit(decode.forward, static_argnums=(0, 5))


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"qkv_bias": True},
        {"qk_norm": True},
        {"tie_embeddings": False, "qkv_bias": True, "qk_norm": True},
    ],
)
# "ES" is the TPU's layout at head_dim < 128: checked on the CPU here.
@pytest.mark.parametrize("layout", list(kv_cache.VALUE_LAYOUTS))
def test_kv_cache_decode_equals_full_forward(overrides, layout):
  cfg, model, params = _model(**overrides)
  tokens = _tokens((3, 14), cfg.vocab_size, seed=1)
  full = model.apply({"params": params}, tokens)
  prepared = decode.prepare(cfg, params)
  cache = kv_cache.init_cache(cfg, batch=3, length=32, value_layout=layout)
  # Prefill 5 tokens, then a 3-token chunk, then one token at a time.
  logits, cache = _forward(
      cfg,
      prepared,
      tokens[:, :5],
      jnp.broadcast_to(jnp.arange(5), (3, 5)),
      cache,
      layout,
  )
  pieces = [logits]
  logits, cache = _forward(
      cfg,
      prepared,
      tokens[:, 5:8],
      jnp.broadcast_to(jnp.arange(5, 8), (3, 3)),
      cache,
      layout,
  )
  pieces.append(logits)
  for t in range(8, 14):
    logits, cache = _forward(
        cfg,
        prepared,
        tokens[:, t : t + 1],
        jnp.full((3, 1), t),
        cache,
        layout,
    )
    pieces.append(logits)
  np.testing.assert_allclose(
      np.concatenate(pieces, axis=1), full, atol=1e-5, rtol=0
  )


@pytest.mark.parametrize("layout,value_shape", [("SE", "KSE"), ("ES", "KES")])
def test_kv_cache_layout(layout, value_shape):
  """Keys [B, K, E, S] and values [B, K, S, E] (or [B, K, E, S]), one buffer
  per layer, at the written positions."""
  cfg, _, params = _model()
  tokens = _tokens((2, 3), cfg.vocab_size, seed=4)
  cache = kv_cache.init_cache(cfg, batch=2, length=8, value_layout=layout)
  assert len(cache["k"]) == len(cache["v"]) == cfg.num_layers
  sizes = {"K": cfg.num_kv_heads, "E": cfg.head_dim, "S": 8}
  assert cache["k"][0].shape == (2, sizes["K"], sizes["E"], 8)
  assert cache["v"][0].shape == (2,) + tuple(sizes[d] for d in value_shape)
  pos = jnp.array([[0, 1, 2], [4, 5, 6]])
  _, cache = _forward(
      cfg, decode.prepare(cfg, params), tokens, pos, cache, layout
  )
  for name, axis in (("k", 3), ("v", 1 + value_shape.index("S"))):
    written = np.abs(np.asarray(cache[name][1])).sum(
        axis=tuple(a for a in range(4) if a not in (0, axis))
    )
    assert (written[0, :3] > 0).all() and (written[0, 3:] == 0).all()
    assert (written[1, 4:7] > 0).all() and (
        written[1, [0, 1, 2, 3, 7]] == 0
    ).all()


def test_kv_cache_rows_at_different_positions():
  """Each row writes and attends at its own position
  (what sampler slots need)."""
  cfg, model, params = _model()
  short, long = _tokens((1, 4), cfg.vocab_size, 2), _tokens(
      (1, 9), cfg.vocab_size, 3
  )
  ref_short = model.apply({"params": params}, short)
  ref_long = model.apply({"params": params}, long)
  prepared = decode.prepare(cfg, params)
  cache = kv_cache.init_cache(cfg, batch=2, length=16)
  padded = jnp.concatenate(
      [jnp.pad(short[:, :3], ((0, 0), (0, 5))), long[:, :8]], axis=0
  )
  _, cache = _forward(
      cfg, prepared, padded, jnp.broadcast_to(jnp.arange(8), (2, 8)), cache
  )
  # Row 0 continues at position 3 (its padding beyond is overwritten / never
  # visible), row 1 at position 8.
  step = jnp.concatenate([short[:, 3:4], long[:, 8:9]], axis=0)
  logits, _ = _forward(cfg, prepared, step, jnp.array([[3], [8]]), cache)
  np.testing.assert_allclose(logits[0, 0], ref_short[0, 3], atol=1e-5, rtol=0)
  np.testing.assert_allclose(logits[1, 0], ref_long[0, 8], atol=1e-5, rtol=0)


def test_kv_cache_decode_in_bfloat16_tracks_full_forward():
  cfg, model, params = _model(compute_dtype="bfloat16", param_dtype="bfloat16")
  tokens = _tokens((2, 6), cfg.vocab_size, seed=5)
  full = model.apply({"params": params}, tokens)
  cache = kv_cache.init_cache(cfg, batch=2, length=8)
  assert cache["k"][0].dtype == jnp.bfloat16
  logits, _ = _forward(
      cfg,
      decode.prepare(cfg, params),
      tokens,
      jnp.broadcast_to(jnp.arange(6), (2, 6)),
      cache,
  )
  assert logits.dtype == jnp.float32
  np.testing.assert_allclose(logits, full, atol=0.05, rtol=0)


def test_fp32_lm_head_returns_float32_under_bfloat16():
  cfg, model, params = _model(
      compute_dtype="bfloat16", param_dtype="bfloat16", fp32_lm_head=True
  )
  assert all(x.dtype == jnp.bfloat16 for x in jax.tree_util.tree_leaves(params))
  tokens = _tokens((2, 6), cfg.vocab_size)
  logits = model.apply({"params": params}, tokens)
  assert logits.dtype == jnp.float32
  cfg16, model16, _ = _model(
      compute_dtype="bfloat16", param_dtype="bfloat16", fp32_lm_head=False
  )
  logits16 = model16.apply({"params": params}, tokens)
  assert logits16.dtype == jnp.bfloat16
  # Same network; only the head's precision differs, so the two
  # agree to bf16 resolution.
  np.testing.assert_allclose(np.asarray(logits16, np.float32), logits, atol=0.1)


def test_cache_longer_than_context_is_rejected():
  cfg, _, _ = _model()
  with pytest.raises(ValueError, match="max_seq_len"):
    kv_cache.init_cache(cfg, batch=1, length=cfg.max_seq_len + 1)


def test_model_config_defaults_are_the_configs():
  # The run-time fields a checkpoint's config.json does not hold default to
  # configs/scalerl.py's values; the network's shape has no default at all.
  defaults = {
      f.name: f.default
      for f in dataclasses.fields(model_config.ModelConfig)
      if f.default is not dataclasses.MISSING
  }
  assert set(defaults) == {
      "param_dtype",
      "compute_dtype",
      "fp32_lm_head",
      "lm_head_algorithm",
      "remat",
      "remat_policy",
      "attention",
      "scan_unroll",
  }
  model = scalerl.get_config().model
  assert defaults == {name: model[name] for name in defaults}


@pytest.mark.parametrize("layout", list(kv_cache.VALUE_LAYOUTS))
def test_cache_prefix_and_put_prefix_move_the_first_positions(layout):
  # What the sampler's windows and prefills do with a cache in either layout:
  # the first p positions of chosen rows, and nothing else, are replaced.
  cfg, _, _ = _model()
  cache = jax.tree.map(
      lambda x: jnp.asarray(
          np.random.RandomState(x.ndim).randn(*x.shape), x.dtype
      ),
      kv_cache.init_cache(cfg, batch=3, length=8, value_layout=layout),
  )
  part = jax.tree.map(
      lambda x: x[:2] + 100.0, kv_cache.cache_prefix(cache, 5, layout)
  )
  assert kv_cache.cache_length(part) == 5
  out = kv_cache.put_prefix(cache, part, jnp.array([2, 0]), layout)
  s_axis = {"k": 3, "v": 2 if layout == "SE" else 3}  # Positions.
  for name in ("k", "v"):
    old = np.moveaxis(np.asarray(cache[name][0]), s_axis[name], -1)
    new = np.moveaxis(np.asarray(out[name][0]), s_axis[name], -1)
    np.testing.assert_array_equal(new[1], old[1])  # Row 1 untouched.
    np.testing.assert_array_equal(new[:, ..., 5:], old[:, ..., 5:])
    np.testing.assert_allclose(new[2, ..., :5], old[0, ..., :5] + 100.0)
    np.testing.assert_allclose(new[0, ..., :5], old[1, ..., :5] + 100.0)


@pytest.mark.parametrize("remat", [False, True])
def test_layer_loop_equals_unrolled_layers(remat):
  # model.scan_unroll = 1 (a loop over layers, the TPU/GPU default) and 0
  # (all layers unrolled on CPU) run the same network with the same stacked
  # parameters: same logits, same gradients.
  cfg, model, params = _model(remat=remat)
  assert model_config.scan_layers_unroll(cfg, "cpu") == cfg.num_layers
  assert model_config.scan_layers_unroll(cfg, "tpu") == (
      1 if remat else cfg.num_layers
  )
  loop = transformer.Transformer(dataclasses.replace(cfg, scan_unroll=1))
  tokens = _tokens((2, 9), cfg.vocab_size)

  def loss(apply, p):
    return jnp.sum(jax.nn.log_softmax(apply({"params": p}, tokens))[..., 3])

  unrolled = transformer.Transformer(cfg)
  # Jitted: run eagerly, the loop's scan dispatches op by op (14 s here).
  np.testing.assert_allclose(
      _Jitted(loop).apply({"params": params}, tokens),
      _Jitted(unrolled).apply({"params": params}, tokens),
      rtol=1e-5,
      atol=1e-5,
  )
  g_loop = jax.jit(jax.grad(lambda p: loss(loop.apply, p)))(params)
  g_unrolled = jax.jit(jax.grad(lambda p: loss(unrolled.apply, p)))(params)
  jax.tree.map(
      lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
      g_loop,
      g_unrolled,
  )
