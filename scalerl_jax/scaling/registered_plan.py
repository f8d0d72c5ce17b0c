"""A registered plan: claims decided on paired replicates of fitted curves.

A plan (`Plan`, defined as PLAN in a sweep file under configs/plans/) fixes,
before any of its runs start: the claims (two points, a relation, the
statistic), the test (level, correction, equivalence margin), the replicates
(warm-started bases x RL seeds), the compute each run goes to, and the
thresholds (the base gate, a mechanism's least size, the pinned pairs a
claim needs). jobs/registration.py decides from git whether each claim was
committed before its runs started; this module decides the claims.

Each run's statistic comes from its own fit by the paper's procedure
(`curves.fit_curve`):
- "A_fit": the fitted asymptote A;
- "B_shared": the fitted exponent B after both runs of a pair are refitted
  with one shared A (`sigmoid.fit_shared_a`, the paper's way to compare B).
A pair counts only when both runs' fits are pinned (`SigmoidFit.reliable`,
the rule launch.fit marks "reliable" by); a claim with fewer than
`min_pinned` such pairs is "inconclusive (fits not pinned)", never moved to
another statistic. The early call repeats the verdict with each run fitted
on its first `early_fraction` of compute (curves.fit_curve's fit_fraction).
Every run is read up to the steps its point is registered for
(`Plan.steps_of`), so compute is the plan's, not however far a run went.

Verdicts: "higher" claims by the two-sided paired t test, "same" claims by
TOST against `equivalence_margin`, with Holm's correction across the plan's
confirmatory claims (significance.py). A "same" verdict counts only where the
mechanism acted: the mean of |mechanism(first) - mechanism(second)| over
pairs is at least the claim's `mechanism_threshold`; otherwise "mechanism
idle".

Shape letters: R replicates.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from typing import Mapping, Optional, Sequence

import numpy as np

from scalerl_jax.scaling import curves
from scalerl_jax.scaling import runs as runs_lib
from scalerl_jax.scaling import sigmoid
from scalerl_jax.scaling import significance
from scalerl_jax.scaling import uncertainty

STATISTICS = {
    "A_fit": "the fitted asymptote A of each run's own sigmoid",
    "B_shared": "the fitted exponent B, both runs of a pair refitted with "
    "one shared A",
}
RELATIONS = ("higher", "same")
# A replicate: (warm-start base seed, RL seed).
Replicate = tuple[int, int]


@dataclasses.dataclass(frozen=True)
class PlannedClaim:
  """One registered claim on two points of the plan."""

  name: str  # Unique within the plan.
  first: str  # Point names (the plan's sweep points).
  relation: str  # "higher" (first above second) or "same".
  second: str
  statistic: str  # A key of STATISTICS.
  paper: str  # The paper's numbers or words (PAPER.md).
  # The effect the replicates were sized for (0 for "same": equivalence).
  effect: float
  # The paired sd assumed for the power analysis, and where it was measured.
  sd: float
  sd_source: str
  # (logged key, "mean" | "last" | "first"): the quantity the paper says the
  # choice acts through; its size is reported for every claim.
  mechanism: tuple[str, str]
  # "same" claims: the least mean |first - second| of the mechanism for the
  # verdict to count; below it, "mechanism idle".
  mechanism_threshold: float = 0.0
  confirmatory: bool = True  # In the Holm family.

  def __post_init__(self):
    if self.relation not in RELATIONS or self.statistic not in STATISTICS:
      raise ValueError(
          f"claim {self.name!r}: relation in {RELATIONS} and statistic in "
          f"{tuple(STATISTICS)}; got {self.relation!r}, {self.statistic!r}"
      )


@dataclasses.dataclass(frozen=True)
class Plan:
  """Everything registered before the runs (see the module docstring)."""

  name: str
  points: tuple[str, ...]
  claims: tuple[PlannedClaim, ...]
  bases: tuple[int, ...]  # Warm-start seeds, in the order they are used.
  spare_bases: tuple[int, ...]  # Used in order for bases failing the gate.
  rl_seeds: tuple[int, ...]  # RL seeds on each base.
  steps: int  # RL steps of every run (its registered compute): `steps_of`.
  step_overrides: Mapping[str, int]  # Points that run other steps.
  base_gate: Mapping[str, object]  # parity_gate.check's gate.
  alpha: float = 0.05
  correction: str = "holm"
  equivalence_margin: float = 0.02
  power: float = 0.8
  min_pinned: int = 4  # Pairs with both fits pinned a claim needs.
  early_fraction: float = 1 / 3

  def claim_identity(self, claim: PlannedClaim) -> str:
    """Hash of the claim and of everything in the plan that decides it: a
    claim whose identity changes is a new claim, registered anew."""
    family = sorted(c.name for c in self.claims if c.confirmatory)
    fields = {
        "claim": dataclasses.asdict(claim),
        "family": family if claim.confirmatory else [],
        "test": [self.alpha, self.correction, self.equivalence_margin],
        "min_pinned": self.min_pinned,
        "early_fraction": self.early_fraction,
        "replicates": [list(self.bases), list(self.rl_seeds)],
        "steps": [self.steps, dict(sorted(self.step_overrides.items()))],
        "base_gate": {k: self.base_gate[k] for k in sorted(self.base_gate)},
    }
    return hashlib.sha256(
        json.dumps(fields, sort_keys=True, default=list).encode()
    ).hexdigest()[:16]

  def steps_of(self, point: str) -> int:
    """The RL steps `point`'s runs are registered for: its compute."""
    return self.step_overrides.get(point, self.steps)

  def replicates_needed(self) -> dict[str, int]:
    """confirmatory claim -> the replicates its registered effect and sd need
    for `power` at `alpha` (uncorrected; TOST at `equivalence_margin` for
    "same")."""
    return {
        c.name: significance.replicates_for_power(
            c.effect,
            c.sd,
            self.power,
            self.alpha,
            equivalence_margin=(
                self.equivalence_margin if c.relation == "same" else 0.0
            ),
        )
        for c in self.claims
        if c.confirmatory
    }


