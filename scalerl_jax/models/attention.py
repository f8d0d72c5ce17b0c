"""Causal self-attention for training and prefill, chosen by name.

`config.model.attention` names a registered implementation (`blockwise` and
`splash` in their own modules, `cudnn` here, `plain` beside its math in
models/transformer.py), or `auto`: `pick` by platform.
Every implementation takes q [B, T, H, E], k and v [B, T, K, E] and returns
[B, T, H, E], query head k * Q + q reading kv head k. Key j is visible to
query i iff j <= i (token order) and, given `segment_ids_BxT`, both carry the
same id. Scores and softmax statistics are float32, matmul inputs `dtype`.
The KV-cache decode step keeps its own path (models/decode.py).

Design: docs/design/attention.md.
"""

from __future__ import annotations

import functools
import math
from typing import Callable, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from scalerl_jax import registry
from scalerl_jax import sharding

AttentionFn = Callable[..., jax.Array]

AUTO = "auto"
# auto on CPU: plain below this many positions, blockwise from here on.
LONG_SEQ_LEN = 2048

# The implementations `config.model.attention` names, each registered with
# `@IMPLS.register(name)`; `IMPLS.names()` (auto first) are the field's values.
IMPLS: registry.Registry[AttentionFn] = registry.Registry(
    "model.attention", reserved=(AUTO,)
)


def pick(platform: str, seq_len: int, dtype) -> str:
  """What `auto` means on `platform` ('tpu', 'gpu', 'cuda', 'cpu', ...)."""
  if platform == "tpu":
    return "splash"
  if platform in ("gpu", "cuda") and jnp.dtype(dtype).itemsize == 2:
    return "cudnn"  # cuDNN's flash attention takes 16-bit inputs only.
  return "plain" if seq_len < LONG_SEQ_LEN else "blockwise"


def platform() -> str:
  """The platform of the mesh traced under, else JAX's default backend.

  A mesh of topology devices says 'tpu' on any host (AOT compiles).
  """
  device = jax.sharding.get_abstract_mesh().abstract_device
  return device.platform if device is not None else jax.default_backend()


def resolve(name: str, seq_len: int, dtype) -> str:
  """`name`, with `auto` replaced by `pick` for the current platform."""
  return pick(platform(), seq_len, dtype) if name == AUTO else name


def apply(
    name: str,
    q_BxTxHxE: jax.Array,
    k_BxTxKxE: jax.Array,
    v_BxTxKxE: jax.Array,
    segment_ids_BxT: Optional[jax.Array] = None,
    *,
    dtype,
) -> jax.Array:
  """Causal attention by implementation `name` (a value of `IMPLS.names()`).

  q and k come with the rotary embedding applied; `segment_ids_BxT` None
  means one segment. Raises ValueError for an unknown name.
  """
  impl = resolve(name, q_BxTxHxE.shape[1], dtype)
  return IMPLS.get(impl)(
      q_BxTxHxE, k_BxTxKxE, v_BxTxKxE, segment_ids_BxT, dtype=dtype
  )


def visible(segment_ids_BxT: Optional[jax.Array], b: int, t: int) -> jax.Array:
  """[B, T, T] bool: key j visible to query i (causal, same segment)."""
  causal_TxT = jnp.tril(jnp.ones((t, t), bool))
  if segment_ids_BxT is None:
    return jnp.broadcast_to(causal_TxT, (b, t, t))
  return causal_TxT[None] & (
      segment_ids_BxT[:, :, None] == segment_ids_BxT[:, None, :]
  )


def split_axes(mesh, name: str, size: int):
  """The mesh axes the active rules map logical `name` to, for a shard_map
  spec of a dimension of `size`; None where they do not divide it."""
  # One name per call: flax maps a mesh axis once.
  spec = nn.logical_to_mesh_axes((name,))[0]
  ways = math.prod(mesh.shape[a] for a in sharding.axes_of(spec))
  return spec if size % ways == 0 else None


# --- cudnn: jax.nn.dot_product_attention on GPU ------------------------------

# Lengths are padded to a multiple of this for cuDNN.
CUDNN_LEN_MULTIPLE = 64


def _dot_product_attention(
    q_BxTxHxE, k_BxTxKxE, v_BxTxKxE, segment_ids_BxT, *, dtype, implementation
):
  if segment_ids_BxT is not None:
    raise ValueError(
        "model.attention='cudnn' takes no segment ids (right padding needs none)"
    )
  # cuDNN's flash attention refuses some lengths in training (JAX 0.11.2 on
  # an H200: "Unsupported sequence length Q 1279, KV 1279"). Causal attention
  # lets T be padded at the end: no real query sees a key past itself.
  t = q_BxTxHxE.shape[1]
  pad = [(0, 0), (0, -t % CUDNN_LEN_MULTIPLE), (0, 0), (0, 0)]
  out = jax.nn.dot_product_attention(
      *(
          jnp.pad(x.astype(dtype), pad)
          for x in (q_BxTxHxE, k_BxTxKxE, v_BxTxKxE)
      ),
      is_causal=True,
      implementation=implementation,
  )
  return out[:, :t]


IMPLS.register(
    "cudnn", functools.partial(_dot_product_attention, implementation="cudnn")
)
