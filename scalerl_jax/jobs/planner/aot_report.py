"""The compile report: every program's bytes per device against the planner,
its roofline time, and an RL step's estimated time (`time_report`)."""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

from scalerl_jax.jobs.planner import accelerators
from scalerl_jax.jobs.planner import step_estimate
from scalerl_jax.jobs.planner import time_report
from scalerl_jax.jobs.planner.aot import PLANNER_TOLERANCE
from scalerl_jax.jobs.planner.aot import Result


def results_json(
    results: list[Result],
    chip: accelerators.Accelerator,
    mesh_shape: dict,
    topology: str,
    counts: Optional[step_estimate.StepCounts] = None,
) -> dict:
  """The report's numbers as plain data (`launch.compile --json`); with
  `counts`, the estimated time of an RL step and of the run."""
  out = {
      "topology": topology,
      "chip": chip.name,
      "hbm_bytes": chip.hbm_bytes,
      "peak_flops": chip.peak_flops,
      "hbm_bandwidth": chip.hbm_bandwidth,
      "mesh_shape": mesh_shape,
      "programs": programs_json(results, chip),
  }
  if counts is not None:
    out["estimate"] = time_report.estimate_json(results, counts)
  return out


def format_report(
    results: list[Result],
    chip: accelerators.Accelerator,
    mesh_shape: dict,
    topology: str,
    counts: Optional[step_estimate.StepCounts] = None,
) -> str:
  """Per-chip bytes of every program: compiler, planner, ratio and fit; each
  program's roofline; with `counts`, an RL step's and the run's time."""
  lines = [
      f"{topology}: {math.prod(mesh_shape.values())} devices of {chip.name} "
      f"({chip.hbm_bytes / accelerators.GB:.0f} GB HBM each), mesh {mesh_shape}",
      "",
  ]
  lines += program_lines(results, chip)
  fits = all(r.fits(chip.hbm_bytes) for r in results)
  lines += [
      "",
      f"The run {'fits' if fits else 'does NOT fit'} on {topology}: every program's "
      f"peak plus what the run holds beside it {'is' if fits else 'must be'} within "
      f"{chip.hbm_bytes / accelerators.GB:.0f} GB per device.",
      "ratio = planner / compiler peak. 'beside': bytes the other phase keeps allocated "
      "(exact, from the shardings). On TPU each program is compiled within the HBM "
      "less 'beside'.",
      "",
  ]
  lines += time_report.roofline_lines(results, chip)
  if counts is not None:
    lines += [""] + time_report.step_lines(
        results, counts, math.prod(mesh_shape.values()) // chip.devices_per_chip
    )
  return "\n".join(lines) + "\n"


def programs_json(
    results: list[Result], chip: accelerators.Accelerator
) -> list[dict]:
  """Each result as plain data, with its fit and its planner ratios."""
  return [
      dict(
          dataclasses.asdict(r),
          fits=r.fits(chip.hbm_bytes),
          planner_ratio=r.planner_ratio(),
          least_peak=r.least_peak(),
      )
      for r in results
  ]


def program_lines(
    results: list[Result], chip: accelerators.Accelerator
) -> list[str]:
  """Per-device bytes of each program (compiler, planner, ratio, what is
  beside it, fit), its least peak where measured, and a decode step's bytes
  against its floor."""
  gb = lambda n: f"{n / accelerators.GB:8.3f}"
  lines = [
      "Per device, GB (compiler | planner estimate):",
      f"  {'program':12s} {'args':>8s} {'outputs':>8s} {'aliased':>8s} {'temps':>8s} "
      f"{'peak':>8s} | {'plan':>8s} {'ratio':>6s} | {'beside':>8s} {'total':>8s} "
      f"{'fits':>5s} {'compile':>8s}",
  ]
  for r in results:
    est = r.estimate.peak
    if r.compiled is None:
      lines.append(
          f"  {r.name:12s} {'refused':>8s} {'':>8s} {'':>8s} {'':>8s} {'':>8s} | "
          f"{gb(est)} {'':>6s} | {gb(r.beside)} {'':>8s} {'no':>5s} "
          f"{r.compile_s:7.1f}s"
      )
      lines.append(f"      compiler: {r.error}")
      continue
    c = r.compiled
    lines.append(
        f"  {r.name:12s} {gb(c.arguments)} {gb(c.outputs)} {gb(c.aliased)} {gb(c.temporaries)} "
        f"{gb(c.peak)} | {gb(est)} {est / max(c.peak, 1):6.2f} | {gb(r.beside)} "
        f"{gb(c.peak + r.beside)} {'yes' if r.fits(chip.hbm_bytes) else 'no':>5s} "
        f"{r.compile_s:7.1f}s"
    )
  for r in results:
    least = r.least_peak()
    if least is not None:
      ratio = r.planner_ratio()
      within = 1 / PLANNER_TOLERANCE <= ratio <= PLANNER_TOLERANCE
      refused = (
          f", refused within {r.least_refused / accelerators.GB:.3f}"
          if r.least_refused
          else ""
      )
      lines.append(
          f"  {r.name}: the compiler's least peak {least / accelerators.GB:.3f} GB "
          f"(temps {r.least_temporaries / accelerators.GB:.3f}{refused}; "
          f"{r.least_compiles} compiles): planner / least "
          f"{ratio:.2f}, {'within' if within else 'NOT within'} "
          f"{PLANNER_TOLERANCE}x"
      )
    elif r.least_refusal:
      lines.append(f"  {r.name}: no least peak: {r.least_refusal}")
  for r in results:
    if r.decode_floor and r.cost and "bytes accessed" in r.cost:
      seen = r.cost["bytes accessed"]
      kernel = (
          f" + {r.kernel_reads / accelerators.GB:.3f} GB its Pallas kernel reads "
          "(the allocated cache at full length, once: the cost analysis does "
          "not see them)"
          if r.kernel_reads
          else ""
      )
      lines.append(
          f"  {r.name}: the compiler's bytes accessed per decode step "
          f"{seen / accelerators.GB:.3f} GB{kernel} = "
          f"{(seen + r.kernel_reads) / r.decode_floor:.2f}x the floor (weights "
          f"+ the filled cache read once, {r.decode_floor / accelerators.GB:.3f} GB)"
      )
    if r.decode_floor and r.loop_hbm_bytes:
      kernel = r.kernel_hbm_reads()
      lines.append(
          f"  {r.name}: counted from the compiled loop's HBM buffers "
          f"(jobs/planner/hlo_traffic.py; on-chip copies not counted again) "
          f"{r.loop_hbm_bytes / accelerators.GB:.3f} GB + {kernel / accelerators.GB:.3f}"
          f" GB the kernel reads from HBM = "
          f"{(r.loop_hbm_bytes + kernel) / r.decode_floor:.2f}x the floor"
      )
  return lines
