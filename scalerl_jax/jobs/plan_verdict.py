"""A registered plan's verdicts, early calls and variance components, read
from its runs (`launch.verdict`).

Runs live at `<runs>/base=B/seed=S/<point>`, one sweep per replicate as the
plan's docstring runs them; a run counts once its DONE file exists. The
tables come out as Markdown, in the order docs/ablations.md opens with.

Design: docs/design/verdicts.md.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Optional

import numpy as np

from scalerl_jax import warm_start
from scalerl_jax import workdir as workdir_lib
from scalerl_jax.jobs import registration
from scalerl_jax.scaling import paired
from scalerl_jax.scaling import registered_plan as plan_lib
from scalerl_jax.scaling import runs as runs_lib
from scalerl_jax.scaling import significance

X_KEY = "compute/flops"
Y_KEY = "val/mean_at_k"
STDERR_KEY = "val/mean_at_k_stderr"
# Validations averaged into the end point shown beside the fitted values.
END_POINT_LAST = 2
GATE_FILE = warm_start.GATE_FILE


@dataclasses.dataclass
class RunFits:
  """One finished run, its full and early fits, and its start record."""

  run: runs_lib.Run
  final: object  # curves.CurveFit
  early: object  # curves.CurveFit
  record: Optional[dict]
  gate: Optional[dict]


def replicate_dir(runs_dir: str, rep: plan_lib.Replicate) -> str:
  return os.path.join(runs_dir, f"base={rep[0]}", f"seed={rep[1]}")


def _read_json(path):
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


def read_gate(point_dir: str) -> Optional[dict]:
  """The gate record a point's run wrote (GATE_FILE), or None."""
  return _read_json(os.path.join(point_dir, GATE_FILE))


def replicate_gate(rep_dir: str, points) -> Optional[dict]:
  """The gate record of the first of `points` below `rep_dir` that wrote
  one (every point of a replicate gates the same base), or None."""
  for point in points:
    gate = read_gate(os.path.join(rep_dir, point))
    if gate is not None:
      return gate
  return None


def load_runs(
    plan: plan_lib.Plan, runs_dir: str
) -> dict[tuple[plan_lib.Replicate, str], RunFits]:
  """(replicate, point) -> RunFits of every finished run of the plan, each
  run up to the steps its point is registered for."""
  out = {}
  for base in plan.bases + plan.spare_bases:
    for seed in plan.rl_seeds:
      for point in plan.points:
        workdir = os.path.join(replicate_dir(runs_dir, (base, seed)), point)
        if not workdir_lib.is_finished(workdir):
          continue
        run = plan_lib.registered_part(
            runs_lib.read_run(workdir, x_key=X_KEY, y_key=Y_KEY),
            plan.steps_of(point),
        )
        out[(base, seed), point] = RunFits(
            run,
            plan_lib.fit_run(run),
            plan_lib.fit_run(run, plan.early_fraction),
            _read_json(os.path.join(workdir, registration.REGISTRATION_FILE)),
            read_gate(workdir),
        )
  return out


def short_runs(plan: plan_lib.Plan, found: dict) -> str:
  """The runs that stopped before the steps their point is registered for,
  each with its last step and the training prompts retired by then (a run
  stops early when No-Positive-Resampling has retired every training
  prompt). They are fitted, and called early, on the compute they reached,
  as every run is; this names them so that a reader can weigh it."""
  lines = []
  for (rep, point), f in sorted(found.items()):
    registered = plan.steps_of(point)
    last = int(f.run.steps[-1]) if len(f.run.steps) else 0
    # Every line of metrics.jsonl carries "step": the last one written.
    logged = runs_lib.read_run(f.run.workdir, x_key="step", y_key="step")
    stopped = int(logged.steps[-1]) if len(logged.steps) else None
    if stopped is not None and stopped < registered:
      n = paired.mechanism_size(f.run.workdir, "prompts_retired", "last")
      retired = "-" if n is None else f"{n:.0f}"
      lines.append(
          f"- base {rep[0]}, seed {rep[1]}, {point}: stopped at step {stopped}"
          f" of {registered} (last validation at step {last}; prompts retired"
          f" by then: {retired})"
      )
  if not lines:
    return "Every run reached its registered steps."
  return (
      f"{len(lines)} of {len(found)} runs stopped before their registered "
      "steps, fitted on the compute they reached:\n" + "\n".join(lines)
  )


