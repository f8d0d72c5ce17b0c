"""Joining JAX's multi-controller runtime, as `config.mesh` asks.

Every host of a multi-host run runs the same program; `jax.devices()` spans
all of them once each has joined. Design: docs/design/sharding.md.
"""

from __future__ import annotations

import math
from typing import Any

from absl import logging
import jax

from scalerl_jax.multihost import peers

# configs/scalerl.py's mesh.peer_timeout_s.
PEER_TIMEOUT_S = 120.0


def maybe_initialize_distributed(mesh_cfg: Any) -> None:
  """Joins the multi-host runtime when `mesh.distributed` is set.

  Empty / zero / -1 fields are left to JAX's cluster auto-detection. Must run
  before anything touches a device; a second call does nothing. CPU
  collectives default to gloo unless the user chose another. Every process
  then watches the others (`multihost/peers.py`): one silent for
  `mesh.peer_timeout_s` stops the rest with a message naming it.
  """
  if not mesh_cfg.distributed or jax.distributed.is_initialized():
    return
  if jax.config.jax_cpu_collectives_implementation is None:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
  kwargs = {}
  if mesh_cfg.coordinator_address:
    kwargs["coordinator_address"] = mesh_cfg.coordinator_address
  if mesh_cfg.num_processes:
    kwargs["num_processes"] = mesh_cfg.num_processes
  if mesh_cfg.process_id >= 0:
    kwargs["process_id"] = mesh_cfg.process_id
  # Absent in configs recorded before it existed (an export reads those).
  timeout_s = mesh_cfg.get("peer_timeout_s", PEER_TIMEOUT_S)
  jax.distributed.initialize(
      heartbeat_timeout_seconds=math.ceil(
          peers.JAX_HEARTBEAT_FACTOR * timeout_s
      ),
      **kwargs,
  )
  peers.start(timeout_s)
  logging.info(
      "Process %d of %d; %d local and %d global devices.",
      jax.process_index(),
      jax.process_count(),
      jax.local_device_count(),
      jax.device_count(),
  )
