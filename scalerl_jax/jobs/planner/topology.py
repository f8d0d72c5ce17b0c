"""The chips to compile for: a named TPU slice (no TPU needed), or this host's.

Each comes with its published figures (`accelerators`), or the allocator's
limit where the backend reports one.
"""

from __future__ import annotations

import importlib.util
import os
import re
from typing import Any

import jax

from scalerl_jax import sharding
from scalerl_jax.jobs.planner import accelerators

# The install that brings the TPU compiler: the package's `tpu` extra, JAX's
# own extra, which pins the libtpu made for the JAX that setup.py's range
# resolves to (README.md quotes it).
INSTALL = 'pip install -e ".[tpu]"'
# TPU generation in a slice name -> accelerators.ACCELERATORS key (HBM and
# peak FLOP/s).
GENERATIONS = {
    "v5e": "tpu_v5e",
    "v5p": "tpu_v5p",
    "v6e": "tpu_v6e",
    "tpu7x": "tpu_7x",
}
# Generations whose slices are named in three dimensions (X x Y x Z).
_THREE_D = ("v5p", "tpu7x")
# `--topology` naming this machine's own devices, compiled by its own backend.
LOCAL = "local"
TOPOLOGY_FORMS = (
    "v5e:<X>x<Y> (e.g. v5e:2x2, v5e:4x8, v5e:16x16), "
    "v5p:<X>x<Y>x<Z> (e.g. v5p:2x2x1, v5p:4x4x4, v5p:8x8x8), "
    "v6e:<X>x<Y> (e.g. v6e:2x2, v6e:4x4, v6e:16x16), "
    "tpu7x:<X>x<Y>x<Z> (TPU7x, Ironwood: e.g. tpu7x:2x2x1, tpu7x:4x4x4; "
    "two devices per chip); "
    "chip counts are multiples of 4 (one host); "
    f"or {LOCAL!r}: this machine's own devices (a GPU, say)"
)
# Words in `Device.device_kind` -> accelerators.ACCELERATORS key.
_DEVICE_KINDS = {
    "h100": "h100",
    "h200": "h200",
    "v5 lite": "tpu_v5e",
    "v5e": "tpu_v5e",
    "v5p": "tpu_v5p",
    "v6 lite": "tpu_v6e",
    "v6e": "tpu_v6e",
    "tpu7x": "tpu_7x",
}
_TOPOLOGY = re.compile(r"^(v5e|v5p|v6e|tpu7x):(\d+)x(\d+)(?:x(\d+))?$")


class CompileError(ValueError):
  """A slice that cannot be compiled for: a bad name, or no libtpu installed."""


def slice_devices(topology: str) -> tuple[list[Any], accelerators.Accelerator]:
  """The chips of the named slice (no TPU needed) and their published figures.

  Raises:
    CompileError: the name is not a v5e / v5p / v6e / tpu7x slice (the
      message lists the valid forms), or libtpu is not installed (it says how
      to install it).
  """
  match = _TOPOLOGY.match(topology)
  three_d = match is not None and match.group(4) is not None
  if match is None or three_d != (match.group(1) in _THREE_D):
    raise CompileError(
        f"--topology={topology!r}: expected one of {TOPOLOGY_FORMS}"
    )
  if importlib.util.find_spec("libtpu") is None:
    raise CompileError(
        f"the TPU compiler (libtpu) is not installed; install it with {INSTALL}"
    )
  # libtpu allows one process per machine unless told otherwise; compiling
  # touches no chip, so tests and a running compile may share it.
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top

  try:
    desc = topologies.get_topology_desc(topology_name=topology, platform="tpu")
  except Exception as e:  # pylint: disable=broad-except
    raise CompileError(
        f"--topology={topology!r}: libtpu refused it ({str(e).splitlines()[0]}); "
        f"expected one of {TOPOLOGY_FORMS}"
    ) from None
  return (
      list(desc.devices),
      accelerators.ACCELERATORS[GENERATIONS[match.group(1)]],
  )


def local_devices() -> tuple[list[Any], accelerators.Accelerator]:
  """This machine's devices and their figures.

  The capacity is the allocator's limit where the backend reports one
  (`sharding.hbm_capacity`; on a GPU, what XLA may take of the card), else
  the published figure, and on a
  CPU the machine's memory; the peak FLOP/s, HBM and interconnect bandwidth
  are the published ones for a known chip, else 0.
  """
  devices = jax.devices()
  kind = devices[0].device_kind
  known = next(
      (
          accelerators.ACCELERATORS[key]
          for word, key in _DEVICE_KINDS.items()
          if word in kind.lower()
      ),
      None,
  )
  limit = sharding.hbm_capacity(devices)  # What launch.train budgets from.
  if devices[0].platform == "cpu":
    limit = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
  if not limit and known is None:
    raise CompileError(
        f"--topology={LOCAL}: {kind!r} reports no memory limit and is not one "
        f"of the chips the planner knows ({sorted(accelerators.ACCELERATORS)})"
    )
  return devices, accelerators.Accelerator(
      f"{kind} (this machine)",
      float(limit) if limit else known.hbm_bytes,
      known.peak_flops if known else 0.0,
      "allocator limit or RAM" if limit else known.source,
      known.hbm_bandwidth if known else 0.0,
      known.devices_per_chip if known else 1,
      ici_bandwidth=known.ici_bandwidth if known else 0.0,
  )