def warm_dir(runs_dir: str, base: int) -> str:
  """Where launch.plan_sweep warm-starts and gates `base` alone."""
  return os.path.join(runs_dir, "bases", f"warm={base}")


def load_gates(plan: plan_lib.Plan, runs_dir: str, found: dict) -> dict:
  """base -> its gate record: from its warm start alone, else from a run."""
  gates = {}
  for base in plan.bases + plan.spare_bases:
    for point in plan.points:
      g = read_gate(os.path.join(warm_dir(runs_dir, base), point))
      if g is not None:
        gates[base] = g
  for (rep, _), f in sorted(found.items()):
    if f.gate is not None:
      gates.setdefault(rep[0], f.gate)
  return gates


def replicates(
    plan: plan_lib.Plan, gates: dict
) -> tuple[plan_lib.Replicate, ...]:
  """The registered replicates: the plan's bases, each that failed its gate
  replaced by the next spare (as launch.plan_sweep runs them), x the RL
  seeds. `gates` maps a base to its gate record (`load_gates`)."""
  failed = {b for b, g in gates.items() if not g.get("passed", True)}
  queue, spares, bases = list(plan.bases), list(plan.spare_bases), []
  while queue:
    base = queue.pop(0)
    if base not in failed:
      bases.append(base)
    elif spares:
      queue.append(spares.pop(0))
  return tuple((b, s) for b in bases for s in plan.rl_seeds)


def _statistic(plan, claim, first: RunFits, second: RunFits, which: str):
  """(first, second) of the claim's statistic on the `which` fits, None for
  a run whose fit is not pinned (B_shared: both None unless both pin)."""
  fa, fb = getattr(first, which), getattr(second, which)
  pinned = [f.fit is not None and f.fit.reliable for f in (fa, fb)]
  if claim.statistic == "A_fit":
    return tuple(f.fit.a if ok else None for f, ok in zip((fa, fb), pinned))
  if not all(pinned):
    return (None, None)
  fraction = 1.0 if which == "final" else plan.early_fraction
  return plan_lib.shared_b(first.run, second.run, fraction)


def claim_results(plan, found, gates, which="final"):
  """ClaimResult per claim on the `which` ("final" or "early") fits."""
  reps = replicates(plan, gates)
  out = []
  for claim in plan.claims:
    stat, mech, ends = {}, {}, {}
    for rep in reps:
      a, b = found.get((rep, claim.first)), found.get((rep, claim.second))
      if a is None or b is None:
        continue
      stat[rep] = _statistic(plan, claim, a, b, which)
      key, how = claim.mechanism
      mech[rep] = tuple(
          paired.mechanism_size(f.run.workdir, key, how) for f in (a, b)
      )
      ends[rep] = tuple(
          paired.final_score(f.run, END_POINT_LAST) for f in (a, b)
      )
    out.append(plan_lib.decide(plan, claim, stat, mech, ends, reps))
  return out


def _fmt(x, spec=".3f"):
  return "-" if x is None else format(x, spec)


@dataclasses.dataclass
class Reading:
  """A plan's runs read and decided: what the tables print."""

  plan: plan_lib.Plan
  found: dict  # (replicate, point) -> RunFits (`load_runs`).
  gates: dict  # base -> gate record (`load_gates`).
  # claim name -> (confirmatory?, why not, registration), jobs/registration.
  status: dict
  results: list  # registered_plan.ClaimResult per claim, on the final fits.
  family: list  # The confirmatory claims: Holm's family.
  decided: dict  # claim name -> (verdict, Holm-adjusted p).
  early: str  # The early call against the final verdict, claim by claim.
  score: "Score"  # Its counts (`score`).


