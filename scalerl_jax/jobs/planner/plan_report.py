"""The planner's report: how a plan fits each accelerator, and its printout."""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

from scalerl_jax.jobs.planner.accelerators import GB
from scalerl_jax.jobs.planner.accelerators import Accelerator
from scalerl_jax.jobs.planner.plan import Plan


@dataclasses.dataclass(frozen=True)
class Fit:
  """How a plan sits on one accelerator."""

  accelerator: Accelerator
  fits: bool  # peak <= (1 - margin) x HBM.
  free_bytes: float  # (1 - margin) x HBM - peak; negative when it does not fit.
  # Train sequences per device the activations leave room for.
  rows_that_fit: int
  generate_s: float  # At peak FLOP/s on every device.
  train_s: float


def fit(plan: Plan, accelerator: Accelerator, margin: float) -> Fit:
  """How `plan` fits in (1 - margin) x HBM of `accelerator`; time at peak."""
  usable = (1.0 - margin) * accelerator.hbm_bytes
  rows = 0
  if plan.generate_peak <= usable:
    rows = max(
        int(
            (usable - plan.train_peak + plan.activations)
            // plan.activations_per_row
        ),
        0,
    )
  device_flops = math.prod(plan.mesh_shape.values()) * accelerator.peak_flops
  return Fit(
      accelerator,
      plan.peak <= usable,
      usable - plan.peak,
      rows,
      plan.generation_flops / device_flops,
      plan.train_flops / device_flops,
  )


def format_report(
    plan: Plan, accelerators: Sequence[Accelerator], margin: float
) -> str:
  """The planner's printout: per-device memory, FLOPs, and a fit table."""
  gb = lambda n: f"{n / GB:10.3f} GB"
  act = "remat" if plan.remat else "no remat"
  lines = [
      f"mesh {plan.mesh_shape}; {plan.num_slots} sampler slots; train batch "
      f"{plan.train_rows} x {plan.seq_len} tokens ({plan.rows_per_device} rows per device)",
      "",
      "Per device:",
      f"  parameters                 {gb(plan.params)}",
      f"  optimizer state (AdamW)    {gb(plan.opt_state)}",
      f"  gradients                  {gb(plan.grads)}",
      f"  gradient accumulator       {gb(plan.grad_accum)}",
      f"  sampler KV cache           {gb(plan.kv_cache)}",
      f"  sampler token records      {gb(plan.slot_records)}",
      # Activations and the weights the step un-shards, at its peak phase.
      f"  train temporaries, remat   {gb(plan.activations_remat)}",
      f"  train temporaries, none    {gb(plan.activations_no_remat)}",
      f"  decode weights (generate)  {gb(plan.decode_weights)}",
      f"  embedding, head (generate) {gb(plan.prepared_rest)}",
      f"  {'peak, train (' + act + ')':27s}{gb(plan.train_peak)}",
      f"  peak, generate             {gb(plan.generate_peak)}",
      "",
      "Per RL step (every completion at the full budget):",
      f"  generation FLOPs  {plan.generation_flops:.4g}",
      f"  training FLOPs    {plan.train_flops:.4g}",
      "",
      f"Fit with {margin:.0%} of HBM kept free (time at peak bf16 FLOP/s, a lower bound):",
      f"  {'accelerator':16s} {'HBM GB':>7s} {'TFLOP/s':>8s} {'fits':>5s} {'free GB':>9s} "
      f"{'rows/dev':>8s} {'gen s':>9s} {'train s':>9s} {'step s':>9s}",
  ]
  for acc in accelerators:
    f = fit(plan, acc, margin)
    lines.append(
        f"  {acc.name:16s} {acc.hbm_bytes / GB:7.0f} {acc.peak_flops / 1e12:8.0f} "
        f"{'yes' if f.fits else 'no':>5s} {f.free_bytes / GB:9.2f} {f.rows_that_fit:8d} "
        f"{f.generate_s:9.3g} {f.train_s:9.3g} {f.generate_s + f.train_s:9.3g}"
    )
  lines.append(
      f"  (rows/dev: train sequences per device that would fit; this batch puts "
      f"{plan.rows_per_device} on each)"
  )
  if plan.mesh_shape.get("tensor", 1) > 1:
    # On such a mesh the compiler's regroup keeps temporaries (the gathered
    # kernels in another layout) that the plan does not count; their sizes
    # are measured in docs/tpu.md, "The compiler's least peak".
    lines.append(
        "  Mesh with a tensor axis: the TPU compiler's weight regroup held "
        "up to 1.6x this plan's count of it (docs/tpu.md); check the slice "
        "with launch.compile."
    )
  return "\n".join(lines) + "\n"