def parse_base(
    arg: Optional[str],
    plan_file: str,
    bases: Sequence[int],
    spare_bases: Sequence[int],
) -> int:
  """The base of a plan file's 'base=<seed>' argument; ValueError naming
  `plan_file` and the registered bases for anything else."""
  fields = dict(kv.split("=", 1) for kv in (arg or "").split(",") if kv)
  registered = tuple(bases) + tuple(spare_bases)
  if set(fields) != {"base"}:
    raise ValueError(
        f"{plan_file} takes 'base=<seed>' (one of {registered}); got {arg!r}"
    )
  base = int(fields["base"])
  if base not in registered:
    raise ValueError(
        f"base {base} is not registered: {tuple(bases)} then spares "
        f"{tuple(spare_bases)}"
    )
  return base


def registered_part(run: runs_lib.Run, end_step: int) -> runs_lib.Run:
  """`run` up to `end_step`, the steps its point is registered for: a run
  that went on past them is fitted, called early and given its end point on
  the registered compute alone."""
  keep = run.steps <= end_step
  return dataclasses.replace(
      run,
      steps=run.steps[keep],
      compute=run.compute[keep],
      score=run.score[keep],
  )


def fit_run(run: runs_lib.Run, fit_fraction: float = 1.0) -> curves.CurveFit:
  """A run's fit by the paper's procedure with the bootstrap that decides
  whether it is pinned; with fit_fraction < 1, on that share of its
  compute."""
  return curves.fit_curve(
      run.steps,
      run.compute,
      run.score,
      fit_fraction=fit_fraction,
      num_bootstrap=uncertainty.NUM_BOOTSTRAP,
  )


def shared_b(
    first: runs_lib.Run, second: runs_lib.Run, fit_fraction: float = 1.0
) -> tuple[float, float]:
  """B of each run when both are refitted with one shared A, on their
  first `fit_fraction` of compute (as fit_run leaves out the same start)."""
  pair = []
  for run in (first, second):
    end = fit_fraction * run.compute[run.steps > 0][-1]
    # Step 0 stays in: each curve's R_0 is its own measured score there.
    keep = run.compute <= end * (1 + 1e-9)
    pair.append((run.compute[keep], run.score[keep]))
  fits = sigmoid.fit_shared_a(
      pair, min_compute=curves.SKIP_FRACTION * max(c[-1] for c, _ in pair)
  )
  return fits[0].b, fits[1].b


@dataclasses.dataclass(frozen=True)
class ClaimResult:
  """A claim decided on its replicates."""

  claim: PlannedClaim
  replicates: tuple[Replicate, ...]  # Pairs both of whose fits pinned.
  unpinned: tuple[Replicate, ...]  # Pairs with a fit that did not pin.
  missing: tuple[Replicate, ...]  # Registered pairs without both runs.
  differences: tuple[float, ...]  # first - second per counted pair.
  test: Optional[significance.PairedTest]
  p: Optional[float]  # Raw p: the t test's, or TOST's for "same".
  mechanism: tuple[Optional[float], Optional[float]]  # Mean per point.
  end_point: Optional[significance.PairedTest]  # Last validation, beside.


def _mean_or_none(values):
  values = [v for v in values if v is not None]
  return float(np.mean(values)) if values else None


