"""One decode step's attention over the KV cache as one Pallas TPU kernel,
and the choice between it, its GPU twin (decode_attention_gpu.py) and plain.

`transformer.attention` with T = 1 writes float32 scores [B, K, Q, S] to HBM
and passes over them several times (mask, max, exp, sum, normalise), traffic
that grows with the query heads per kv head (docs/tpu.md counts it against
the cache read at the paper's 16k positions). This kernel streams each row's
keys and values through on-chip memory in blocks of `BLOCK` positions with
an online softmax, so the scores never leave the chip. It reads a row's
blocks only up to its length: a block past it repeats the last block's
index, and Pallas skips the copy.

The math is `transformer.attention`'s at T = 1: scores in float32, scaled
after the product, positions after a row's own masked. The probabilities are
normalised after the product with the values, not before, so bfloat16 results
differ in rounding. Under a mesh it runs in shard_map over the cache's batch
and kv-head axes. Off TPU it runs in Pallas' interpreter (tests).

Design: docs/design/models.md.

Shape letters: the package key (scalerl_jax/__init__.py), and C = BLOCK.
"""

from __future__ import annotations

import functools
from typing import Optional

import jax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from scalerl_jax.models import attention as attention_lib
from scalerl_jax.models import decode_attention_gpu

# Positions per block, largest first: whole 128-lane tiles of keys (and of
# "ES" values); 512 keeps a block's copy large against its fixed cost.
BLOCKS = (512, 256, 128)
# Decode attention (`sampling.decode_attention`): "plain" is
# `transformer.attention`, "pallas" this kernel, "auto" picks (`choose`).
KERNELS = ("auto", "plain", "pallas")


def block_for(cache_len: int) -> Optional[int]:
  """Positions per block for a cache of `cache_len`; None if none tiles it."""
  if cache_len <= BLOCKS[0]:
    return cache_len
  return next((c for c in BLOCKS if cache_len % c == 0), None)


def choose(name: str, platform: str, cache_len: int) -> str:
  """The kernel that runs for `name` (one of KERNELS): "auto" is "pallas" on
  GPU, and on TPU where a block tiles the cache, else "plain". Raises
  ValueError for "pallas" on a TPU cache no block tiles."""
  if name not in KERNELS:
    raise ValueError(
        f"sampling.decode_attention: {name!r} is not one of {KERNELS}"
    )
  # The GPU kernel masks its last block: any length runs.
  tiled = platform == "gpu" or block_for(cache_len) is not None
  if name == "pallas" and not tiled:
    raise ValueError(
        f"sampling.decode_attention=pallas: the cache's {cache_len} positions "
        f"(max_prompt_len + max_new_tokens) are no multiple of {BLOCKS[-1]}"
    )
  if name == "auto":
    return "pallas" if platform in ("tpu", "gpu") and tiled else "plain"
  return name


def _kernel(
    lengths_ref,
    q_ref,
    k_ref,
    v_ref,
    o_ref,
    m_ref,
    l_ref,
    acc_ref,
    *,
    block,
    scale,
    values_position_axis,
):
  """One (row, kv head, block) step of the online softmax."""
  b, j = pl.program_id(0), pl.program_id(2)
  length = lengths_ref[b]

  @pl.when(j == 0)
  def _():
    m_ref[...] = jnp.full(m_ref.shape, jnp.finfo(jnp.float32).min, jnp.float32)
    l_ref[...] = jnp.zeros(l_ref.shape, jnp.float32)
    acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

  @pl.when(j * block < length)
  def _():
    q_QxE, k_ExC = q_ref[...], k_ref[...]
    s_QxC = (
        jax.lax.dot_general(
            q_QxE,
            k_ExC,
            (((1,), (0,)), ((), ())),
            preferred_element_type=jnp.float32,
        )
        * scale
    )
    pos_QxC = j * block + jax.lax.broadcasted_iota(jnp.int32, s_QxC.shape, 1)
    s_QxC = jnp.where(pos_QxC < length, s_QxC, jnp.finfo(jnp.float32).min)
    m_prev_Qx1 = m_ref[...]
    m_new_Qx1 = jnp.maximum(m_prev_Qx1, s_QxC.max(axis=1, keepdims=True))
    p_QxC = jnp.exp(s_QxC - m_new_Qx1)
    alpha_Qx1 = jnp.exp(m_prev_Qx1 - m_new_Qx1)
    l_ref[...] = alpha_Qx1 * l_ref[...] + p_QxC.sum(axis=1, keepdims=True)
    v = v_ref[...]  # [C, E] or [E, C]: the block of [B, K, ...] less B, K.
    pv_QxE = jax.lax.dot_general(
        p_QxC.astype(v.dtype),
        v,
        (((1,), (values_position_axis - 2,)), ((), ())),
        preferred_element_type=jnp.float32,
    )
    acc_ref[...] = alpha_Qx1 * acc_ref[...] + pv_QxE
    m_ref[...] = m_new_Qx1

  @pl.when(j == pl.num_programs(2) - 1)
  def _():
    o_ref[...] = (acc_ref[...] / l_ref[...]).astype(o_ref.dtype)


