"""KV-cache inference path of the policy transformer: prefill and decode.

The same network and math as `transformer.Transformer`, on weights that
`prepare` regroups once per parameter version: per layer, q, k and v as one
kernel [D, K x (Q + 2) x E], gate, up [D, I] and down [I, D], o [H * E, D],
all in the compute dtype. Every kernel is a matrix whose contracting
dimension is major, the layout each backend's matmul reads in place: as
[D, K, Q + 2, E] and [D, 2, I] the TPU compiler copied them into another
layout, hoisted out of the decode loop (docs/tpu.md, "Resident sampler
weights"), and XLA:CPU transposed [H, E, D] on every step.

The cache (models/kv_cache.py) is one buffer per layer, keys [B, K, E, S]
and values [B, K, S, E] or [B, K, E, S]. `forward` writes T tokens per row
at explicit positions and attends to every cached position not after the
query's, so each row (sampler slot) can be at
its own position: prefill is T = prompt length on a fresh cache (through
`config.model.attention`), decode T = 1.

Design: docs/design/models.md.

Shape letters: the package key (scalerl_jax/__init__.py), and I mlp_dim,
J = Q + 2 (the q, k and v of one kv head), F = K x J x E.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from scalerl_jax.models import attention as attention_lib
from scalerl_jax.models import decode_attention
from scalerl_jax.models import kv_cache
from scalerl_jax.models.lm_head import head_algorithm
from scalerl_jax.models.lm_head import lm_head
from scalerl_jax.models.lm_head import split_bf16
from scalerl_jax.models.model_config import ModelConfig
from scalerl_jax.models.transformer import apply_rope
from scalerl_jax.models.transformer import attention
from scalerl_jax.models.transformer import rms_norm
from scalerl_jax.models.transformer import rope_frequencies

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


def cast_for_prepare(cfg: ModelConfig, params: Any) -> Any:
  """`params` with every weight `prepare` reads only cast to `cfg.dtype`
  cast so already: `prepare` then returns the same values, bit for bit.

  Those are the layers' kernels and biases, the embedding (unless it is the
  FP32 head too) and an untied head not kept in float32. The norm scales and
  the FP32 head (float32 at "highest", split from float32 for "bf16_3x") keep
  their dtype. A bfloat16 copy sent to the sampler's devices so carries
  about half the bytes (mesh.transfer_dtype).
  """
  fp32_head = cfg.fp32_lm_head

  def cast_first(path, w):
    names = [k.key for k in path]
    if names[0] == "layers":
      return names[1] in ("attn", "mlp") and names[-1] in ("kernel", "bias")
    if names[0] == "embedding":
      return not (cfg.tie_embeddings and fp32_head)
    return names[0] == "lm_head" and not fp32_head

  return jax.tree_util.tree_map_with_path(
      lambda path, w: w.astype(cfg.dtype) if cast_first(path, w) else w,
      params,
  )


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


class _Call(NamedTuple):
  """What every layer of one `forward` call shares (`forward`'s arguments)."""

  pos_BxT: jax.Array
  inv_freq: jax.Array  # `rope_frequencies`.
  visible_BxTxS: jax.Array  # The cache positions each token attends to.
  value_layout: str
  decode_kernel: str
  prefill_kernel: str  # Over a fresh cache; "plain": none.
  keep_B: Optional[jax.Array]


def forward(
    cfg: ModelConfig,
    prepared: dict[str, Any],
    tokens_BxT: jax.Array,
    pos_BxT: jax.Array,
    cache: kv_cache.Cache,
    value_layout: str = "SE",
    decode_kernel: str = "plain",
    keep_B: Optional[jax.Array] = None,
) -> tuple[jax.Array, kv_cache.Cache]:
  """Writes T tokens per row into the cache; returns their next-token logits.

  Rows where `keep_B` is True leave the cache as it is (None: every row
  writes).

  A decode step (T = 1) attends through `decode_kernel`, "plain" or
  "pallas" (`decode_attention.choose`; "pallas" needs a cache length it
  tiles).

  `pos_BxT` is consecutive within a row and below S; a row whose tokens would
  end past the cache writes them at its last positions instead (the sampler
  decodes finished slots, never read again, in windows shorter than they
  are). Cache entries after a row's tokens are never read. Returns logits
  [B, T, V] (float32 when `fp32_lm_head`) and the new cache.
  """
  dtype, h, e = cfg.dtype, cfg.num_heads, cfg.head_dim
  (b, t), s = tokens_BxT.shape, kv_cache.cache_length(cache)
  # A prefill of a fresh cache (T consecutive positions below S = T are
  # 0..T-1) attends over its own tokens with the configured kernel; plain
  # stays on the cache path (`_attend`), the same math.
  prefill_kernel = (
      attention_lib.resolve(cfg.attention, t, dtype) if t == s > 1 else "plain"
  )
  call = _Call(
      pos_BxT,
      rope_frequencies(cfg),
      jnp.arange(s)[None, None, :] <= pos_BxT[:, :, None],
      value_layout,
      decode_kernel,
      prefill_kernel,
      keep_B,
  )
  x_BxTxD = jnp.take(prepared["embedding"], tokens_BxT, axis=0).astype(dtype)
  keys, values = [], []
  for layer, key_cache, value_cache in zip(
      prepared["layers"], cache["k"], cache["v"]
  ):
    q_BxTxKxQxE, k_BxTxKxE, v_BxTxKxE = _project_qkv(cfg, call, layer, x_BxTxD)
    key_cache, value_cache = _write_cache(
        call, key_cache, value_cache, k_BxTxKxE, v_BxTxKxE
    )
    keys.append(key_cache)
    values.append(value_cache)
    out_BxTxKxQxE = _attend(
        cfg, call, q_BxTxKxQxE, k_BxTxKxE, v_BxTxKxE, key_cache, value_cache
    )
    x_BxTxD = x_BxTxD + jnp.dot(out_BxTxKxQxE.reshape(b, t, h * e), layer["o"])
    x_BxTxD = _mlp(cfg, layer, x_BxTxD)
  x_BxTxD = rms_norm(x_BxTxD, prepared["final_norm"], cfg.norm_eps, dtype)
  logits_BxTxV = lm_head(
      cfg, x_BxTxD, prepared["head"], prepared.get("head_lo")
  )
  return logits_BxTxV, {"k": tuple(keys), "v": tuple(values)}


def _project_qkv(
    cfg: ModelConfig,
    call: _Call,
    layer: dict[str, jax.Array],
    x_BxTxD: jax.Array,
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """A layer's q [B, T, K, Q, E], k and v [B, T, K, E], normed and rotated."""
  dtype, eps = cfg.dtype, cfg.norm_eps
  h, k, e = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
  g = h // k
  b, t, _ = x_BxTxD.shape
  normed = rms_norm(x_BxTxD, layer["attn_norm"], eps, dtype)
  qkv_BxTxF = jnp.dot(normed, layer["qkv"])
  if cfg.qkv_bias:
    qkv_BxTxF = qkv_BxTxF + layer["qkv_bias"][None, None]
  qkv_BxTxKxJxE = qkv_BxTxF.reshape(b, t, k, g + 2, e)
  q_BxTxKxQxE = qkv_BxTxKxJxE[:, :, :, :g]
  k_BxTxKxE = qkv_BxTxKxJxE[:, :, :, g]
  v_BxTxKxE = qkv_BxTxKxJxE[:, :, :, g + 1]
  if cfg.qk_norm:
    q_BxTxKxQxE = rms_norm(q_BxTxKxQxE, layer["q_norm"], eps, dtype)
    k_BxTxKxE = rms_norm(k_BxTxKxE, layer["k_norm"], eps, dtype)
  q_BxTxKxQxE = apply_rope(
      q_BxTxKxQxE.reshape(b, t, h, e), call.pos_BxT, call.inv_freq
  ).reshape(b, t, k, g, e)
  k_BxTxKxE = apply_rope(k_BxTxKxE, call.pos_BxT, call.inv_freq)
  return q_BxTxKxQxE, k_BxTxKxE, v_BxTxKxE


def _write_cache(
    call: _Call,
    key_cache: jax.Array,
    value_cache: jax.Array,
    k_BxTxKxE: jax.Array,
    v_BxTxKxE: jax.Array,
) -> tuple[jax.Array, jax.Array]:
  """A layer's caches with each row's T new keys and values (not keep_B's)."""
  key_cache = nn.with_logical_constraint(
      kv_cache.write_rows(
          key_cache,
          k_BxTxKxE.transpose(0, 2, 3, 1),
          call.pos_BxT[:, 0],
          axis=3,
          keep_B=call.keep_B,
      ),
      kv_cache.KEY_AXES,
  )
  value_cache = nn.with_logical_constraint(
      kv_cache.write_rows(
          value_cache,
          v_BxTxKxE.transpose(kv_cache.value_order(call.value_layout)),
          call.pos_BxT[:, 0],
          axis=kv_cache.len_axis(call.value_layout),
          keep_B=call.keep_B,
      ),
      kv_cache.VALUE_LAYOUTS[call.value_layout],
  )
  return key_cache, value_cache


def _attend(
    cfg: ModelConfig,
    call: _Call,
    q_BxTxKxQxE: jax.Array,
    k_BxTxKxE: jax.Array,
    v_BxTxKxE: jax.Array,
    key_cache: jax.Array,
    value_cache: jax.Array,
) -> jax.Array:
  """A layer's attention output [B, T, K, Q, E], through `call`'s kernel."""
  dtype, values_axis = cfg.dtype, kv_cache.len_axis(call.value_layout)
  b, t, k, g, e = q_BxTxKxQxE.shape
  if t == 1 and call.decode_kernel == "pallas":
    return decode_attention.attend(
        q_BxTxKxQxE[:, 0],
        key_cache,
        value_cache,
        call.pos_BxT[:, 0] + 1,
        values_position_axis=values_axis,
        dtype=dtype,
    )[:, None]
  if call.prefill_kernel != "plain":
    return attention_lib.apply(
        call.prefill_kernel,
        q_BxTxKxQxE.reshape(b, t, k * g, e),
        k_BxTxKxE,
        v_BxTxKxE,
        dtype=dtype,
    ).reshape(b, t, k, g, e)
  return attention(
      q_BxTxKxQxE,
      key_cache,
      value_cache,
      call.visible_BxTxS,
      dtype,
      values_position_axis=values_axis,
  )


def _mlp(
    cfg: ModelConfig, layer: dict[str, jax.Array], x_BxTxD: jax.Array
) -> jax.Array:
  """`x_BxTxD` plus one layer's MLP of it (the residual stream after it)."""
  normed = rms_norm(x_BxTxD, layer["mlp_norm"], cfg.norm_eps, cfg.dtype)
  gate_BxTxI = nn.silu(jnp.dot(normed, layer["gate"]))
  hidden_BxTxI = gate_BxTxI * jnp.dot(normed, layer["up"])
  return nn.with_logical_constraint(
      x_BxTxD + jnp.dot(hidden_BxTxI, layer["down"]),
      ("act_batch", "act_len", "act_embed"),
  )
