"""Deciding between recipes, checking a grid against the paper, and the power-law baseline.

Three seeds of one recipe varied A by up to 0.015 (PAPER.md §1; `seeds.spread`
measures this), so the paper counts a difference in A under 0.02 as noise; such
runs are refitted with a shared A and compared on B. Small runs are noisier
than that, so every decision here also weighs the measured uncertainty u of
each fitted value (one standard deviation: a fit's bootstrap std, or what the
caller supplies, such as the spread over seeds): a difference d between two
recipes counts only when |d| > sqrt(u_1^2 + u_2^2), the uncertainty of the
difference, and in A also |d| >= 0.02. Otherwise the answer is "inconclusive".
A bootstrap sees only the scatter of one run's points about its curve, not how
seeds differ; the floor on A stands for that, and only seeds measure it for B.

`PAPER_CLAIMS` holds, as data, what the paper found on each ablation grid of
configs/ablations/ (keyed by the sweep file's name and its points' names);
`grid_verdicts` checks fitted points against them. A power law fitted to the
same points extrapolates badly (the paper saw A = 1.0); `fit_power_law` is
that baseline.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Mapping, Optional, Protocol, Sequence

import numpy as np
from scipy import optimize

from scalerl_jax.scaling import seeds
from scalerl_jax.scaling import sigmoid
from scalerl_jax.scaling import uncertainty

A_NOISE = 0.02  # Differences in A below this are noise (PAPER.md §1).


class Stds(Protocol):
  """Uncertainties of a fit's A and B: `uncertainty.Uncertainty`, `seeds.Spread`, `Estimate`."""
  a_std: float
  b_std: float


@dataclasses.dataclass(frozen=True)
class Comparison:
  """Which of two recipes is better under the paper's rule, or that the data cannot tell."""
  better: str  # "a", "b" or "inconclusive".
  decided_by: str  # "A" (ceilings differ by at least the noise) or "B" (at a shared A).
  difference: float  # a's value minus b's, of the parameter that decided.
  difference_std: float  # Its uncertainty, sqrt(u_a^2 + u_b^2).
  fit_a: sigmoid.SigmoidFit
  fit_b: sigmoid.SigmoidFit
  # Both curves refitted with a common A, when B decided.
  shared: Optional[tuple[sigmoid.SigmoidFit, sigmoid.SigmoidFit]]


@dataclasses.dataclass(frozen=True)
class Estimate:
  """A recipe's fitted parameters, each with its uncertainty u (one standard deviation)."""
  a: float
  a_std: float
  b: float
  b_std: float
  c_mid: float
  c_mid_std: float
  u_source: str  # What the stds are, e.g. "bootstrap std", "std over 3 seeds / sqrt(3)".
  reliable: bool = True  # False when a fit behind it carries warnings.


@dataclasses.dataclass(frozen=True)
class Claim:
  """A direction the paper found between two points of a grid."""
  first: str  # Point names, as in the sweep file's get_sweep().
  relation: str  # "higher" (first's value above second's) or "same".
  second: str
  param: str  # "A", "B" or "C_mid"; "same" only for "A", the one with a noise floor.
  source: str  # Where PAPER.md says so.

  def __post_init__(self):
    if self.relation not in ("higher", "same") or self.param not in _FIELDS:
      raise ValueError(f"a claim relates by 'higher' or 'same' in one of {list(_FIELDS)}; "
                       f"got {self.relation!r} in {self.param!r}")
    if self.relation == "same" and self.param != "A":
      raise ValueError(f"'same' needs a noise floor, which only A has; got {self.param!r}")

  def __str__(self):
    return f"{self.first} {'>' if self.relation == 'higher' else '='} {self.second} in {self.param}"


@dataclasses.dataclass(frozen=True)
class Verdict:
  """A claim checked against fitted points."""
  claim: Claim
  verdict: str  # "agrees", "disagrees", "inconclusive", or "missing" (a point has no fit).
  difference: float  # first's value minus second's (nan when missing).
  difference_std: float  # sqrt(u_first^2 + u_second^2) (nan when missing).


@dataclasses.dataclass(frozen=True)
class PowerLawFit:
  """The baseline R(C) = A - D * C^-alpha with A <= 1."""
  a: float
  d: float
  alpha: float
  rmse: float


_FIELDS = {"A": "a", "B": "b", "C_mid": "c_mid"}
_MOVED_A = "§6: Moved the ceiling A: the loss (CISPO/GSPO over DAPO)"
_MOVED_B = "§6: Moved only efficiency B / C_mid: "
_RECIPE = "; §5, the ScaleRL recipe: "
_PIPELINE = _MOVED_B + "PipelineRL vs PPO-off-policy (PipelineRL: same A, higher B)"


