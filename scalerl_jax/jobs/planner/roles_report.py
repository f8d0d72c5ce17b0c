"""The compile report of a slice split between the roles (`aot_roles`): each
role's programs per device as `aot_report` prints a colocated run's, the
weight sync per step beside the anchors (`weight_sync`), and the roles' time
per RL step."""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

from scalerl_jax.jobs.planner import accelerators
from scalerl_jax.jobs.planner import aot_report
from scalerl_jax.jobs.planner import roofline
from scalerl_jax.jobs.planner import step_estimate
from scalerl_jax.jobs.planner import time_report
from scalerl_jax.jobs.planner import weight_sync
from scalerl_jax.jobs.planner.aot_roles import ROLES
from scalerl_jax.jobs.planner.aot_roles import RolesCompile
from scalerl_jax.jobs.planner.aot_roles import role_of


def format_roles_report(
    rc: RolesCompile,
    topology: str,
    counts: Optional[step_estimate.StepCounts] = None,
) -> str:
  """Each role's programs, the sync, each program's roofline; with `counts`,
  each role's time per RL step and the step's bounds."""
  chip = rc.chip
  total = sum(math.prod(m.values()) for m in rc.meshes.values())
  lines = [
      f"{topology}: {total} devices of {chip.name} ({chip.hbm_bytes / accelerators.GB:.0f}"
      " GB HBM each), split between the roles (mesh.layout='disaggregated')",
  ]
  for role, results in rc.results.items():
    mesh = rc.meshes[role]
    lines += [
        "",
        f"The {role}: {math.prod(mesh.values())} devices, mesh {mesh}",
    ]
    lines += aot_report.program_lines(results, chip)
  everything = [r for results in rc.results.values() for r in results]
  fits = all(r.fits(chip.hbm_bytes) for r in everything)
  lines += [
      "",
      f"The run {'fits' if fits else 'does NOT fit'} on {topology}: every "
      f"program's peak plus what its role's devices hold beside it "
      f"{'is' if fits else 'must be'} within "
      f"{chip.hbm_bytes / accelerators.GB:.0f} GB per device.",
      "ratio = planner / compiler peak. 'beside': bytes the role's devices keep "
      "allocated meanwhile (the trainer's: nothing of the generator's; the "
      "generator's: the parameters moved there, and the rollout slots during "
      "validation and the regroup). On TPU each program is compiled within "
      "the HBM less 'beside'.",
      "",
  ]
  lines += weight_sync.sync_lines(rc.sync, chip)
  lines += [""] + time_report.roofline_lines(everything, chip)
  if counts is not None:
    lines += [""] + _step_lines(rc, counts)
  return "\n".join(lines) + "\n"


def role_counts(
    counts: step_estimate.StepCounts, role: str
) -> step_estimate.StepCounts:
  """`counts` of `role`'s programs only."""
  mine = lambda runs: {k: n for k, n in runs.items() if role_of(k) == role}
  return dataclasses.replace(
      counts,
      per_step=mine(counts.per_step),
      per_validation=mine(counts.per_validation),
  )


def _estimates(
    rc: RolesCompile, counts: step_estimate.StepCounts
) -> dict[str, step_estimate.Estimate]:
  return {
      role: step_estimate.estimate(
          time_report.rooflines(results), role_counts(counts, role)
      )
      for role, results in rc.results.items()
  }


def _step_lines(
    rc: RolesCompile, counts: step_estimate.StepCounts
) -> list[str]:
  """Each role's seconds per RL step, the sync's, and the step's bounds."""
  est = _estimates(rc, counts)
  sync = rc.sync.seconds(weight_sync.DTYPES[0]) or 0.0
  trainer, generator = (est[r].step_seconds for r in ROLES)
  partial = any(e.missing for e in est.values())
  lines = [
      f"One RL step, {roofline.LABEL}, every completion "
      f"{counts.completion_len:,} tokens, {counts.num_slots:,} rollout slots "
      "busy, validation amortised:",
  ]
  for role, e in est.items():
    lacking = (
        f" (PARTIAL: no roofline for {', '.join(e.missing)})"
        if e.missing
        else ""
    )
    lines.append(f"  the {role}: {e.step_seconds:.4g} s{lacking}")
  lines += [
      f"  the weight sync (float32): {sync:.4g} s",
      "  The roles overlap as far as buffer.sync_at_decode_step lets the "
      "generator decode during the train step: a step takes at least "
      f"max(trainer, generator + sync) = {max(trainer, generator + sync):.4g} s "
      "(a generator that never waits) and at most trainer + generator + sync "
      f"= {trainer + generator + sync:.4g} s (no overlap)"
      + (" (PARTIAL)." if partial else "."),
      "  " + time_report.LEFT_OUT,
  ]
  return lines


def roles_json(
    rc: RolesCompile,
    topology: str,
    counts: Optional[step_estimate.StepCounts] = None,
) -> dict:
  """The report's numbers as plain data (`launch.compile --json`)."""
  out = {
      "topology": topology,
      "layout": "disaggregated",
      "chip": rc.chip.name,
      "hbm_bytes": rc.chip.hbm_bytes,
      "peak_flops": rc.chip.peak_flops,
      "hbm_bandwidth": rc.chip.hbm_bandwidth,
      "ici_bandwidth": rc.chip.ici_bandwidth,
      "roles": {
          role: {
              "mesh_shape": rc.meshes[role],
              "programs": aot_report.programs_json(results, rc.chip),
          }
          for role, results in rc.results.items()
      },
      "weight_sync": weight_sync.sync_json(rc.sync),
  }
  if counts is not None:
    for role, results in rc.results.items():
      out["roles"][role]["estimate"] = time_report.estimate_json(
          results, role_counts(counts, role)
      )
  return out
