"""Device mesh, logical-axis rules and shardings, derived from `config.mesh`.

The model names logical axes only; `mesh.logical_axis_rules` maps them to
mesh axes. Parameters are created directly in their shardings, so no host
holds a full replica it does not need. Multi-host runs join JAX's
multi-controller runtime first (`multihost/runtime.py`).

Design: docs/design/sharding.md.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any, Callable, Optional, Sequence

from absl import logging
import flax.linen as nn
import jax
from jax.experimental import mesh_utils
from jax.sharding import AxisType
from jax.sharding import Mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec
import numpy as np
import optax

Rules = tuple[tuple[str, Any], ...]


def resolve_mesh_shape(
    shape: Sequence[int], num_devices: int
) -> tuple[int, ...]:
  """Replaces a single -1 in `shape` by the remaining device count."""
  shape = list(shape)
  fixed = math.prod(s for s in shape if s != -1)
  if -1 in shape:
    if num_devices % fixed:
      raise ValueError(
          f"mesh.shape: fixed sizes {tuple(shape)} (product {fixed}) do not divide the "
          f"{num_devices} available devices"
      )
    shape[shape.index(-1)] = num_devices // fixed
  if math.prod(shape) != num_devices:
    raise ValueError(
        f"mesh.shape: {tuple(shape)} needs {math.prod(shape)} devices, {num_devices} available"
    )
  return tuple(shape)


def make_mesh(
    mesh_cfg: Any, devices: Optional[Sequence[jax.Device]] = None
) -> Mesh:
  """The device mesh of `config.mesh`; ValueError if it cannot be laid out.

  A mesh axis that is no product of whole physical axes of a TPU slice (128
  ways on a 16x16 torus) splits them, with a warning.
  """
  devices = list(devices) if devices is not None else jax.devices()
  shape = resolve_mesh_shape(mesh_cfg.shape, len(devices))
  axes = tuple(mesh_cfg.axes)
  # Auto axes: shardings are hints that XLA's partitioner propagates.
  axis_types = (AxisType.Auto,) * len(axes)
  try:
    return jax.make_mesh(shape, axes, axis_types=axis_types, devices=devices)
  except (NotImplementedError, ValueError, AssertionError) as e:
    reason = e
  try:
    grid = mesh_utils.create_device_mesh(
        shape, devices, allow_split_physical_axes=True
    )
  except (NotImplementedError, ValueError, AssertionError) as e:
    raise ValueError(
        f"mesh.shape: {shape} over axes {axes} cannot be laid on the "
        f"{len(devices)} {devices[0].device_kind} devices: {e}"
    ) from None
  logging.warning(
      "mesh.shape %s over axes %s splits the physical axes of the %d %s "
      "devices (%s); the split axis's collectives cross more links",
      shape,
      axes,
      len(devices),
      devices[0].device_kind,
      reason,
  )
  return Mesh(grid, axes, axis_types=axis_types)


# Where the generator runs (`mesh.layout`): "colocated" on the trainer's
# devices, the phases alternating; "disaggregated" on devices of its own,
# disjoint from the trainer's (docs/design/disaggregated.md).
LAYOUTS = ("colocated", "disaggregated")


def layout_of(mesh_cfg: Any) -> str:
  """`mesh.layout`; "colocated" for configs recorded before it existed."""
  return mesh_cfg.get("layout", LAYOUTS[0])


def role_device_counts(mesh_cfg: Any, num_devices: int) -> tuple[int, int]:
  """(trainer's, generator's) device counts of `num_devices` under
  `mesh.layout`: both all of them when colocated; disaggregated, the
  generator takes `mesh.generator_devices` (0: half, rounded down) and the
  trainer the rest. ValueError where a role would get none."""
  if layout_of(mesh_cfg) == "colocated":
    return num_devices, num_devices
  generator = mesh_cfg.generator_devices or num_devices // 2
  if not 0 < generator < num_devices:
    raise ValueError(
        f"mesh.generator_devices: {mesh_cfg.generator_devices} leaves no "
        f"device to one role of mesh.layout='disaggregated' "
        f"({num_devices} devices)"
    )
  return num_devices - generator, generator


def role_devices(
    mesh_cfg: Any, devices: Optional[Sequence[jax.Device]] = None
) -> tuple[list[jax.Device], list[jax.Device]]:
  """(trainer's devices, generator's devices) of `devices` (default all) as
  `role_device_counts` counts them: the trainer's first, the generator's
  after them, disjoint unless colocated."""
  devices = list(devices) if devices is not None else jax.devices()
  trainer, generator = role_device_counts(mesh_cfg, len(devices))
  if layout_of(mesh_cfg) == "colocated":
    return devices, devices
  return devices[:trainer], devices[trainer:]


def logical_rules(mesh_cfg: Any) -> Rules:
  """`mesh.logical_axis_rules` as a hashable tuple."""
  return tuple(
      (name, tuple(t) if isinstance(t, list) else t)
      for name, t in mesh_cfg.logical_axis_rules
  )


@contextlib.contextmanager
def activate(mesh: Mesh, rules: Rules):
  """Context in which to trace model code: its logical constraints apply."""
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    yield


def logical_to_shardings(logical_tree: Any, mesh: Mesh, rules: Rules) -> Any:
  """Tree of PartitionSpecs over logical names -> tree of NamedShardings."""
  return nn.logical_to_mesh_sharding(logical_tree, mesh, rules)


def named_sharding(
    mesh: Mesh, rules: Rules, logical_axes: Sequence[Optional[str]]
) -> NamedSharding:
  """NamedSharding for an array whose dimensions carry `logical_axes`."""
  return NamedSharding(
      mesh, nn.logical_to_mesh_axes(tuple(logical_axes), rules)
  )


def init_sharded(
    init_fn: Callable[[jax.Array], Any],
    rng: jax.Array,
    mesh: Mesh,
    rules: Rules,
) -> tuple[Any, Any]:
  """Runs `init_fn` (rng -> boxed, logically named tree) into its shardings.

  Returns (tree of plain sharded arrays, matching tree of NamedShardings).
  """
  abstract = jax.eval_shape(init_fn, rng)
  shardings = logical_to_shardings(nn.get_partition_spec(abstract), mesh, rules)
  # Traced without an active mesh: out_shardings places the values, and flax's
  # init-time constraints would otherwise see DenseGeneral's flattened kernels.
  values = jax.jit(lambda r: nn.unbox(init_fn(r)), out_shardings=shardings)(rng)
  return values, shardings


def init_model_params(
    model: nn.Module, rng: jax.Array, mesh: Mesh, rules: Rules
) -> tuple[Any, Any]:
  """Sharded parameters of `model` (a Transformer) and their shardings."""
  tokens = np.zeros((1, 1), np.int32)
  return init_sharded(
      lambda r: model.init(r, tokens)["params"], rng, mesh, rules
  )


def param_shardings(model: nn.Module, mesh: Mesh, rules: Rules) -> Any:
  """The NamedSharding of every parameter of `model`, without allocating any."""
  tokens = np.zeros((1, 1), np.int32)
  abstract = jax.eval_shape(
      lambda: model.init(jax.random.key(0), tokens)["params"]
  )
  return logical_to_shardings(nn.get_partition_spec(abstract), mesh, rules)


def opt_state_shardings(
    optimizer: Any, params: Any, param_shardings: Any, replicated: Any
) -> Any:
  """Shardings (or specs) of `optimizer.init(params)`, without allocating it.

  Parameter-shaped leaves (Adam's moments) take their parameter's entry of
  `param_shardings` (NamedShardings or PartitionSpecs); every other leaf
  (step counts) takes `replicated`.
  """
  return optax.tree_map_params(
      optimizer,
      lambda _, s: s,
      jax.eval_shape(optimizer.init, params),
      param_shardings,
      transform_non_params=lambda _: replicated,
      is_leaf=lambda x: isinstance(x, (PartitionSpec, jax.sharding.Sharding)),
  )


def abstract(shapes: Any, shardings: Any) -> Any:
  """`jax.eval_shape`'s ShapeDtypeStructs, each given its sharding."""
  return jax.tree.map(
      lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
      shapes,
      shardings,
  )


def per_device_bytes(tree: Any) -> int:
  """Bytes of the largest shard of each sharded array (or abstract array) in
  `tree`, summed: what one device holds of it."""
  return sum(
      math.prod(x.sharding.shard_shape(x.shape)) * x.dtype.itemsize
      for x in jax.tree.leaves(tree)
  )


# libtpu's flag for the HBM a program may be scheduled into, in MiB per chip.
_TPU_HBM_FLAG = "xla_tpu_max_hbm_size_mib"


def platform_of(mesh: Mesh) -> str:
  """The platform of `mesh`'s devices: 'tpu', 'gpu' or 'cpu'."""
  return mesh.devices.flat[0].platform


def hbm_budget_options(
    platform: str, budget_bytes: Optional[float]
) -> dict[str, int]:
  """Compiler options that hold a program to `budget_bytes` per chip.

  The TPU compiler otherwise schedules into the whole HBM without knowing
  what else the run keeps allocated (docs/design/planner.md). Other
  platforms have no such option, and None is no limit: {}. Raises ValueError
  for a budget of at most 0 bytes (the rest of the run already fills the
  chip).
  """
  if platform != "tpu" or budget_bytes is None:
    return {}
  if budget_bytes <= 0:
    raise ValueError(
        f"HBM budget {budget_bytes / 1e9:.2f} GB: what the run keeps "
        "allocated beside the program already fills the chip"
    )
  return {_TPU_HBM_FLAG: int(budget_bytes // 2**20)}


# `hbm_capacity` rounds down to a multiple of this, so that the processes of
# a multi-host run, each reading its own chips, compile the same programs.
CAPACITY_GRAIN = 256 * 2**20


def hbm_capacity(devices: Sequence[Any]) -> int:
  """The smallest allocator limit among `devices`, rounded down to
  CAPACITY_GRAIN; 0 where any reports none."""
  limits = [(d.memory_stats() or {}).get("bytes_limit", 0) for d in devices]
  if not limits or not all(limits):
    return 0
  return min(limits) // CAPACITY_GRAIN * CAPACITY_GRAIN


def hbm_budget(mesh: Mesh, beside_bytes: int) -> Optional[int]:
  """Bytes per chip a program may take while the run keeps `beside_bytes`
  allocated beside it: the capacity of `mesh`'s local devices less them, on
  TPU (the compiler that takes a limit). None elsewhere, or where the devices
  report no capacity."""
  if platform_of(mesh) != "tpu":
    return None
  capacity = hbm_capacity(mesh.local_devices)
  return capacity - beside_bytes if capacity else None


def batch_sharding(mesh: Mesh, rules: Rules, ndim: int) -> NamedSharding:
  """A batch-major array's: dim 0 over `act_batch`, the rest replicated."""
  return named_sharding(mesh, rules, ("act_batch",) + (None,) * (ndim - 1))


def batch_divisor(mesh: Mesh, rules: Rules) -> int:
  """Ways the batch dimension is split; global batches must divide by it."""
  spec = nn.logical_to_mesh_axes(("act_batch",), rules)[0]
  return math.prod(mesh.shape[a] for a in axes_of(spec))


# How the sampler lays out its regrouped weights (`sampling.weight_layout`).
# "sharded": as the trainer holds them (the model's weight axes split over
# fsdp), so every decode step gathers them again. "resident": not split over
# the axes that split the batch, only over the rest (tensor): each chip keeps
# its part of the whole network for the phase, gathered once by `prepare`.
WEIGHT_LAYOUTS = ("sharded", "resident")

# Logical names of activations; every other name is a weight's.
ACTIVATION_PREFIX = "act_"


def sampler_rules(rules: Rules, weight_layout: str) -> Rules:
  """The rules the sampler traces under, for `weight_layout` (one of
  WEIGHT_LAYOUTS): `rules` itself for "sharded"; for "resident", every weight
  name's mesh axes less those of `act_batch`. Applying it twice changes
  nothing."""
  if weight_layout not in WEIGHT_LAYOUTS:
    raise ValueError(
        f"sampling.weight_layout: {weight_layout!r} is not one of {WEIGHT_LAYOUTS}"
    )
  if weight_layout == "sharded":
    return rules
  batch_axes = rule_axes(rules, "act_batch")
  return tuple(
      (
          name,
          target
          if name.startswith(ACTIVATION_PREFIX)
          else without_axes(target, batch_axes),
      )
      for name, target in rules
  )


def rule_axes(rules: Any, logical: str) -> tuple[str, ...]:
  """The mesh axes `rules` map `logical` to (the first rule naming it wins,
  as in flax); () where none does or it is replicated."""
  for name, target in rules:
    if name == logical:
      return axes_of(target)
  return ()


def without_axes(target: Any, dropped: Any) -> Any:
  """A rule's (or a PartitionSpec entry's) mesh axes less those in `dropped`:
  None, one axis name, or a tuple of them."""
  kept = tuple(a for a in axes_of(target) if a not in dropped)
  return kept[0] if len(kept) == 1 else (kept or None)


def axes_of(target: Any) -> tuple[str, ...]:
  """A rule's (or a PartitionSpec entry's) mesh axes as a tuple (None:
  none)."""
  if target is None:
    return ()
  return (target,) if isinstance(target, str) else tuple(target)


def place_global(array: np.ndarray, target: jax.sharding.Sharding) -> jax.Array:
  """Places a host array that every process holds in full onto `target`.

  Each device receives only its slice, so it works across hosts too.
  """
  array = np.asarray(array)
  return jax.make_array_from_callback(
      array.shape, target, lambda index: array[index]
  )