def _choice_more_efficient(choice: str, others: Sequence[str], source: str) -> tuple[Claim, ...]:
  """ScaleRL's choice reaches the same A as each alternative, with a higher B."""
  return tuple(Claim(choice, relation, other, param, source) for other in others
               for relation, param in (("same", "A"), ("higher", "B")))


# What PAPER.md reports on each grid of configs/ablations/, by sweep file and point names.
# Where it says only that a choice moved "efficiency B / C_mid" (§6) and that ScaleRL
# chose one point (§5), the claims are: the same A, and a higher B for ScaleRL's choice.
# GRPO's place, and PipelineRL's k = 4 ("as good"), are not stated as A or B: no claim.
PAPER_CLAIMS: dict[str, tuple[Claim, ...]] = {
    "loss_type": (Claim("cispo", "higher", "dapo", "A", _MOVED_A),
                  Claim("gspo", "higher", "dapo", "A", _MOVED_A)),
    "off_policy": (Claim("pipeline_k8", "same", "ppo_k8", "A", _PIPELINE),
                   Claim("pipeline_k8", "higher", "ppo_k8", "B", _PIPELINE)),
    "aggregation": _choice_more_efficient(
        "prompt_avg", ("sample_avg", "token_avg"),
        _MOVED_B + "loss aggregation" + _RECIPE + "loss: ... prompt-level aggregation"),
    "adv_norm": _choice_more_efficient(
        "norm_batch", ("norm_prompt", "norm_none"),
        _MOVED_B + "advantage normalisation" + _RECIPE
        + "loss: ... batch-level advantage normalisation"),
    "zero_variance_filter": _choice_more_efficient(
        "filter_on", ("filter_off",), _MOVED_B + "zero-variance filtering" + _RECIPE
        + "zero-variance filtering"),
    "no_positive_resampling": _choice_more_efficient(
        "npr_on", ("npr_off",), _MOVED_B + "No-Positive-Resampling" + _RECIPE
        + "No-Positive-Resampling"),
}


def find_grid(workdirs: Sequence[str]) -> Optional[str]:
  """The grid of `PAPER_CLAIMS` that runs belong to, from their directories' names.

  Args:
    workdirs: the runs' workdirs. A directory anywhere in a path named as a
      grid's sweep file, seed marker aside (`loss_type`, `loss_type_seed1`),
      names the grid, as `launch.sweep --workdir=/tmp/sweeps/loss_type` does.

  Returns:
    The grid, or None when no path names one.

  Raises:
    ValueError: the paths name more than one grid.
  """
  found = sorted({seeds.split_seed(part)[0] for w in workdirs
                  for part in os.path.abspath(w).split(os.sep)} & set(PAPER_CLAIMS))
  if len(found) > 1:
    raise ValueError(f"the runs' paths name several grids, {found}; pick one with --grid")
  return found[0] if found else None


def _counts(difference: float, std: float, floor: float = 0.0) -> bool:
  """Whether a difference is beyond its uncertainty and at least `floor`."""
  return abs(difference) > std and abs(difference) >= floor


def _winner(difference: float, std: float, floor: float = 0.0) -> str:
  if not _counts(difference, std, floor):
    return "inconclusive"
  return "a" if difference > 0 else "b"


def _bootstraps(curves, fits, num_samples, seed, fix_a, fit_kwargs):
  grids = {k: v for k, v in fit_kwargs.items() if k.endswith("_grid")}
  return tuple(uncertainty.bootstrap(*curve, fit, num_samples=num_samples, seed=seed,
                                     fix_a=fix_a, **grids) for curve, fit in zip(curves, fits))


def compare(curve_a: tuple[Sequence[float], Sequence[float]],
            curve_b: tuple[Sequence[float], Sequence[float]], *, a_noise: float = A_NOISE,
            stds: Optional[tuple[Stds, Stds]] = None, num_bootstrap: int = 200, seed: int = 0,
            **fit_kwargs) -> Comparison:
  """Applies the paper's rule, saying "inconclusive" where the uncertainty allows either.

  When the ceilings differ by at least `a_noise` (0.02: three seeds varied A by
  up to 0.015), the higher A wins if the difference also exceeds its
  uncertainty, else the answer is inconclusive. Otherwise both curves are
  refitted with a shared A and the higher B wins, again only beyond the
  uncertainty of the difference in B.

  Args:
    curve_a: (compute, score) of the first recipe.
    curve_b: (compute, score) of the second recipe.
    a_noise: smallest difference in A that counts.
    stds: u of each recipe's A and B (e.g. `seeds.spread` of each recipe's
      seeds); None bootstraps each fit (`uncertainty.bootstrap`), and at the
      shared A bootstraps B with A held there.
    num_bootstrap: resamples per bootstrap.
    seed: seed of the resampling.
    **fit_kwargs: passed to `sigmoid.fit` and `sigmoid.fit_shared_a` (the grids
      also to the bootstrap).

  Returns:
    The comparison, with both fits and the shared-A refits when B decided.
  """
  curves = (curve_a, curve_b)
  fits = tuple(sigmoid.fit(*c, **fit_kwargs) for c in curves)
  u = stds or _bootstraps(curves, fits, num_bootstrap, seed, False, fit_kwargs)
  diff = fits[0].a - fits[1].a
  if abs(diff) >= a_noise:
    std = math.hypot(u[0].a_std, u[1].a_std)
    return Comparison(_winner(diff, std), "A", diff, std, *fits, None)
  shared = tuple(sigmoid.fit_shared_a(curves, **fit_kwargs))
  u = stds or _bootstraps(curves, shared, num_bootstrap, seed, True, fit_kwargs)
  diff, std = shared[0].b - shared[1].b, math.hypot(u[0].b_std, u[1].b_std)
  return Comparison(_winner(diff, std), "B", diff, std, *fits, shared)


