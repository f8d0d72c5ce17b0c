"""The weight sync of mesh.layout='disaggregated': its bytes and roofline.

Once per step `Experiment.to_generator` moves the trainer's parameters into
the generator's shardings of them with `jax.device_put`. No program is
compiled for that move, so none can be compiled ahead of time: `jax.jit`
refuses an input and an output on different device sets ("Received
incompatible devices for jitted computation"), and `device_put` between
disjoint device sets is a copy by the runtime (JAX 0.10, `array.py`'s
`_array_shard_arg`): shard for shard, device to device, where both roles lay
the parameters out alike (the same mesh shape and partition specs); else
through the host, the whole array fetched and sent again
(tests/scripts/weight_sync_paths.py pins both). So the sync is counted, not
compiled: its bytes exactly, from the parameters' shapes and dtypes, and its
roofline at the chip's interconnect bandwidth (`accelerators`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Optional

import jax
import jax.numpy as jnp

from scalerl_jax.jobs.planner import accelerators

# What the sync is counted in: the float32 master weights `to_generator`
# sends today, and bfloat16, what a cast on the trainer's devices before the
# move would send (the sampler regroups into bfloat16 anyway).
DTYPES = ("float32", "bfloat16")

# Weight syncs of Qwen3-0.6B measured by others, as issue 57 quotes them:
# (what, seconds from, seconds to). Beside the roofline, never in place of
# a measurement here.
ANCHORS = (
    ("Tunix Raiden, direct TPU-to-TPU weight sync", 0.09, 0.42),
    (
        "verl on TPU v6e, 1.5 GB of bf16: 131 ms device to host + 92 ms "
        "host to device",
        0.131 + 0.092,
        0.131 + 0.092,
    ),
)


@dataclasses.dataclass(frozen=True)
class WeightSync:
  """One move of the parameters from the trainer's devices to the
  generator's."""

  leaves: int
  num_params: int  # Elements over every leaf.
  # Every leaf's size x itemsize, by DTYPES: what crosses between the roles.
  bytes: dict[str, int]
  # The most one generator device receives (its shard of every leaf), by
  # DTYPES: the devices receive in parallel, so this sets the time.
  device_bytes: dict[str, int]
  # The roles lay the parameters out alike: device_put copies shard for
  # shard, device to device. False: through the host (this roofline does
  # not hold).
  shard_to_shard: bool
  bandwidth: float  # Interconnect bytes/s into one device (`accelerators`).

  def seconds(self, dtype: str) -> Optional[float]:
    """The roofline of one sync in `dtype`: `device_bytes` over one
    device's interconnect, every link busy; None without the figure."""
    if not self.bandwidth:
      return None
    return self.device_bytes[dtype] / self.bandwidth


def weight_sync(
    params: Any,
    generator_shardings: Any,
    chip: accelerators.Accelerator,
) -> WeightSync:
  """The sync of `params` (the trainer's sharded ShapeDtypeStructs or arrays)
  into `generator_shardings` (the same tree's, on the generator's mesh)."""
  leaves = jax.tree.leaves(params)
  targets = jax.tree.leaves(generator_shardings)
  sizes = [math.prod(x.shape) for x in leaves]
  shard_sizes = [
      math.prod(s.shard_shape(x.shape)) for x, s in zip(leaves, targets)
  ]
  alike = all(
      x.sharding.num_devices == s.num_devices
      and _mesh_shape(x.sharding) == _mesh_shape(s)
      and x.sharding.spec == s.spec
      for x, s in zip(leaves, targets)
  )
  itemsize = {d: jnp.dtype(d).itemsize for d in DTYPES}
  return WeightSync(
      leaves=len(leaves),
      num_params=sum(sizes),
      bytes={d: sum(sizes) * itemsize[d] for d in DTYPES},
      device_bytes={d: sum(shard_sizes) * itemsize[d] for d in DTYPES},
      shard_to_shard=alike,
      bandwidth=chip.ici_bandwidth,
  )


def _mesh_shape(s: Any) -> dict:
  return dict(s.mesh.shape)


def sync_lines(sync: WeightSync, chip: accelerators.Accelerator) -> list[str]:
  """The sync's bytes and roofline per dtype, with the anchors beside."""
  gb = lambda n: f"{n / accelerators.GB:.3f} GB"
  path = (
      "shard for shard, device to device"
      if sync.shard_to_shard
      else "THROUGH THE HOST: the roles lay the parameters out differently, "
      "so jax.device_put fetches each array and sends it again; the "
      "interconnect roofline below does not hold"
  )
  lines = [
      "Weight sync, trainer -> generator, once per step (jax.device_put, "
      "Experiment.to_generator): not a compiled program (JAX compiles none "
      "for a move between device sets); counted from the parameters' shapes.",
      f"  {sync.leaves} leaves, {sync.num_params:,} parameters; {path}.",
      f"  {'dtype':9s} {'bytes/sync':>14s} {'per device':>14s} {'seconds':>10s}",
  ]
  for d in DTYPES:
    seconds = sync.seconds(d)
    lines.append(
        f"  {d:9s} {gb(sync.bytes[d]):>14s} {gb(sync.device_bytes[d]):>14s} "
        + (f"{seconds:10.4g}" if seconds is not None else f"{'no figure':>10s}")
    )
  lines.append(
      f"  seconds: estimate (interconnect roofline, not measured): the bytes "
      f"one generator device receives over its links at "
      f"{chip.ici_bandwidth / 1e9:.0f} GB/s one way ({chip.name}, every link "
      "busy). Not counted: the links between the two device sets, which "
      "every byte crosses, hops, and the runtime's per-array overhead."
  )
  lines.append("  Measured by others for Qwen3-0.6B (issue 57):")
  for what, low, high in ANCHORS:
    span = f"{low:.3g} s" if low == high else f"{low:.3g}-{high:.3g} s"
    lines.append(f"    {what}: {span}")
  return lines


def sync_json(sync: WeightSync) -> dict:
  """The sync's numbers as plain data."""
  return dict(
      dataclasses.asdict(sync),
      seconds={d: sync.seconds(d) for d in DTYPES},
      compiled=False,
      anchors=[dict(what=w, seconds=[lo, hi]) for w, lo, hi in ANCHORS],
  )
