"""KV-cache inference path of the policy transformer: prefill and decode.

The same network and math as `transformer.Transformer`, on weights that
`prepare` regroups once per parameter version: per layer, q, k and v as one
kernel [D, K x (Q + 2) x E], gate, up [D, I] and down [I, D], o [H * E, D],
all in the compute dtype. Every kernel is a matrix whose contracting
dimension is major, the layout each backend's matmul reads in place: as
[D, K, Q + 2, E] and [D, 2, I] the TPU compiler copied them into another
layout, hoisted out of the decode loop (docs/tpu.md, "Resident sampler
weights"), and XLA:CPU transposed [H, E, D] on every step.

The cache is one buffer per layer, keys [B, K, E, S] and values [B, K, S, E].
`forward` writes T tokens per row at explicit positions and attends to every
cached position not after the query's, so each row (sampler slot) can be at
its own position: prefill is T = prompt length on a fresh cache (through
`config.model.attention`), decode T = 1.

Design: docs/design/models.md.

Shape letters: the package key (scalerl_jax/__init__.py), and I mlp_dim,
J = Q + 2 (the q, k and v of one kv head), F = K x J x E.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from scalerl_jax.models import attention as attention_lib
from scalerl_jax.models import decode_attention
from scalerl_jax.models.lm_head import head_algorithm
from scalerl_jax.models.lm_head import lm_head
from scalerl_jax.models.lm_head import split_bf16
from scalerl_jax.models.model_config import ModelConfig
from scalerl_jax.models.transformer import apply_rope
from scalerl_jax.models.transformer import attention
from scalerl_jax.models.transformer import rms_norm
from scalerl_jax.models.transformer import rope_frequencies

# {"k": layers x [B, K, E, S], "v": layers x [B, K, S, E] or [B, K, E, S]}
Cache = dict[str, tuple[jax.Array, ...]]

KEY_AXES = ("act_batch", "act_kv_heads", "head_dim", "act_len")
# The value cache's layouts, by name: its logical axes. "SE", position-major,
# is the layout XLA:CPU's probabilities-times-values product reads in place
# ("ES" ran slower there). "ES", as the keys, is for TPUs when head_dim is
# under their 128 lanes: an E-minor cache is padded to 128 there, and the
# compiler copied every layer's values into that padded layout. Both
# measured in docs/tpu.md ("The value cache at head_dim 64").
VALUE_LAYOUTS = {
    "SE": ("act_batch", "act_kv_heads", "act_len", "head_dim"),
    "ES": KEY_AXES,
}
TPU_LANES = 128


def value_layout(platform: str, head_dim: int) -> str:
  """The value-cache layout (a key of VALUE_LAYOUTS) for `platform`."""
  return "ES" if platform == "tpu" and head_dim < TPU_LANES else "SE"


def cache_align(platform: str) -> int:
  """Cache positions are allocated in multiples of this on `platform`.

  On TPU the keys' positions are their minor (lane) dimension. A length that
  fills no 128-lane tile made the compiler keep the cache in another layout
  and copy it inside the decode loop (docs/tpu.md, "The cache in whole lane
  tiles", has the bytes before and after).
  """
  return TPU_LANES if platform == "tpu" else 1


def allocated_length(length: int, align: int) -> int:
  """The positions a cache of `length` allocates: the next multiple of
  `align` (`cache_align`)."""
  return -(-length // align) * align


def _len_axis(layout: str) -> int:
  """The position axis of a value cache in `layout`."""
  return VALUE_LAYOUTS[layout].index("act_len")


def _value_order(layout: str) -> tuple[int, ...]:
  """The transpose of new values [B, T, K, E] into the cache's `layout`."""
  new = ("act_batch", "act_len", "act_kv_heads", "head_dim")
  return tuple(new.index(axis) for axis in VALUE_LAYOUTS[layout])


PREPARED_AXES = {  # Logical names of the prepared weights (see `prepare`).
    "attn_norm": ("norm",),
    "mlp_norm": ("norm",),
    "q_norm": ("head_dim",),
    "k_norm": ("head_dim",),
    # K x J x E flattened, kv head major: split over `kv_heads` it keeps whole
    # kv heads together (K divides over the axis, as for the k kernel).
    "qkv": ("embed", "kv_heads"),
    "qkv_bias": ("kv_heads",),
    "o": ("heads", "embed"),
    "gate": ("embed", "mlp"),
    "up": ("embed", "mlp"),
    "down": ("mlp", "embed"),
}
TOP_AXES = {  # ... and of the rest of them.
    "embedding": ("vocab", "embed"),
    "final_norm": ("norm",),
    "head": ("embed", "vocab"),
    "head_lo": ("embed", "vocab"),
}


def init_cache(
    cfg: ModelConfig,
    batch: int,
    length: int,
    dtype=None,
    value_layout: str = "SE",
    align: int = 1,
) -> Cache:
  """An empty cache of `length` positions for `batch` rows, allocated as the
  next multiple of `align` (`cache_align`); positions past `length` are
  never written or attended to."""
  if length > cfg.max_seq_len:
    raise ValueError(
        f"KV cache length {length} exceeds model.max_seq_len {cfg.max_seq_len}"
    )
  length = allocated_length(length, align)
  dtype = dtype or cfg.dtype
  k, e, n = cfg.num_kv_heads, cfg.head_dim, cfg.num_layers
  size = {
      "act_batch": batch,
      "act_kv_heads": k,
      "act_len": length,
      "head_dim": e,
  }
  values = tuple(size[axis] for axis in VALUE_LAYOUTS[value_layout])
  return {
      "k": tuple(jnp.zeros((batch, k, e, length), dtype) for _ in range(n)),
      "v": tuple(jnp.zeros(values, dtype) for _ in range(n)),
  }


def cache_length(cache: Cache) -> int:
  return cache["k"][0].shape[-1]


def cache_prefix(cache: Cache, length: int, value_layout: str = "SE") -> Cache:
  """A copy of the first `length` positions of every row."""
  head = (slice(None),) * _len_axis(value_layout)
  return {
      "k": tuple(x[..., :length] for x in cache["k"]),
      "v": tuple(x[head + (slice(length),)] for x in cache["v"]),
  }


def put_prefix(
    cache: Cache,
    part: Cache,
    rows: Any = slice(None),
    value_layout: str = "SE",
) -> Cache:
  """Writes `part` (one row per entry of `rows`) over their first positions.

  Row ids out of range are dropped.
  """
  p = cache_length(part)
  inner = (slice(None),) * (_len_axis(value_layout) - 1)
  return {
      "k": tuple(
          old.at[rows, ..., :p].set(new, mode="drop")
          for old, new in zip(cache["k"], part["k"])
      ),
      "v": tuple(
          old.at[(rows,) + inner + (slice(p),)].set(new, mode="drop")
          for old, new in zip(cache["v"], part["v"])
      ),
  }


def _write_rows(
    cache_BxX: jax.Array, update_BxX: jax.Array, start_B: jax.Array, axis: int
) -> jax.Array:
  """Writes update[b] into cache[b] from start[b] along the cache's `axis`.

  A start too late for the update to fit is moved back until it does. One
  dynamic-update-slice per row, not a scatter: docs/design/models.md.
  """

  def write(row_X, update_X, start):
    starts = [jnp.zeros((), start.dtype)] * row_X.ndim
    starts[axis - 1] = start
    return jax.lax.dynamic_update_slice(
        row_X, update_X.astype(row_X.dtype), starts
    )

  return jax.vmap(write)(cache_BxX, update_BxX, start_B)


def _where_it_lies(fn, w: Any, where: Any) -> Any:
  """`fn(w)` for an elementwise `fn`, computed in `w`'s own layout `where`
  (its sharding; None: no mesh, left to the compiler)."""
  out = fn(w)
  return out if where is None else jax.lax.with_sharding_constraint(out, where)


def prepare(
    cfg: ModelConfig, params: Any, param_shardings: Any = None
) -> dict[str, Any]:
  """Regroups `Transformer` parameters for `forward` (module docstring).

  Args:
    cfg: the model's config.
    params: its parameters.
    param_shardings: the parameters' shardings (a matching tree), or None
      without a mesh. Each weight is cast (or split) there, in its training
      layout, before the regroup gathers it into the layout of
      `PREPARED_AXES`: left to itself, XLA's partitioner may gather the
      float32 weights first (tests/decode_prepare_test.py).

  Returns:
    {"layers": one weight dict per layer, and TOP_AXES' names}.
  """
  dtype = cfg.dtype
  where = param_shardings or jax.tree.map(lambda _: None, params)
  cast = lambda w: w.astype(dtype)
  blocks = [
      (params["layers"][block], where["layers"][block])
      for block in ("attn", "mlp")
  ]
  kernels = {
      name: _where_it_lies(cast, tree[name]["kernel"], at[name]["kernel"])
      for tree, at in blocks
      for name in tree
      if "kernel" in tree[name]
  }
  layers = tuple(
      {
          name: nn.with_logical_constraint(w, PREPARED_AXES[name])
          for name, w in _layer(cfg, params["layers"], kernels, i).items()
      }
      for i in range(cfg.num_layers)
  )
  # The head is kept as `lm_head` computes with it, so the copy each chip
  # holds is no wider than it is used: float32 for the FP32 head at
  # "highest", its bfloat16 parts for "bf16_3x" (split once here, not on
  # every step). The embedding is looked up, then cast: cast first, the same
  # values.
  head_name = "embedding" if cfg.tie_embeddings else "lm_head"
  if not cfg.fp32_lm_head:
    split = lambda w: {"head": cast(w)}
  elif head_algorithm(cfg) == "bf16_3x":
    split = lambda w: dict(zip(("head", "head_lo"), split_bf16(w)))
  else:
    split = lambda w: {"head": w.astype(jnp.float32)}
  top = _where_it_lies(split, params[head_name], where[head_name])
  if cfg.tie_embeddings:
    top = {name: w.T for name, w in top.items()}
  top |= {
      "embedding": _where_it_lies(
          cast, params["embedding"], where["embedding"]
      ),
      "final_norm": params["final_norm"]["scale"],
  }
  return {
      **{
          name: nn.with_logical_constraint(w, TOP_AXES[name])
          for name, w in top.items()
      },
      "layers": layers,
  }


def _layer(
    cfg: ModelConfig, stacked: Any, kernels: dict[str, jax.Array], i: int
) -> dict[str, jax.Array]:
  """Layer `i`'s weights for `forward`, from the stacked parameters and the
  stacked `kernels` (by name, in the compute dtype)."""
  h, k, e = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
  d = cfg.embed_dim
  attn = stacked["attn"]
  # Query head k * Q + q reads kv head k (as in `attention`), so [D, H, E]
  # reshapes to [D, K, Q, E] and k, v join as entries Q and Q + 1; then
  # K x J x E is flattened.
  layer = {
      "attn_norm": stacked["attn_norm"]["scale"][i],
      "mlp_norm": stacked["mlp_norm"]["scale"][i],
      "qkv": jnp.concatenate(
          [
              kernels["q"][i].reshape(d, k, h // k, e),
              kernels["k"][i][:, :, None],
              kernels["v"][i][:, :, None],
          ],
          axis=2,
      ).reshape(d, -1),
      "o": kernels["o"][i].reshape(h * e, d),
      **{name: kernels[name][i] for name in ("gate", "up", "down")},
  }
  if cfg.qkv_bias:
    layer["qkv_bias"] = (
        jnp.concatenate(
            [
                attn["q"]["bias"][i].reshape(k, h // k, e),
                attn["k"]["bias"][i][:, None],
                attn["v"]["bias"][i][:, None],
            ],
            axis=1,
        )
        .reshape(-1)
        .astype(cfg.dtype)
    )
  if cfg.qk_norm:
    layer["q_norm"] = attn["q_norm"]["scale"][i]
    layer["k_norm"] = attn["k_norm"]["scale"][i]
  return layer


def forward(
    cfg: ModelConfig,
    prepared: dict[str, Any],
    tokens_BxT: jax.Array,
    pos_BxT: jax.Array,
    cache: Cache,
    value_layout: str = "SE",
    decode_kernel: str = "plain",
) -> tuple[jax.Array, Cache]:
  """Writes T tokens per row into the cache; returns their next-token logits.

  A decode step (T = 1) attends through `decode_kernel`, "plain" or
  "pallas" (`decode_attention.choose`; "pallas" needs a cache length it
  tiles).

  `pos_BxT` is consecutive within a row and below S; a row whose tokens would
  end past the cache writes them at its last positions instead (the sampler
  decodes finished slots, never read again, in windows shorter than they
  are). Cache entries after a row's tokens are never read. Returns logits
  [B, T, V] (float32 when `fp32_lm_head`) and the new cache.
  """
  dtype = cfg.dtype
  h, k, e = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
  g = h // k
  b, t = tokens_BxT.shape
  s = cache_length(cache)
  inv_freq = rope_frequencies(cfg)
  visible_BxTxS = jnp.arange(s)[None, None, :] <= pos_BxT[:, :, None]
  # A prefill of a fresh cache (T consecutive positions below S = T are
  # 0..T-1) attends over its own tokens with the configured kernel; plain
  # stays on the cache path below, the same math.
  prefill_kernel = (
      attention_lib.resolve(cfg.attention, t, dtype) if t == s > 1 else "plain"
  )
  x_BxTxD = jnp.take(prepared["embedding"], tokens_BxT, axis=0).astype(dtype)
  keys, values = [], []
  for layer, key_cache, value_cache in zip(
      prepared["layers"], cache["k"], cache["v"]
  ):
    normed = rms_norm(x_BxTxD, layer["attn_norm"], cfg.norm_eps, dtype)
    qkv_BxTxF = jnp.dot(normed, layer["qkv"])
    if cfg.qkv_bias:
      qkv_BxTxF = qkv_BxTxF + layer["qkv_bias"][None, None]
    qkv_BxTxKxJxE = qkv_BxTxF.reshape(b, t, k, g + 2, e)
    q_BxTxKxQxE = qkv_BxTxKxJxE[:, :, :, :g]
    k_BxTxKxE, v_BxTxKxE = (
        qkv_BxTxKxJxE[:, :, :, g],
        qkv_BxTxKxJxE[:, :, :, g + 1],
    )
    if cfg.qk_norm:
      q_BxTxKxQxE = rms_norm(q_BxTxKxQxE, layer["q_norm"], cfg.norm_eps, dtype)
      k_BxTxKxE = rms_norm(k_BxTxKxE, layer["k_norm"], cfg.norm_eps, dtype)
    q_BxTxKxQxE = apply_rope(
        q_BxTxKxQxE.reshape(b, t, h, e), pos_BxT, inv_freq
    ).reshape(b, t, k, g, e)
    k_BxTxKxE = apply_rope(k_BxTxKxE, pos_BxT, inv_freq)
    key_cache = nn.with_logical_constraint(
        _write_rows(
            key_cache, k_BxTxKxE.transpose(0, 2, 3, 1), pos_BxT[:, 0], axis=3
        ),
        KEY_AXES,
    )
    value_cache = nn.with_logical_constraint(
        _write_rows(
            value_cache,
            v_BxTxKxE.transpose(_value_order(value_layout)),
            pos_BxT[:, 0],
            axis=_len_axis(value_layout),
        ),
        VALUE_LAYOUTS[value_layout],
    )
    keys.append(key_cache)
    values.append(value_cache)
    if t == 1 and decode_kernel == "pallas":
      out_BxTxKxQxE = decode_attention.attend(
          q_BxTxKxQxE[:, 0],
          key_cache,
          value_cache,
          pos_BxT[:, 0] + 1,
          values_position_axis=_len_axis(value_layout),
          dtype=dtype,
      )[:, None]
    elif prefill_kernel != "plain":
      out_BxTxKxQxE = attention_lib.apply(
          prefill_kernel,
          q_BxTxKxQxE.reshape(b, t, h, e),
          k_BxTxKxE,
          v_BxTxKxE,
          dtype=dtype,
      ).reshape(b, t, k, g, e)
    else:
      out_BxTxKxQxE = attention(
          q_BxTxKxQxE,
          key_cache,
          value_cache,
          visible_BxTxS,
          dtype,
          values_position_axis=_len_axis(value_layout),
      )
    x_BxTxD = x_BxTxD + jnp.dot(out_BxTxKxQxE.reshape(b, t, h * e), layer["o"])
    normed = rms_norm(x_BxTxD, layer["mlp_norm"], cfg.norm_eps, dtype)
    hidden_BxTxI = nn.silu(jnp.dot(normed, layer["gate"])) * jnp.dot(
        normed, layer["up"]
    )
    x_BxTxD = nn.with_logical_constraint(
        x_BxTxD + jnp.dot(hidden_BxTxI, layer["down"]),
        ("act_batch", "act_len", "act_embed"),
    )
  x_BxTxD = rms_norm(x_BxTxD, prepared["final_norm"], cfg.norm_eps, dtype)
  logits_BxTxV = lm_head(
      cfg, x_BxTxD, prepared["head"], prepared.get("head_lo")
  )
  return logits_BxTxV, {
      "k": tuple(keys),
      "v": tuple(values),
  }