def check_claim(claim: Claim, first: Estimate, second: Estimate, *,
                a_noise: float = A_NOISE) -> Verdict:
  """Checks one claim: its difference d = first - second against u = sqrt(u_1^2 + u_2^2).

  A difference counts when |d| > u and, in A, |d| >= `a_noise` (the paper's
  noise floor). "higher" agrees when d counts and is positive, disagrees when
  it counts and is negative. "same" disagrees when d counts and agrees when
  the whole band |d| + u lies under the floor. Anything else is inconclusive.

  Args:
    claim: the claim.
    first: the estimate of `claim.first`.
    second: the estimate of `claim.second`.
    a_noise: the noise floor of A.

  Returns:
    The verdict with d and u.
  """
  field = _FIELDS[claim.param]
  d = getattr(first, field) - getattr(second, field)
  u = math.hypot(getattr(first, f"{field}_std"), getattr(second, f"{field}_std"))
  floor = a_noise if claim.param == "A" else 0.0
  if _counts(d, u, floor):
    verdict = "disagrees" if claim.relation == "same" or d < 0 else "agrees"
  elif claim.relation == "same" and abs(d) + u < floor:
    verdict = "agrees"
  else:
    verdict = "inconclusive"
  return Verdict(claim, verdict, d, u)


def grid_verdicts(points: Mapping[str, Estimate], claims: Sequence[Claim], *,
                  a_noise: float = A_NOISE) -> list[Verdict]:
  """Checks each claim on a grid's fitted points (`check_claim`).

  Args:
    points: point name -> its estimate; a point that was not run or not fitted
      is absent.
    claims: the claims, e.g. `PAPER_CLAIMS[grid]`.
    a_noise: the noise floor of A.

  Returns:
    One verdict per claim, in order; "missing" where a point has no estimate.
  """
  out = []
  for claim in claims:
    if claim.first in points and claim.second in points:
      out.append(check_claim(claim, points[claim.first], points[claim.second], a_noise=a_noise))
    else:
      out.append(Verdict(claim, "missing", math.nan, math.nan))
  return out


def fit_power_law(compute: Sequence[float], score: Sequence[float], *,
                  min_compute: float = 0.0) -> PowerLawFit:
  """Fits the power-law baseline R(C) = A - D * C^-alpha (A <= 1), as the paper contrasts.

  Args:
    compute: cumulative compute per evaluation, strictly increasing.
    score: validation pass rate per evaluation.
    min_compute: points with less compute are dropped.

  Returns:
    The fitted power law.
  """
  x, y, _, _ = sigmoid.check_curve(compute, score, min_compute)
  best = None
  for alpha in np.geomspace(1e-3, 5.0, 60):  # For fixed alpha, A and D are linear.
    basis = np.stack([np.ones_like(x), -x ** -alpha], 1)
    (a, d), *_ = np.linalg.lstsq(basis, y, rcond=None)
    a, d = min(a, 1.0), max(d, 0.0)
    sse = float(np.sum((a - d * x ** -alpha - y) ** 2))
    if best is None or sse < best[0]:
      best = (sse, [a, d, alpha])
  res = optimize.least_squares(lambda p: p[0] - p[1] * x ** -p[2] - y,
                               np.clip(best[1], [-np.inf, 0, 1e-3], [1.0, np.inf, 5.0]),
                               bounds=([-np.inf, 0.0, 1e-3], [1.0, np.inf, 5.0]))
  a, d, alpha = res.x
  return PowerLawFit(a=float(a), d=float(d), alpha=float(alpha),
                     rmse=float(np.sqrt(np.mean(res.fun ** 2))))


def predict_power_law(fit: PowerLawFit, compute) -> np.ndarray:
  """Predicted score of the power-law baseline.

  Args:
    fit: the power-law fit.
    compute: where to predict, > 0.

  Returns:
    The predicted scores, shaped like `compute`.
  """
  return fit.a - fit.d * np.asarray(compute, dtype=float) ** -fit.alpha
