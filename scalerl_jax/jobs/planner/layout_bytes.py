"""Per-device bytes of arrays laid out by partition specs on an abstract mesh.

A dimension sharded n ways keeps ceil(size / n) entries per device, as XLA
pads uneven shards; on TPU each shard is also padded to the chip's tiles.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import jax
from jax.sharding import AbstractMesh
from jax.sharding import PartitionSpec

from scalerl_jax import sharding
from scalerl_jax.models import kv_cache


def abstract_mesh(mesh_cfg: Any, num_devices: int) -> AbstractMesh:
  """The config's mesh over `num_devices` devices, without the devices."""
  shape = sharding.resolve_mesh_shape(mesh_cfg.shape, num_devices)
  return AbstractMesh(shape, tuple(mesh_cfg.axes))


def shard_elements(
    shape: Sequence[int], spec: PartitionSpec, mesh: AbstractMesh
) -> int:
  """Entries in one device's shard of an array of `shape` laid out by `spec`.

  Each dimension keeps ceil(size / ways) entries, as XLA pads uneven shards;
  missing trailing entries of `spec` are replicated.
  """
  return math.prod(_local_shape(shape, spec, mesh))


def _local_shape(
    shape: Sequence[int], spec: PartitionSpec, mesh: AbstractMesh
) -> list[int]:
  local = []
  for i, size in enumerate(shape):
    axes = spec[i] if i < len(spec) else None
    axes = (
        ()
        if axes is None
        else (axes,)
        if isinstance(axes, str)
        else tuple(axes)
    )
    local.append(-(-size // math.prod(mesh.shape[a] for a in axes)))
  return local


def tpu_tiled(local_shape: Sequence[int], itemsize: int) -> list[int]:
  """`local_shape` padded to TPU tiles of (8 x 4 / itemsize, 128).

  The last dim is the minor one, padded to the 128 lanes. The compiler picks
  which other dim tiles the sublanes, and takes the one that pads least (a
  cache's positions rather than its few heads: docs/design/planner.md, "TPU
  tiles", has the bytes measured).
  """
  dims = list(local_shape)
  if dims:
    lanes = kv_cache.TPU_LANES
    dims[-1] = -(-dims[-1] // lanes) * lanes
  if len(dims) >= 2:
    rows = 8 * max(1, 4 // itemsize)
    padded = lambda n: -(-n // rows) * rows
    # The least padding; on a tie the second-minor dim, as laid out.
    best = min(
        range(len(dims) - 1),
        key=lambda i: (padded(dims[i]) / dims[i], i != len(dims) - 2),
    )
    dims[best] = padded(dims[best])
  return dims


def shard_bytes(
    shape: Sequence[int],
    spec: PartitionSpec,
    mesh: AbstractMesh,
    itemsize: int,
    platform: str,
) -> int:
  """Bytes of one device's shard of `shape` laid out by `spec` (TPU: tiled)."""
  local = _local_shape(shape, spec, mesh)
  return (
      math.prod(tpu_tiled(local, itemsize) if platform == "tpu" else local)
      * itemsize
  )


def tree_bytes(abstract: Any, specs: Any, mesh: AbstractMesh) -> int:
  """Per-device bytes, untiled, of ShapeDtypeStructs laid out by `specs`."""
  sizes = jax.tree.map(
      lambda x, s: shard_elements(x.shape, s, mesh) * x.dtype.itemsize,
      abstract,
      specs,
  )
  return sum(jax.tree.leaves(sizes))
