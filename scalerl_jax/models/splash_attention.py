"""Splash attention: Pallas' TPU kernel under shard_map.

Off TPU it runs in Pallas' interpreter (tests). The contract is
`attention.py`'s.
"""

from __future__ import annotations

import functools
from typing import Optional

import jax
from jax.experimental.pallas.ops.tpu import splash_attention as sa
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from scalerl_jax.models import attention as attention_lib

SPLASH_BLOCK = 512  # Splash's q and kv tile; sequences are padded to it.


def _mesh_axes(mesh, b: int, k: int):
  """(batch axes, head axes) of `mesh` for splash's shard_map, from the rules.

  Heads are split only where query and kv heads share their mesh axes; a
  dimension its axes do not divide is not split.
  """
  heads = attention_lib.split_axes(mesh, "act_heads", k)
  return (
      attention_lib.split_axes(mesh, "act_batch", b),
      heads
      if heads == attention_lib.split_axes(mesh, "act_kv_heads", k)
      else None,
  )


def _splash_local(
    q_BxTxHxE, k_BxTxKxE, v_BxTxKxE, segment_ids_BxT, *, block, interpret
):
  """The splash kernel on one device's rows and heads (T a block multiple)."""
  _, t, h, e = q_BxTxHxE.shape
  k = k_BxTxKxE.shape[2]
  sizes = sa.BlockSizes(
      block_q=block,
      block_kv=block,
      block_kv_compute=block,
      block_q_dkv=block,
      block_kv_dkv=block,
      block_kv_dkv_compute=block,
      block_q_dq=block,
      block_kv_dq=block,
  )
  make = sa.make_splash_mqa if k == 1 else sa.make_splash_mha
  kernel = make(
      sa.MultiHeadMask([sa.CausalMask((t, t))] * h),
      block_sizes=sizes,
      head_shards=1,
      q_seq_shards=1,
      interpret=interpret,
  )

  def one_row(q_HxTxE, k_KxTxE, v_KxTxE, seg_T):
    if k == 1:
      k_KxTxE, v_KxTxE = k_KxTxE[0], v_KxTxE[0]
    seg = None if seg_T is None else sa.SegmentIds(q=seg_T, kv=seg_T)
    return kernel(q_HxTxE, k_KxTxE, v_KxTxE, segment_ids=seg)

  out_BxHxTxE = jax.vmap(one_row)(
      (q_BxTxHxE * (e**-0.5)).transpose(0, 2, 1, 3),
      k_BxTxKxE.transpose(0, 2, 1, 3),
      v_BxTxKxE.transpose(0, 2, 1, 3),
      segment_ids_BxT,
  )
  return out_BxHxTxE.transpose(0, 2, 1, 3)


@attention_lib.IMPLS.register("splash")
def splash(
    q_BxTxHxE: jax.Array,
    k_BxTxKxE: jax.Array,
    v_BxTxKxE: jax.Array,
    segment_ids_BxT: Optional[jax.Array] = None,
    *,
    dtype,
    interpret: Optional[bool] = None,
) -> jax.Array:
  """Pallas' splash attention, sharded over the mesh's batch and head axes.

  Under a mesh (`sharding.activate`) it runs in shard_map over the axes of
  `act_batch` and `act_heads`. `interpret` runs the kernel in Pallas'
  interpreter; None means off TPU only.
  """
  if interpret is None:
    interpret = attention_lib.platform() != "tpu"
  t = q_BxTxHxE.shape[1]
  block = min(SPLASH_BLOCK, -(-t // 128) * 128)
  pad = ((0, 0), (0, -(-t // block) * block - t))
  args = [
      jnp.pad(x.astype(dtype), pad + ((0, 0), (0, 0)))
      for x in (q_BxTxHxE, k_BxTxKxE, v_BxTxKxE)
  ]
  if segment_ids_BxT is not None:
    args.append(
        jnp.pad(segment_ids_BxT.astype(jnp.int32), pad, constant_values=-1)
    )
  body = functools.partial(_splash_local, block=block, interpret=interpret)
  if segment_ids_BxT is None:
    body = functools.partial(body, segment_ids_BxT=None)
  mesh = jax.sharding.get_abstract_mesh()
  if not mesh.empty:
    batch, heads = _mesh_axes(mesh, q_BxTxHxE.shape[0], k_BxTxKxE.shape[2])
    spec = PartitionSpec(batch, None, heads, None)
    specs = (spec,) * 3 + (PartitionSpec(batch, None),) * (len(args) - 3)
    body = jax.shard_map(
        body, mesh=mesh, in_specs=specs, out_specs=spec, check_vma=False
    )
  return body(*args)[:, :t]
