"""A compiled program's roofline time: an estimate, not a measurement.

The compiler's part is libtpu's `optimal_seconds` where it is positive, else
max(FLOPs / peak, bytes accessed / HBM bandwidth) of the same cost analysis,
per chip at the chip's published figures (`accelerators`). libtpu's
`optimal_seconds` came out negative for most programs on v5e and v6e
(docs/tpu.md), hence the fallback.

The cost analysis does not see inside Pallas kernels (splash attention in the
train step and prefill, the decode kernel), so their work is added at the
same figures: the attention FLOPs `metrics.compute` counts and the cache the
decode kernel reads from HBM. And it counts a loop's body once: the train
step's loop over microbatches (whose count `step_estimate` multiplies in) and
its loop over layers with remat (measured: docs/tpu.md, "Time per RL step").
So the roofline is never less than the FLOPs the run needs by
`metrics.compute` at the chip's peak: the floor.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from scalerl_jax.jobs.planner import accelerators

# How every time derived from a roofline is labelled where it is printed.
LABEL = "estimate (compiler roofline, not measured)"
# `Roofline.source`: which figure of the cost analysis gave the compiler's part.
OPTIMAL = "optimal_seconds"
BOUND = "max(flops/peak, bytes/bandwidth)"
FLOOR = "model FLOPs/peak"


@dataclasses.dataclass(frozen=True)
class Roofline:
  """One run of a program, per chip."""

  seconds: float  # The compiler's part with the kernels' work, or the floor.
  source: str  # OPTIMAL, BOUND or FLOOR: which gave `seconds`.
  # The Pallas kernels' work alone (FLOPs / peak vs bytes / bandwidth).
  kernel_seconds: float = 0.0
  floor_seconds: float = 0.0  # The run's FLOPs (`metrics.compute`) / peak.


def bound_seconds(
    flops: float, num_bytes: float, chip: accelerators.Accelerator
) -> float:
  """max(flops / peak, bytes / HBM bandwidth) at `chip`'s figures."""
  return max(flops / chip.peak_flops, num_bytes / chip.hbm_bandwidth)


def program_roofline(
    cost: Optional[dict],
    chip: accelerators.Accelerator,
    kernel_flops: float = 0.0,
    kernel_bytes: float = 0.0,
    model_flops: float = 0.0,
) -> Optional[Roofline]:
  """The roofline of one run from its cost analysis (per chip).

  Args:
    cost: `compiled.cost_analysis()`'s "flops", "bytes accessed" and, where
      the compiler gives it, "optimal_seconds".
    chip: the chip's published peak FLOP/s and HBM bandwidth.
    kernel_flops: FLOPs of Pallas kernels, which the cost analysis omits.
    kernel_bytes: HBM bytes those kernels read, likewise omitted.
    model_flops: the FLOPs the run needs by the model's count; the floor.

  Returns:
    None without a cost analysis or without the chip's figures (a CPU, an
    unknown GPU).
  """
  if not cost or not chip.peak_flops or not chip.hbm_bandwidth:
    return None
  kernel = bound_seconds(kernel_flops, kernel_bytes, chip)
  floor = model_flops / chip.peak_flops
  optimal = cost.get("optimal_seconds", 0.0)
  if optimal > 0:
    # The compiler's schedule and the kernels do not overlap in this sum.
    seconds, source = optimal + kernel, OPTIMAL
  else:
    seconds, source = (
        bound_seconds(
            cost.get("flops", 0.0) + kernel_flops,
            cost.get("bytes accessed", 0.0) + kernel_bytes,
            chip,
        ),
        BOUND,
    )
  if floor > seconds:
    seconds, source = floor, FLOOR
  return Roofline(seconds, source, kernel, floor)
