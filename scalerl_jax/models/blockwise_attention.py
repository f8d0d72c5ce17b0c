"""Blockwise attention: online softmax over key blocks, flash-style backward.

Pure JAX, so it runs on any backend; neither pass holds more than
[B, H, T, block] scores. The contract is `attention.py`'s.

Shape letters: the package key (scalerl_jax/__init__.py), and R = T * Q query
rows per kv head, C key positions per block, J key blocks.
"""

from __future__ import annotations

import functools
from typing import Optional

import jax
import jax.numpy as jnp

from scalerl_jax.models import attention as attention_lib

BLOCKWISE_BLOCK = 512  # Key positions per blockwise step.
# Masked score: finite, so no inf - inf.
_NEG = -0.7 * float(jnp.finfo(jnp.float32).max)


def _key_blocks(x_BxTxKxE: jax.Array, c: int) -> jax.Array:
  """[B, T, K, E] -> [J, B, K, C, E], padded with zeros to J * C positions."""
  b, t, k, e = x_BxTxKxE.shape
  n = -(-t // c)
  x = jnp.pad(x_BxTxKxE, ((0, 0), (0, n * c - t), (0, 0), (0, 0)))
  return x.reshape(b, n, c, k, e).transpose(1, 0, 3, 2, 4)


def _block_visible(seg_BxR, q, c):
  """Per key block [B, 1, R, C] visibility; padded keys follow every query."""
  m = seg_BxR.shape[1]
  qpos_R = jnp.arange(m) // q

  def at(i, seg_BxC):
    kpos_C = i * c + jnp.arange(c)
    causal_RxC = qpos_R[:, None] >= kpos_C[None, :]
    return (causal_RxC[None] & (seg_BxR[:, :, None] == seg_BxC[:, None, :]))[
        :, None
    ]

  return at


def _scores(q_BxKxRxE, k_BxKxCxE, dtype):
  return _bmm(q_BxKxRxE, k_BxKxCxE, 3, 3, dtype) * (q_BxKxRxE.shape[-1] ** -0.5)


def _bmm(x, y, x_axis, y_axis, dtype):
  """Batched over (B, K): contracts `x_axis` of x with `y_axis` of y."""
  return jax.lax.dot_general(
      x.astype(dtype),
      y.astype(dtype),
      (((x_axis,), (y_axis,)), ((0, 1), (0, 1))),
      preferred_element_type=jnp.float32,
  )


def _blockwise_inputs(q_BxTxHxE, k_BxTxKxE, v_BxTxKxE, segment_ids_BxT, c):
  b, t, h, e = q_BxTxHxE.shape
  k = k_BxTxKxE.shape[2]
  g = h // k
  q_BxKxRxE = (
      q_BxTxHxE.reshape(b, t, k, g, e)
      .transpose(0, 2, 1, 3, 4)
      .reshape(b, k, t * g, e)
  )
  seg_BxT = (
      jnp.zeros((b, t), jnp.int32)
      if segment_ids_BxT is None
      else segment_ids_BxT.astype(jnp.int32)
  )
  n = -(-t // c)
  seg_JxBxC = (
      jnp.pad(seg_BxT, ((0, 0), (0, n * c - t)))
      .reshape(b, n, c)
      .transpose(1, 0, 2)
  )
  blocks = (
      jnp.arange(n),
      _key_blocks(k_BxTxKxE, c),
      _key_blocks(v_BxTxKxE, c),
      seg_JxBxC,
  )
  return q_BxKxRxE, jnp.repeat(seg_BxT, g, axis=1), blocks, g


def _blockwise_forward(
    q_BxTxHxE, k_BxTxKxE, v_BxTxKxE, segment_ids_BxT, dtype, c
):
  """(out [B, K, R, E] float32, log-sum-exp [B, K, R]) by online softmax."""
  q_BxKxRxE, seg_BxR, blocks, g = _blockwise_inputs(
      q_BxTxHxE, k_BxTxKxE, v_BxTxKxE, segment_ids_BxT, c
  )
  at = _block_visible(seg_BxR, g, c)

  def step(carry, block):
    max_BxKxR, sum_BxKxR, acc_BxKxRxE = carry
    i, k_BxKxCxE, v_BxKxCxE, seg_BxC = block
    vis = at(i, seg_BxC)
    s_BxKxRxC = _scores(q_BxKxRxE, k_BxKxCxE, dtype)
    new_max = jnp.maximum(
        max_BxKxR, jnp.max(jnp.where(vis, s_BxKxRxC, _NEG), axis=-1)
    )
    p_BxKxRxC = jnp.where(vis, jnp.exp(s_BxKxRxC - new_max[..., None]), 0.0)
    rescale = jnp.exp(max_BxKxR - new_max)
    acc = acc_BxKxRxE * rescale[..., None] + _bmm(
        p_BxKxRxC, v_BxKxCxE, 3, 2, dtype
    )
    return (new_max, sum_BxKxR * rescale + p_BxKxRxC.sum(-1), acc), None

  b, k, m, e = q_BxKxRxE.shape
  init = (
      jnp.full((b, k, m), _NEG),
      jnp.zeros((b, k, m)),
      jnp.zeros((b, k, m, e)),
  )
  (max_BxKxR, sum_BxKxR, acc_BxKxRxE), _ = jax.lax.scan(step, init, blocks)
  return acc_BxKxRxE / sum_BxKxR[..., None], max_BxKxR + jnp.log(sum_BxKxR)


def _to_heads(x_BxKxRxE, t):
  b, k, m, e = x_BxKxRxE.shape
  return (
      x_BxKxRxE.reshape(b, k, t, m // t, e)
      .transpose(0, 2, 1, 3, 4)
      .reshape(b, t, -1, e)
  )


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _blockwise(q_BxTxHxE, k_BxTxKxE, v_BxTxKxE, segment_ids_BxT, dtype, c):
  out_BxKxRxE, _ = _blockwise_forward(
      q_BxTxHxE, k_BxTxKxE, v_BxTxKxE, segment_ids_BxT, dtype, c
  )
  return _to_heads(out_BxKxRxE, q_BxTxHxE.shape[1]).astype(dtype)


def _blockwise_fwd(q_BxTxHxE, k_BxTxKxE, v_BxTxKxE, segment_ids_BxT, dtype, c):
  out_BxKxRxE, lse_BxKxR = _blockwise_forward(
      q_BxTxHxE, k_BxTxKxE, v_BxTxKxE, segment_ids_BxT, dtype, c
  )
  out = _to_heads(out_BxKxRxE, q_BxTxHxE.shape[1]).astype(dtype)
  return out, (
      q_BxTxHxE,
      k_BxTxKxE,
      v_BxTxKxE,
      segment_ids_BxT,
      out_BxKxRxE,
      lse_BxKxR,
  )


def _blockwise_bwd(dtype, c, residuals, dout_BxTxHxE):
  """Recomputes each key block's probabilities from the saved log-sum-exp."""
  q_BxTxHxE, k_BxTxKxE, v_BxTxKxE, segment_ids_BxT, out_BxKxRxE, lse_BxKxR = (
      residuals
  )
  b, t, h, e = q_BxTxHxE.shape
  q_BxKxRxE, seg_BxR, blocks, g = _blockwise_inputs(
      q_BxTxHxE, k_BxTxKxE, v_BxTxKxE, segment_ids_BxT, c
  )
  at = _block_visible(seg_BxR, g, c)
  k = k_BxTxKxE.shape[2]
  dout_BxKxRxE = (
      dout_BxTxHxE.astype(jnp.float32)
      .reshape(b, t, k, g, e)
      .transpose(0, 2, 1, 3, 4)
      .reshape(b, k, t * g, e)
  )
  delta_BxKxR = jnp.sum(dout_BxKxRxE * out_BxKxRxE, axis=-1)

  def step(dq_BxKxRxE, block):
    i, k_BxKxCxE, v_BxKxCxE, seg_BxC = block
    s_BxKxRxC = _scores(q_BxKxRxE, k_BxKxCxE, dtype)
    p_BxKxRxC = jnp.where(
        at(i, seg_BxC), jnp.exp(s_BxKxRxC - lse_BxKxR[..., None]), 0.0
    )
    dv_BxKxCxE = _bmm(p_BxKxRxC, dout_BxKxRxE, 2, 2, dtype)
    dp_BxKxRxC = _bmm(dout_BxKxRxE, v_BxKxCxE, 3, 3, dtype)
    ds_BxKxRxC = p_BxKxRxC * (dp_BxKxRxC - delta_BxKxR[..., None]) * (e**-0.5)
    dq = dq_BxKxRxE + _bmm(ds_BxKxRxC, k_BxKxCxE, 3, 2, dtype)
    dk_BxKxCxE = _bmm(ds_BxKxRxC, q_BxKxRxE, 2, 2, dtype)
    return dq, (dk_BxKxCxE, dv_BxKxCxE)

  dq_BxKxRxE, (dk_JxBxKxCxE, dv_JxBxKxCxE) = jax.lax.scan(
      step, jnp.zeros_like(dout_BxKxRxE), blocks
  )

  def from_blocks(x_JxBxKxCxE, like):
    n = x_JxBxKxCxE.shape[0]
    x = x_JxBxKxCxE.transpose(1, 0, 3, 2, 4).reshape(b, n * c, k, e)[:, :t]
    return x.astype(like.dtype)

  return (
      _to_heads(dq_BxKxRxE, t).astype(q_BxTxHxE.dtype),
      from_blocks(dk_JxBxKxCxE, k_BxTxKxE),
      from_blocks(dv_JxBxKxCxE, v_BxTxKxE),
      None,
  )


_blockwise.defvjp(_blockwise_fwd, _blockwise_bwd)


@attention_lib.IMPLS.register("blockwise")
def blockwise(
    q_BxTxHxE: jax.Array,
    k_BxTxKxE: jax.Array,
    v_BxTxKxE: jax.Array,
    segment_ids_BxT: Optional[jax.Array] = None,
    *,
    dtype,
    block_size: int = BLOCKWISE_BLOCK,
) -> jax.Array:
  """Online softmax over key blocks in pure JAX (any backend).

  Neither pass holds more than [B, H, T, block_size] scores.
  """
  c = min(block_size, q_BxTxHxE.shape[1])
  return _blockwise(q_BxTxHxE, k_BxTxKxE, v_BxTxKxE, segment_ids_BxT, dtype, c)