def read(plan, plan_path: str, runs_dir: str, repo: str) -> Reading:
  """Reads `plan`'s runs below `runs_dir` and decides its claims, each
  classified by git's history of `plan_path` in `repo`."""
  found = load_runs(plan, runs_dir)
  gates = load_gates(plan, runs_dir, found)
  reps = set(replicates(plan, gates))
  records = {
      p: [
          f.record or {}
          for (rep, q), f in found.items()
          if q == p and rep in reps
      ]
      for p in plan.points
  }
  status = registration.classify(plan, plan_path, records, repo)
  results = claim_results(plan, found, gates)
  family = [c.name for c in plan.claims if status[c.name][0]]
  decided = plan_lib.verdicts(plan, results, family)
  early, tally = score(
      plan, found, gates, {k: v[0] for k, v in decided.items()}
  )
  return Reading(
      plan, found, gates, status, results, family, decided, early, tally
  )


def verdict_table(reading: Reading) -> str:
  """The confirmatory-and-exploratory table."""
  lines = [
      "| claim | paper | statistic | ours: first - second [95% CI] | n "
      "(pinned / registered) | p (Holm) | verdict | end point (last "
      f"{END_POINT_LAST}) | mechanism: first / second | registration |",
      "|---|---|---|---|---|---|---|---|---|---|",
  ]
  for r in reading.results:
    c = r.claim
    verdict, p_adj = reading.decided[c.name]
    confirm, why, reg = reading.status[c.name]
    n_reg = len(r.replicates) + len(r.unpinned) + len(r.missing)
    effect = (
        f"{r.test.mean:+.3f} [{r.test.ci[0]:+.3f}, {r.test.ci[1]:+.3f}]"
        if r.test
        else "-"
    )
    end = (
        f"{r.end_point.mean:+.3f} [{r.end_point.ci[0]:+.3f}, "
        f"{r.end_point.ci[1]:+.3f}]"
        if r.end_point
        else "-"
    )
    label = "confirmatory" if confirm else f"exploratory: {why}"
    rel = ">" if c.relation == "higher" else "="
    lines.append(
        f"| {c.name}: {c.first} {rel} {c.second} | {c.paper} | {c.statistic} "
        f"| {effect} | {len(r.replicates)} / {n_reg} | {_fmt(r.p, '.3g')} "
        f"({_fmt(p_adj, '.3g')}) | {verdict} | {end} | {c.mechanism[0]}: "
        f"{_fmt(r.mechanism[0], '.4g')} / {_fmt(r.mechanism[1], '.4g')} "
        f"| {label}; {reg.commit[:8] if reg.commit else 'uncommitted'} |"
    )
  return "\n".join(lines)


# The verdicts that decide a claim one way: an early call of one and a final
# verdict of the other is the early call's worst error.
_DIRECTIONS = ("agrees", "disagrees")


@dataclasses.dataclass
class Score:
  """The early call against the final verdict, counted over claims, and
  |A_early - A_final| over runs; scores of several plans add up."""

  claims: int = 0
  same: int = 0
  decided: int = 0  # Claims the final verdict decided (not inconclusive).
  same_decided: int = 0
  opposite: int = 0  # Early and final verdicts decided opposite ways.
  gaps: tuple[float, ...] = ()

  def __add__(self, other: "Score") -> "Score":
    return Score(
        *(
            getattr(self, f.name) + getattr(other, f.name)
            for f in dataclasses.fields(self)
        )
    )

  def summary(self) -> str:
    gaps = self.gaps
    return (
        f"Early call right on {self.same} of {self.claims} claims, on "
        f"{self.same_decided} of the {self.decided} the final verdict "
        f"decided; the opposite of the final verdict on {self.opposite}. "
        f"|A_early - A_final| over {len(gaps)} runs: median "
        f"{_fmt(float(np.median(gaps)) if gaps else None)}, max "
        f"{_fmt(max(gaps) if gaps else None)}."
    )