def decide(
    plan: Plan,
    claim: PlannedClaim,
    statistic: Mapping[Replicate, tuple[Optional[float], Optional[float]]],
    mechanism: Mapping[Replicate, tuple[Optional[float], Optional[float]]],
    end_points: Mapping[Replicate, tuple[float, float]],
    registered: Sequence[Replicate],
) -> ClaimResult:
  """The claim's paired result. `statistic` maps a replicate with both runs
  to (first, second), None where that run's fit is not pinned; `mechanism`
  to each run's mechanism size; `end_points` to each run's last
  validation."""
  counted, unpinned, missing, d = [], [], [], []
  for rep in registered:
    if rep not in statistic:
      missing.append(rep)
      continue
    a, b = statistic[rep]
    if a is None or b is None:
      unpinned.append(rep)
      continue
    counted.append(rep)
    d.append(a - b)
  test = p = None
  if len(d) >= 2:
    test = significance.paired_t(d, plan.alpha)
    p = (
        significance.tost(d, plan.equivalence_margin)
        if claim.relation == "same"
        else test.p
    )
  ends = [
      end_points[r][0] - end_points[r][1] for r in registered if r in end_points
  ]
  mech = tuple(
      _mean_or_none(mechanism[r][i] for r in registered if r in mechanism)
      for i in (0, 1)
  )
  return ClaimResult(
      claim,
      tuple(counted),
      tuple(unpinned),
      tuple(missing),
      tuple(d),
      test,
      p,
      mech,
      significance.paired_t(ends, plan.alpha) if len(ends) >= 2 else None,
  )


def mechanism_acted(result: ClaimResult) -> Optional[bool]:
  """Whether the mechanism's sizes differ by the claim's threshold; None
  when a point never logged it."""
  first, second = result.mechanism
  if first is None or second is None:
    return None
  return abs(first - second) >= result.claim.mechanism_threshold


def corrected_family(
    plan: Plan, results: Sequence[ClaimResult], family: Sequence[str]
) -> dict[str, float]:
  """claim name -> raw p of the claims in `family` that enter Holm's
  correction: those with a p on at least `min_pinned` pinned pairs."""
  return {
      r.claim.name: r.p
      for r in results
      if r.claim.name in family
      and r.p is not None
      and len(r.replicates) >= plan.min_pinned
  }


def verdicts(
    plan: Plan,
    results: Sequence[ClaimResult],
    family: Sequence[str],
    adjusted: Optional[Mapping[str, float]] = None,
) -> dict[str, tuple[str, Optional[float]]]:
  """claim name -> (verdict, Holm-adjusted p) for `results`; `family`
  names the claims in the correction (the confirmatory ones that may
  count; the others are decided alone, uncorrected, as exploratory).
  `adjusted`, when given, holds the family's adjusted p-values from a
  correction made elsewhere (over several plans, `holm_across`) in place of
  Holm's over `family`.

  Verdicts: "agrees", "disagrees", "inconclusive", "inconclusive (fits not
  pinned: k of n pairs)", "mechanism idle".
  """
  if adjusted is None:
    raw = corrected_family(plan, results, family)
    adjusted = significance.holm(raw) if raw else {}
  out = {}
  for r in results:
    name, c = r.claim.name, r.claim
    n_reg = len(r.replicates) + len(r.unpinned) + len(r.missing)
    if r.p is None or len(r.replicates) < plan.min_pinned:
      out[name] = (
          f"inconclusive (fits pinned on {len(r.replicates)} of {n_reg} "
          f"pairs; {plan.min_pinned} needed)",
          None,
      )
      continue
    p = adjusted.get(name, r.p)
    if c.relation == "higher":
      if p < plan.alpha:
        out[name] = ("agrees" if r.test.mean > 0 else "disagrees", p)
      else:
        out[name] = ("inconclusive", p)
      continue
    lo, hi = r.test.ci
    m = plan.equivalence_margin
    if p < plan.alpha:
      verdict = "agrees"
    elif lo > m or hi < -m:
      verdict = "disagrees"
    else:
      verdict = "inconclusive"
    if mechanism_acted(r) is False:
      verdict = "mechanism idle"
    out[name] = (verdict, p)
  return out


def holm_across(
    decided: Sequence[tuple[Plan, Sequence[ClaimResult], Sequence[str]]],
) -> dict[tuple[str, str], tuple[str, Optional[float]]]:
  """(plan name, claim name) -> (verdict, adjusted p) with Holm's correction
  run once over the confirmatory families of every plan in `decided`
  ((plan, results, family) each): a sensitivity reading, stricter than the
  per-plan families the plans register. The plans must share one level."""
  alphas = {plan.alpha for plan, _, _ in decided}
  if len(alphas) > 1:
    raise ValueError(
        f"Holm's correction across plans needs one level; got {sorted(alphas)}"
    )
  names = [plan.name for plan, _, _ in decided]
  if len(set(names)) != len(names):
    raise ValueError(f"each plan once; got {names}")
  raw = {
      (plan.name, claim): p
      for plan, results, family in decided
      for claim, p in corrected_family(plan, results, family).items()
  }
  # significance.holm orders by p; the keys only need to be distinct.
  adjusted = significance.holm(raw) if raw else {}
  out = {}
  for plan, results, family in decided:
    mine = {c: p for (n, c), p in adjusted.items() if n == plan.name}
    for claim, v in verdicts(plan, results, family, mine).items():
      if claim in family:
        out[plan.name, claim] = v
  return out


def fraction_of(value: float) -> str:
  """'1/3' for a third, else the number."""
  for den in (2, 3, 4):
    if math.isclose(value * den, round(value * den)):
      return f"{round(value * den)}/{den}"
  return f"{value:g}"
