"""The compile report's times: each program's roofline and an RL step's.

Every time printed here is labelled `roofline.LABEL`: a compiler's estimate
at the chip's published figures, never a measurement.
"""

from __future__ import annotations

from typing import Optional

from scalerl_jax.jobs.planner import accelerators
from scalerl_jax.jobs.planner import roofline
from scalerl_jax.jobs.planner import step_estimate
from scalerl_jax.jobs.planner.aot import Result

# What a roofline leaves out, printed under every step estimate.
LEFT_OUT = (
    "Left out: a roofline is each program's device time at the chip's peak "
    "with compute and memory traffic perfectly overlapped. Not counted: host "
    "time (the Python loop, collating batches, tokenising), the verifiers' "
    "time (CPU workers, overlapped with decoding only in part), launch and "
    "dispatch gaps between sampler calls, checkpoints and metrics. A decode "
    "step is bandwidth-bound: its time is its bytes over HBM bandwidth, the "
    "decode kernel's reads counted at the full cache (a mean step of "
    "continuous batching reads about half). Counts are the steady state: "
    "every completion the stated length, every slot busy, start batches not "
    "padded to a power of two."
)


def _why_none(r: Result, chip: accelerators.Accelerator) -> str:
  if r.compiled is None:
    return "refused by the compiler"
  if not chip.peak_flops or not chip.hbm_bandwidth:
    return f"no published peak or HBM bandwidth for {chip.name}"
  return "no cost analysis"


def rooflines(results: list[Result]) -> dict[str, float]:
  """Seconds of one run of each program that has a roofline, by name."""
  return {r.name: r.roofline.seconds for r in results if r.roofline}


def roofline_lines(
    results: list[Result], chip: accelerators.Accelerator
) -> list[str]:
  """One line per program: its cost analysis and roofline per run."""
  lines = [
      f"Roofline of one run, per device: {roofline.LABEL}; {chip.name} at "
      f"{chip.peak_flops / 1e12:.0f} TFLOP/s bf16, "
      f"{chip.hbm_bandwidth / 1e9:.0f} GB/s HBM. Kernel work: the attention "
      "FLOPs and decode-cache reads of Pallas kernels, which the cost "
      "analysis does not see. And",
      "the cost analysis counts a loop's body once (a remat model's layers), "
      "so a run is never taken as less than its FLOPs (metrics.compute) at "
      "peak: 'floor s'.",
      f"  {'program':12s} {'TFLOPs':>9s} {'GB read':>9s} {'+kern TF':>9s} "
      f"{'+kern GB':>9s} {'kern s':>9s} {'floor s':>9s} {'seconds':>10s}  from",
  ]
  for r in results:
    if r.roofline is None:
      lines.append(f"  {r.name:12s} no roofline: {_why_none(r, chip)}")
      continue
    flops = r.cost.get("flops", 0.0)
    read = r.cost.get("bytes accessed", 0.0)
    lines.append(
        f"  {r.name:12s} {flops / 1e12:9.4g} {read / 1e9:9.4g} "
        f"{r.attention_flops / 1e12:9.4g} {r.kernel_hbm_reads() / 1e9:9.4g} "
        f"{r.roofline.kernel_seconds:9.3g} {r.roofline.floor_seconds:9.3g} "
        f"{r.roofline.seconds:10.4g}  "
        f"{r.roofline.source}"
    )
  return lines


def _hours(seconds: float) -> str:
  return f"{seconds:,.0f} s = {seconds / 3600:,.1f} h = {seconds / 86400:,.2f} days"


def step_lines(
    results: list[Result],
    counts: step_estimate.StepCounts,
    num_chips: Optional[int] = None,
) -> list[str]:
  """Runs per RL step x roofline = the step's time, and the whole run's."""
  est = step_estimate.estimate(rooflines(results), counts)
  per_run = rooflines(results)
  runs = counts.amortised()
  decode_steps = counts.per_step["decode"]
  lines = [
      f"One RL step, {roofline.LABEL}:",
      f"  every completion {counts.completion_len:,} tokens, {counts.num_slots:,} "
      f"rollout slots busy: {decode_steps:,.0f} decode steps a step "
      f"({counts.decode_calls:,.1f} sampler calls); validation every "
      f"{counts.eval_every} steps, amortised. decode and the train step count "
      "per decode step and per microbatch (a loop's body is what the cost "
      "analysis counts).",
      f"  {'program':12s} {'runs/step':>11s} {'s/run':>10s} {'s/step':>10s}",
  ]
  for name, n in runs.items():
    if not n:
      continue
    seconds = per_run.get(name)
    lines.append(
        f"  {name:12s} {n:11.5g} "
        + (
            f"{seconds:10.4g} {n * seconds:10.4g}"
            if seconds is not None
            else f"{'missing':>10s}"
        )
    )
  partial = (
      f" (PARTIAL: no roofline for {', '.join(est.missing)})"
      if est.missing
      else ""
  )
  chips = (
      f"; x {num_chips} chips = {est.run_seconds * num_chips / 3600:,.0f} "
      "chip-hours"
      if num_chips
      else ""
  )
  lines += [
      f"  per RL step: {est.step_seconds:.4g} s{partial}",
      f"  whole run ({counts.num_steps:,} steps, {counts.validations} "
      f"validations): {_hours(est.run_seconds)}{chips}{partial}",
      "  " + LEFT_OUT,
  ]
  return lines


def estimate_json(
    results: list[Result], counts: step_estimate.StepCounts
) -> dict:
  """`step_lines`' numbers as plain data."""
  est = step_estimate.estimate(rooflines(results), counts)
  return {
      "label": roofline.LABEL,
      "completion_len": counts.completion_len,
      "num_slots": counts.num_slots,
      "decode_calls_per_step": counts.decode_calls,
      "num_steps": counts.num_steps,
      "eval_every": counts.eval_every,
      "validations": counts.validations,
      "runs_per_step": counts.amortised(),
      "runs_whole_run": counts.whole_run(),
      "seconds_per_run": rooflines(results),
      "seconds_per_step_by_program": est.per_step,
      "step_seconds": est.step_seconds,
      "run_seconds": est.run_seconds,
      "missing": list(est.missing),
      "left_out": LEFT_OUT,
  }