def _local(
    q_BxKxQxE,
    keys_BxKxExS,
    values,
    lengths_B,
    *,
    values_position_axis,
    interpret,
):
  """The kernel on one device's rows and kv heads."""
  b, k, q, e = q_BxKxQxE.shape
  s = keys_BxKxExS.shape[-1]
  block = block_for(s)
  if block is None:
    raise ValueError(f"decode attention: no block tiles a cache of {s}")

  def last(bi, j, lengths):  # The row's last block that holds a position.
    return jnp.minimum(j, (lengths[bi] - 1) // block)

  squeeze = pl.Squeezed()
  q_spec = pl.BlockSpec(
      (squeeze, squeeze, q, e), lambda bi, ki, j, n: (bi, ki, 0, 0)
  )
  k_spec = pl.BlockSpec(
      (squeeze, squeeze, e, block),
      lambda bi, ki, j, n: (bi, ki, 0, last(bi, j, n)),
  )
  if values_position_axis == 3:  # [B, K, E, S], as the keys.
    v_spec = k_spec
  else:
    v_spec = pl.BlockSpec(
        (squeeze, squeeze, block, e),
        lambda bi, ki, j, n: (bi, ki, last(bi, j, n), 0),
    )
  kernel = functools.partial(
      _kernel,
      block=block,
      scale=e**-0.5,
      values_position_axis=values_position_axis,
  )
  return pl.pallas_call(
      kernel,
      grid_spec=pltpu.PrefetchScalarGridSpec(
          num_scalar_prefetch=1,
          grid=(b, k, s // block),
          in_specs=[q_spec, k_spec, v_spec],
          out_specs=q_spec,
          scratch_shapes=[
              pltpu.VMEM((q, 1), jnp.float32),
              pltpu.VMEM((q, 1), jnp.float32),
              pltpu.VMEM((q, e), jnp.float32),
          ],
      ),
      out_shape=jax.ShapeDtypeStruct(q_BxKxQxE.shape, jnp.float32),
      compiler_params=pltpu.CompilerParams(
          dimension_semantics=("parallel", "parallel", "arbitrary")
      ),
      interpret=interpret,
  )(lengths_B, q_BxKxQxE, keys_BxKxExS, values)


def attend(
    q_BxKxQxE: jax.Array,
    keys_BxKxExS: jax.Array,
    values: jax.Array,
    lengths_B: jax.Array,
    *,
    values_position_axis: int,
    dtype,
    platform: Optional[str] = None,
    interpret: Optional[bool] = None,
) -> jax.Array:
  """Each row's queries over its first `lengths_B` cached positions.

  `values` are [B, K, S, E] (`values_position_axis` 2) or [B, K, E, S] (3):
  the cache's layouts (kv_cache.VALUE_LAYOUTS), as `transformer.attention`
  takes them. Returns [B, K, Q, E] in `dtype`. `platform` picks the kernel:
  "gpu" the Triton one (values [B, K, S, E] only), else the TPU one; None is
  the platform traced for. `interpret`: None means off that platform only
  (CPU runs either kernel in Pallas' interpreter).
  """
  traced = attention_lib.platform()
  gpu = (platform or traced) == "gpu"
  if interpret is None:
    interpret = traced != ("gpu" if gpu else "tpu")
  if gpu:
    if values_position_axis != 2:
      raise ValueError("the GPU decode kernel reads values as [B, K, S, E]")
    body = functools.partial(decode_attention_gpu.attend, interpret=interpret)
  else:
    body = functools.partial(
        _local, values_position_axis=values_position_axis, interpret=interpret
    )
  args = (
      q_BxKxQxE.astype(keys_BxKxExS.dtype),
      keys_BxKxExS,
      values,
      lengths_B.astype(jnp.int32),
  )
  mesh = jax.sharding.get_abstract_mesh()
  if not mesh.empty:
    b, k = q_BxKxQxE.shape[:2]
    batch = attention_lib.split_axes(mesh, "act_batch", b)
    heads = attention_lib.split_axes(mesh, "act_kv_heads", k)
    spec = PartitionSpec(batch, heads, None, None)
    body = jax.shard_map(
        body,
        mesh=mesh,
        in_specs=(spec, spec, spec, PartitionSpec(batch)),
        out_specs=spec,
        check_vma=False,
    )
  return body(*args).astype(dtype)
