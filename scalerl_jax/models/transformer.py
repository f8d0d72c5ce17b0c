"""Decoder-only transformer of the Llama / Qwen2 / Qwen3 family (flax linen).

Owns the training and evaluation forward pass over whole sequences, layers
scanned over a stacked `layers` axis: RMSNorm, rotary embeddings (optionally
Llama 3.1-scaled), grouped-query attention, SwiGLU, tied or untied embeddings,
Qwen2's q/k/v biases, Qwen3's q/k norms. Every parameter carries logical axis
names (`vocab`, `embed`, `mlp`, `heads`, `kv_heads`, `head_dim`, `layers`,
`norm`) and activations `act_*` names, which `scalerl_jax.sharding` maps to
the mesh. The KV-cache path (models/decode.py) shares `rms_norm`,
`apply_rope`, `attention` and `lm_head`.

Design: docs/design/models.md.

Shape letters: the package key (scalerl_jax/__init__.py), and I mlp_dim, A
heads of either kind (H or K), R = T * Q query rows per kv head.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from scalerl_jax.models import attention as attention_lib
from scalerl_jax.models.lm_head import lm_head
from scalerl_jax.models.model_config import REMAT_POLICIES
from scalerl_jax.models.model_config import ROPE_SCALINGS
from scalerl_jax.models.model_config import ModelConfig
from scalerl_jax.models.model_config import scan_layers_unroll


def _logical_init(init, names):
  return nn.with_logical_partitioning(init, names)


def rope_frequencies(cfg: ModelConfig) -> np.ndarray:
  """Inverse frequencies [E/2] of the rotary embedding, optionally scaled."""
  exponents = np.arange(0, cfg.head_dim, 2, dtype=np.float64) / cfg.head_dim
  inv_freq = 1.0 / (cfg.rope_theta**exponents)
  scaling = cfg.rope_scaling
  if scaling.type == "llama3":
    # Llama 3.1: long wavelengths are divided by `factor`, short ones kept,
    # and the band in between interpolated smoothly.
    low_wavelen = scaling.original_max_position / scaling.low_freq_factor
    high_wavelen = scaling.original_max_position / scaling.high_freq_factor
    wavelen = 2 * np.pi / inv_freq
    scaled = np.where(
        wavelen > low_wavelen, inv_freq / scaling.factor, inv_freq
    )
    smooth = (
        scaling.original_max_position / wavelen - scaling.low_freq_factor
    ) / (scaling.high_freq_factor - scaling.low_freq_factor)
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    inv_freq = np.where(medium, smoothed, scaled)
  elif scaling.type not in ROPE_SCALINGS:
    raise ValueError(f"model.rope_scaling.type: unsupported {scaling.type!r}")
  return inv_freq.astype(np.float32)


def apply_rope(
    x_BxTxAxE: jax.Array, pos_BxT: jax.Array, inv_freq: np.ndarray
) -> jax.Array:
  """Rotates pairs (i, i + E/2) of each head by position * frequency."""
  angles_BxTxE2 = (
      pos_BxT.astype(jnp.float32)[:, :, None] * inv_freq[None, None, :]
  )
  angles_BxTxE = jnp.concatenate([angles_BxTxE2, angles_BxTxE2], axis=-1)
  cos = jnp.cos(angles_BxTxE)[:, :, None, :].astype(x_BxTxAxE.dtype)
  sin = jnp.sin(angles_BxTxE)[:, :, None, :].astype(x_BxTxAxE.dtype)
  half = x_BxTxAxE.shape[-1] // 2
  rotated = jnp.concatenate(
      [-x_BxTxAxE[..., half:], x_BxTxAxE[..., :half]], axis=-1
  )
  return x_BxTxAxE * cos + rotated * sin


def rms_norm(x: jax.Array, scale: jax.Array, eps: float, dtype) -> jax.Array:
  """x / rms(x) * scale over the last axis; statistics in float32."""
  x32 = x.astype(jnp.float32)
  normed = x32 * jax.lax.rsqrt(
      jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps
  )
  return normed.astype(dtype) * scale.astype(dtype).reshape(
      (1,) * (x.ndim - 1) + (-1,)
  )


def attention(
    q_BxTxKxQxE: jax.Array,
    keys_BxKxExS: jax.Array,
    values_BxKxSxE: jax.Array,
    visible_BxTxS: jax.Array,
    dtype,
    values_position_axis: int = 2,
) -> jax.Array:
  """Grouped-query softmax attention -> [B, T, K, Q, E], scores in float32.

  Query head k * Q + q reads kv head k. Keys come as [B, K, E, S], values as
  [B, K, S, E], or [B, K, E, S] with `values_position_axis` 3: the decode
  cache's layouts (kv_cache.VALUE_LAYOUTS).
  """
  b, t, k, g, e = q_BxTxKxQxE.shape
  s = keys_BxKxExS.shape[-1]
  q_BxKxRxE = q_BxTxKxQxE.transpose(0, 2, 1, 3, 4).reshape(b, k, t * g, e)
  batch = ((0, 1), (0, 1))
  scores_BxKxRxS = jax.lax.dot_general(
      q_BxKxRxE,
      keys_BxKxExS.astype(dtype),
      (((3,), (2,)), batch),
      preferred_element_type=jnp.float32,
  ) * (e**-0.5)
  visible_Bx1xTx1xS = visible_BxTxS[:, None, :, None, :]
  scores_BxKxTxQxS = jnp.where(
      visible_Bx1xTx1xS,
      scores_BxKxRxS.reshape(b, k, t, g, s),
      jnp.finfo(jnp.float32).min,
  )
  probs_BxKxRxS = (
      jax.nn.softmax(scores_BxKxTxQxS, axis=-1)
      .astype(dtype)
      .reshape(b, k, t * g, s)
  )
  out_BxKxRxE = jax.lax.dot_general(
      probs_BxKxRxS,
      values_BxKxSxE.astype(dtype),
      (((3,), (values_position_axis,)), batch),
  )
  return out_BxKxRxE.reshape(b, k, t, g, e).transpose(0, 2, 1, 3, 4)


@attention_lib.IMPLS.register("plain")
def plain_attention(
    q_BxTxHxE: jax.Array,
    k_BxTxKxE: jax.Array,
    v_BxTxKxE: jax.Array,
    segment_ids_BxT: Optional[jax.Array] = None,
    *,
    dtype,
) -> jax.Array:
  """`attention` behind models/attention.py's interface: [B, T, T] scores."""
  b, t, h, e = q_BxTxHxE.shape
  k = k_BxTxKxE.shape[2]
  out_BxTxKxQxE = attention(
      q_BxTxHxE.reshape(b, t, k, h // k, e),
      k_BxTxKxE.transpose(0, 2, 3, 1),
      v_BxTxKxE.transpose(0, 2, 1, 3),
      attention_lib.visible(segment_ids_BxT, b, t),
      dtype,
  )
  return out_BxTxKxQxE.reshape(b, t, h, e)


class RMSNorm(nn.Module):
  eps: float
  dtype: Any
  param_dtype: Any
  axis_name: str = "norm"

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    scale = self.param(
        "scale",
        _logical_init(nn.initializers.ones, (self.axis_name,)),
        (x.shape[-1],),
        self.param_dtype,
    )
    return rms_norm(x, scale, self.eps, self.dtype)


class Dense(nn.Module):
  """x [..., *in_shape] -> [..., *out_shape]; kernel kept multi-axis, named."""

  in_shape: tuple[int, ...]
  out_shape: tuple[int, ...]
  names: tuple[str, ...]  # Logical names of the kernel's in + out axes.
  cfg: ModelConfig
  use_bias: bool = False

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    n_in, n_out = len(self.in_shape), len(self.out_shape)
    init = nn.initializers.lecun_normal(
        in_axis=tuple(range(n_in)), out_axis=tuple(range(n_in, n_in + n_out))
    )
    kernel = self.param(
        "kernel",
        _logical_init(init, self.names),
        self.in_shape + self.out_shape,
        self.cfg.pdtype,
    )
    # One 2-D matmul: contracting several axes at once made XLA:CPU transpose
    # the activations first (docs/design/models.md). The reshapes are free.
    lead = x.shape[: x.ndim - n_in]
    y = jnp.dot(
        x.astype(self.cfg.dtype).reshape(-1, math.prod(self.in_shape)),
        kernel.astype(self.cfg.dtype).reshape(math.prod(self.in_shape), -1),
    )
    y = y.reshape(lead + self.out_shape)
    if self.use_bias:
      bias = self.param(
          "bias",
          _logical_init(nn.initializers.zeros, self.names[n_in:]),
          self.out_shape,
          self.cfg.pdtype,
      )
      y = y + bias.astype(self.cfg.dtype).reshape(
          (1,) * (y.ndim - n_out) + self.out_shape
      )
    return y


class Attention(nn.Module):
  """Causal grouped-query self-attention with rotary embeddings."""

  cfg: ModelConfig

  @nn.compact
  def __call__(self, x_BxTxD, pos_BxT):
    cfg = self.cfg
    h, k, e = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    d = (cfg.embed_dim,)
    q = Dense(
        d, (h, e), ("embed", "heads", "head_dim"), cfg, cfg.qkv_bias, name="q"
    )(x_BxTxD)
    kk = Dense(
        d,
        (k, e),
        ("embed", "kv_heads", "head_dim"),
        cfg,
        cfg.qkv_bias,
        name="k",
    )(x_BxTxD)
    v = Dense(
        d,
        (k, e),
        ("embed", "kv_heads", "head_dim"),
        cfg,
        cfg.qkv_bias,
        name="v",
    )(x_BxTxD)
    if cfg.qk_norm:
      q = RMSNorm(
          cfg.norm_eps, cfg.dtype, cfg.pdtype, "head_dim", name="q_norm"
      )(q)
      kk = RMSNorm(
          cfg.norm_eps, cfg.dtype, cfg.pdtype, "head_dim", name="k_norm"
      )(kk)
    inv_freq = rope_frequencies(cfg)
    q_BxTxHxE = nn.with_logical_constraint(
        apply_rope(q, pos_BxT, inv_freq),
        ("act_batch", "act_len", "act_heads", "head_dim"),
    )
    k_BxTxKxE = apply_rope(kk, pos_BxT, inv_freq)
    # Causal in token order (positions are 0..T-1 in every caller).
    out_BxTxHxE = nn.with_logical_constraint(
        attention_lib.apply(
            cfg.attention, q_BxTxHxE, k_BxTxKxE, v, dtype=cfg.dtype
        ),
        ("act_batch", "act_len", "act_heads", "head_dim"),
    )
    return Dense(
        (h, e), (cfg.embed_dim,), ("heads", "head_dim", "embed"), cfg, name="o"
    )(out_BxTxHxE)


class Mlp(nn.Module):
  """SwiGLU: down(silu(gate(x)) * up(x))."""

  cfg: ModelConfig

  @nn.compact
  def __call__(self, x_BxTxD):
    cfg = self.cfg
    d, f = (cfg.embed_dim,), (cfg.mlp_dim,)
    gate = Dense(d, f, ("embed", "mlp"), cfg, name="gate")(x_BxTxD)
    up = Dense(d, f, ("embed", "mlp"), cfg, name="up")(x_BxTxD)
    hidden_BxTxI = nn.with_logical_constraint(
        nn.silu(gate) * up, ("act_batch", "act_len", "act_mlp")
    )
    return Dense(f, d, ("mlp", "embed"), cfg, name="down")(hidden_BxTxI)


class Block(nn.Module):
  """Pre-norm decoder block; scanned over layers by `Transformer`."""

  cfg: ModelConfig

  @nn.compact
  def __call__(self, x_BxTxD, pos_BxT):
    cfg = self.cfg
    normed = RMSNorm(cfg.norm_eps, cfg.dtype, cfg.pdtype, name="attn_norm")(
        x_BxTxD
    )
    x_BxTxD = x_BxTxD + Attention(cfg, name="attn")(normed, pos_BxT)
    normed = RMSNorm(cfg.norm_eps, cfg.dtype, cfg.pdtype, name="mlp_norm")(
        x_BxTxD
    )
    x_BxTxD = x_BxTxD + Mlp(cfg, name="mlp")(normed)
    x_BxTxD = nn.with_logical_constraint(
        x_BxTxD, ("act_batch", "act_len", "act_embed")
    )
    return x_BxTxD, None


class Transformer(nn.Module):
  """The policy network: tokens (+ positions) -> logits."""

  cfg: ModelConfig

  @nn.compact
  def __call__(
      self,
      tokens_BxT: jax.Array,
      pos_BxT: Optional[jax.Array] = None,
      return_hidden: bool = False,
  ) -> jax.Array:
    """Logits [B, T, V] (float32 when `fp32_lm_head`), causal in token order.

    `pos_BxT` sets only the rotary phase (default 0..T-1). `return_hidden`
    returns the last block's output [B, T, D] instead, for `output_logits` to
    finish on any slice of it.
    """
    cfg = self.cfg
    if pos_BxT is None:
      pos_BxT = jnp.broadcast_to(
          jnp.arange(tokens_BxT.shape[1]), tokens_BxT.shape
      )
    embedding_VxD = self.param(
        "embedding",
        _logical_init(nn.initializers.normal(0.02), ("vocab", "embed")),
        (cfg.vocab_size, cfg.embed_dim),
        cfg.pdtype,
    )
    x_BxTxD = jnp.take(embedding_VxD, tokens_BxT, axis=0).astype(cfg.dtype)
    x_BxTxD = nn.with_logical_constraint(
        x_BxTxD, ("act_batch", "act_len", "act_embed")
    )

    # A loop over layers on accelerators with remat, else unrolled
    # (`scan_layers_unroll`); the parameters stay stacked either way.
    unroll = scan_layers_unroll(cfg, attention_lib.platform())
    # prevent_cse where unrolled: nothing else then stops XLA from merging
    # remat's recomputation with the forward pass, which keeps every layer's
    # activations (docs/design/models.md). A loop cannot merge them.
    block = (
        nn.remat(
            Block,
            prevent_cse=unroll > 1,
            policy=REMAT_POLICIES[cfg.remat_policy],
        )
        if cfg.remat
        else Block
    )
    blocks = nn.scan(
        block,
        variable_axes={"params": 0},
        split_rngs={"params": True},
        in_axes=nn.broadcast,
        length=cfg.num_layers,
        unroll=unroll,
        metadata_params={nn.PARTITION_NAME: "layers"},
    )
    x_BxTxD, _ = blocks(cfg, name="layers")(x_BxTxD, pos_BxT)
    if return_hidden:
      return x_BxTxD
    x_BxTxD = RMSNorm(cfg.norm_eps, cfg.dtype, cfg.pdtype, name="final_norm")(
        x_BxTxD
    )

    if cfg.tie_embeddings:
      head_DxV = embedding_VxD.T
    else:
      head_DxV = self.param(
          "lm_head",
          _logical_init(nn.initializers.lecun_normal(), ("embed", "vocab")),
          (cfg.embed_dim, cfg.vocab_size),
          cfg.pdtype,
      )
    return lm_head(cfg, x_BxTxD, head_DxV)


def output_logits(
    cfg: ModelConfig, params: Any, x_BxTxD: jax.Array
) -> jax.Array:
  """`Transformer`'s logits from its `return_hidden` output (or a slice)."""
  head_DxV = params["embedding"].T if cfg.tie_embeddings else params["lm_head"]
  x_BxTxD = rms_norm(
      x_BxTxD, params["final_norm"]["scale"], cfg.norm_eps, cfg.dtype
  )
  return lm_head(cfg, x_BxTxD, head_DxV)