def score(plan, found, gates, final_verdicts) -> tuple[str, Score]:
  """How often the early call (first `early_fraction` of each run's compute,
  extrapolated) matched the final verdict, and how far early A fell from
  final A: the claim-by-claim table and its Score."""
  early = plan_lib.verdicts(
      plan,
      claim_results(plan, found, gates, "early"),
      [c.name for c in plan.claims if c.confirmatory],
  )
  gaps = tuple(
      abs(f.early.fit.a - f.final.fit.a)
      for f in found.values()
      if f.early.fit is not None and f.final.fit is not None
  )
  lines = [
      f"| claim | early call ({plan_lib.fraction_of(plan.early_fraction)} "
      "of compute) | final verdict | same |",
      "|---|---|---|---|",
  ]
  tally = Score(claims=len(plan.claims), gaps=gaps)
  for c in plan.claims:
    e, f = early[c.name][0], final_verdicts[c.name]
    tally.same += e == f
    tally.opposite += e != f and e in _DIRECTIONS and f in _DIRECTIONS
    # Inconclusive at both ends is a match that calls nothing.
    if not f.startswith("inconclusive"):
      tally.decided += 1
      tally.same_decided += e == f
    lines.append(f"| {c.name} | {e} | {f} | {'yes' if e == f else 'no'} |")
  return "\n".join(lines), tally


def scorecard(plan, found, gates, final_verdicts) -> str:
  """`score`'s table and its summary line."""
  table, tally = score(plan, found, gates, final_verdicts)
  return table + "\n\n" + tally.summary()


def across_plans(readings: list[Reading]) -> str:
  """Several plans together: every confirmatory claim with its own plan's
  Holm-adjusted p and with Holm's correction run once over all of them (a
  sensitivity reading; each plan's registered family decides its verdicts),
  then the early-call scorecard summed over the plans."""
  across = plan_lib.holm_across(
      [(r.plan, r.results, r.family) for r in readings]
  )
  lines = [
      "| plan | claim | p | p (Holm, its plan) | verdict | p (Holm, all "
      "plans) | verdict, all plans |",
      "|---|---|---|---|---|---|---|",
  ]
  for r in readings:
    for result in r.results:
      name = result.claim.name
      if name not in r.family:
        continue
      verdict, p_plan = r.decided[name]
      verdict_all, p_all = across[r.plan.name, name]
      lines.append(
          f"| {r.plan.name} | {name} | {_fmt(result.p, '.3g')} | "
          f"{_fmt(p_plan, '.3g')} | {verdict} | {_fmt(p_all, '.3g')} | "
          f"{verdict_all} |"
      )
  total = sum((r.score for r in readings), Score())
  lines += ["", f"Over the {len(readings)} plans: {total.summary()}"]
  return "\n".join(lines)


def components(plan, found, gates, point: str) -> str:
  """Variance components of `point`'s fitted A (pinned runs) and its last
  validation's measured sampling variance."""
  by_base: dict[int, list[float]] = {}
  val_var = []
  reps = set(replicates(plan, gates))
  for (rep, p), f in found.items():
    if p != point or rep not in reps:
      continue
    if f.final.fit is not None and f.final.fit.reliable:
      by_base.setdefault(rep[0], []).append(f.final.fit.a)
    se = paired.mechanism_size(f.run.workdir, STDERR_KEY, "last")
    if se is not None:
      val_var.append(se**2)
  usable = {b: v for b, v in by_base.items() if len(v) >= 2}
  val = float(np.mean(val_var)) if val_var else 0.0
  try:
    c = significance.variance_components(usable, val)
  except ValueError as e:
    return f"{point}: variance components not yet measurable ({e})"
  return (
      f"{point}, fitted A: between bases {c.base:.2e} (sd {c.base**0.5:.3f}), "
      f"between seeds of a base {c.seed:.2e} (sd {c.seed**0.5:.3f}), one "
      f"validation's sampling {c.validation:.2e} (sd {c.validation**0.5:.3f}); "
      f"{c.num_bases} bases, {c.seeds_per_base:g} seeds each"
  )


def gate_table(gates) -> str:
  """Each warm-started base's gate record, passes and failures alike."""
  seen = gates
  lines = ["| base | passed | measured (levels 1-4: chain exact / P(chain)) |"]
  lines.append("|---|---|---|")
  for base, g in sorted(seen.items()):
    m = g["measured"]
    levels = " ".join(
        f"{m[f'chain_exact/{l}']:.2f}/{m[f'p_chain/{l}']:.2f}"
        for l in (1, 2, 3, 4)
    )
    lines.append(f"| {base} | {'yes' if g['passed'] else 'no'} | {levels} |")
  passed = sum(g["passed"] for g in seen.values())
  lines.append("")
  lines.append(f"Gate passed by {passed} of {len(seen)} bases warm-started.")
  return "\n".join(lines)
