"""One decode step's attention over the KV cache as one Pallas GPU kernel.

The GPU twin of decode_attention.py's TPU kernel, lowered through Triton.
One program per (row, kv head) walks the row's cached positions in blocks of
`block` with an online softmax and stops at the row's length, so a row's
keys and values are read once and only as far as it has written them, and
its scores stay on chip, where the plain path (`transformer.attention` at
T = 1, over `sampling/windows.py`) reads a whole window of every row and writes
float32 scores between its passes. What it changed on an H100 is in
docs/gpu.md.

Keys are read as the cache holds them, [E, S] per row and kv head (a block
is E rows of `block` consecutive positions), values as [S, E] ("SE", the
value layout off TPU, kv_cache.value_layout). The Q query heads of a kv head
are padded with zeros to `_MIN_ROWS` rows for the tensor-core products, and
the padding rows' outputs dropped.
The math is `transformer.attention`'s at T = 1: scores in float32, scaled
after the product, positions at or after a row's length masked; the
probabilities are normalised after the product with the values.

Shape letters: the package key (scalerl_jax/__init__.py), and C = block.
"""

from __future__ import annotations

import functools

import jax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu
import jax.numpy as jnp

# Positions per block of the walk. 64 positions of a 128-wide head are 16 KB
# of keys and 16 KB of values per block in bfloat16.
BLOCK = 64
# Triton's tensor-core product wants at least 16 rows: the query heads of one
# kv head are padded to this many.
_MIN_ROWS = 16


def _dot(a, b):
  # A float32 cache is multiplied in float32, not TF32: as the plain path.
  exact = a.dtype == jnp.float32
  return plgpu.dot(a, b, allow_tf32=not exact).astype(jnp.float32)


def _kernel(q_ref, k_ref, v_ref, length_ref, o_ref, *, block, scale):
  """One (row, kv head): the online softmax over its first `length` keys."""
  rows, e = q_ref.shape
  length = length_ref[()]
  q_RxE = q_ref[...]

  def body(j, carry):
    acc_RxE, m_R, l_R = carry
    pos_C = j * block + jnp.arange(block)
    live_C = pos_C < length
    k_ExC = plgpu.load(
        k_ref.at[:, pl.ds(j * block, block)], mask=live_C[None, :], other=0.0
    )
    s_RxC = _dot(q_RxE, k_ExC) * scale
    s_RxC = jnp.where(live_C[None, :], s_RxC, jnp.finfo(jnp.float32).min)
    m_new_R = jnp.maximum(m_R, s_RxC.max(axis=1))
    p_RxC = jnp.exp(s_RxC - m_new_R[:, None])
    alpha_R = jnp.exp(m_R - m_new_R)
    v_CxE = plgpu.load(
        v_ref.at[pl.ds(j * block, block), :], mask=live_C[:, None], other=0.0
    )
    pv_RxE = _dot(p_RxC.astype(v_CxE.dtype), v_CxE)
    acc_RxE = alpha_R[:, None] * acc_RxE + pv_RxE
    return acc_RxE, m_new_R, alpha_R * l_R + p_RxC.sum(axis=1)

  init = (
      jnp.zeros((rows, e), jnp.float32),
      jnp.full((rows,), jnp.finfo(jnp.float32).min, jnp.float32),
      jnp.zeros((rows,), jnp.float32),
  )
  # Every block the loop visits holds at least one live position (length >=
  # 1), so the running maximum is a real score after the first block.
  acc_RxE, _, l_R = jax.lax.fori_loop(0, pl.cdiv(length, block), body, init)
  o_ref[...] = (acc_RxE / l_R[:, None]).astype(o_ref.dtype)


def _one(
    q_QxE,
    keys_ExS,
    values_SxE,
    length,
    *,
    block,
    num_warps,
    num_stages,
    interpret,
):
  q, e = q_QxE.shape
  s = keys_ExS.shape[1]
  # The padding rows are zeros in HBM, not a masked read past the query: a
  # block's slices stay inside its array, which Pallas checks.
  rows = max(_MIN_ROWS, pl.next_power_of_2(q))
  q_RxE = jnp.pad(q_QxE, ((0, rows - q), (0, 0)))
  kernel = functools.partial(_kernel, block=block, scale=e**-0.5)
  whole = lambda shape: pl.BlockSpec(shape, lambda i: (0,) * len(shape))
  out_RxE = pl.pallas_call(
      kernel,
      grid=(1,),
      in_specs=[
          whole((rows, e)),
          whole((e, s)),
          whole((s, e)),
          pl.BlockSpec((), lambda i: ()),
      ],
      out_specs=whole((rows, e)),
      out_shape=jax.ShapeDtypeStruct((rows, e), jnp.float32),
      compiler_params=plgpu.CompilerParams(
          num_warps=num_warps, num_stages=num_stages
      ),
      interpret=interpret,
      name="scalerl_decode_attention",
  )(q_RxE, keys_ExS, values_SxE, length)
  return out_RxE[:q]


def attend(
    q_BxKxQxE: jax.Array,
    keys_BxKxExS: jax.Array,
    values_BxKxSxE: jax.Array,
    lengths_B: jax.Array,
    *,
    block: int = BLOCK,
    num_warps: int = 4,
    num_stages: int = 2,
    interpret: bool = False,
) -> jax.Array:
  """Each row's queries over its first `lengths_B` positions -> [B, K, Q, E]
  float32. Values in the "SE" layout; `q` in the cache's dtype."""
  one = functools.partial(
      _one,
      block=block,
      num_warps=num_warps,
      num_stages=num_stages,
      interpret=interpret,
  )
  over_heads = jax.vmap(one, in_axes=(0, 0, 0, None))
  return jax.vmap(over_heads)(
      q_BxKxQxE, keys_BxKxExS, values_BxKxSxE, lengths_B
  )
