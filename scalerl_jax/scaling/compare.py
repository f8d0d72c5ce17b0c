"""Deciding between recipes, checking a grid against the paper, power laws.

A difference d between two recipes' fitted values counts only when |d| >
sqrt(u_1^2 + u_2^2), u each value's std, and in A also |d| >= `A_NOISE`;
otherwise it is "inconclusive". `PAPER_CLAIMS` holds what the paper found
on each grid of configs/ablations/. Design: docs/design/scaling.md.
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
  """u of A and B: `uncertainty.Uncertainty`, `seeds.Spread` or `Estimate`."""

  a_std: float
  b_std: float


@dataclasses.dataclass(frozen=True)
class Comparison:
  """Which of two recipes the paper's rule prefers, or that it cannot tell."""

  better: str  # "a", "b" or "inconclusive".
  # "A" (ceilings differ by at least the noise) or "B" (at a shared A).
  decided_by: str
  difference: float  # a's value minus b's, of the parameter that decided.
  difference_std: float  # Its uncertainty, sqrt(u_a^2 + u_b^2).
  fit_a: sigmoid.SigmoidFit
  fit_b: sigmoid.SigmoidFit
  # Both curves refitted with a common A, when B decided.
  shared: Optional[tuple[sigmoid.SigmoidFit, sigmoid.SigmoidFit]]


@dataclasses.dataclass(frozen=True)
class Estimate:
  """A recipe's fitted parameters, each with its uncertainty u (one std)."""

  a: float
  a_std: float
  b: float
  b_std: float
  c_mid: float
  c_mid_std: float
  # What the stds are, e.g. "bootstrap std", "std over 3 seeds / sqrt(3)".
  u_source: str
  reliable: bool = True  # False when a fit behind it carries warnings.


@dataclasses.dataclass(frozen=True)
class Claim:
  """A direction the paper found between two points of a grid."""

  first: str  # Point names, as in the sweep file's get_sweep().
  relation: str  # "higher" (first's value above second's) or "same".
  second: str
  # "A", "B" or "C_mid"; "same" only for "A", the one with a noise floor.
  param: str
  source: str  # Where PAPER.md says so.

  def __post_init__(self):
    if self.relation not in ("higher", "same") or self.param not in _FIELDS:
      raise ValueError(
          f"a claim relates by 'higher' or 'same' in one of {list(_FIELDS)}; "
          f"got {self.relation!r} in {self.param!r}"
      )
    if self.relation == "same" and self.param != "A":
      raise ValueError(
          f"'same' needs a noise floor, which only A has; got {self.param!r}"
      )

  def __str__(self):
    return f"{self.first} {'>' if self.relation == 'higher' else '='} {self.second} in {self.param}"


@dataclasses.dataclass(frozen=True)
class Verdict:
  """A claim checked against fitted points."""

  claim: Claim
  # "agrees", "disagrees", "inconclusive", or "missing" (a point has no fit).
  verdict: str
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
_PIPELINE = (
    _MOVED_B + "PipelineRL vs PPO-off-policy (PipelineRL: same A, higher B)"
)


def choice_more_efficient(
    choice: str, others: Sequence[str], source: str
) -> tuple[Claim, ...]:
  """ScaleRL's choice: the same A as each alternative, and a higher B."""
  return tuple(
      Claim(choice, relation, other, param, source)
      for other in others
      for relation, param in (("same", "A"), ("higher", "B"))
  )


# What PAPER.md reports on each grid of configs/ablations/, by sweep file and
# point names. Where it says only that a choice moved "efficiency B / C_mid"
# (§6) and that ScaleRL chose one point (§5), the claims are: the same A, and a
# higher B for ScaleRL's choice. GRPO's place, and PipelineRL's k = 4 ("as
# good"), are not stated as A or B: no claim.
PAPER_CLAIMS: dict[str, tuple[Claim, ...]] = {
    "loss_type": (
        Claim("cispo", "higher", "dapo", "A", _MOVED_A),
        Claim("gspo", "higher", "dapo", "A", _MOVED_A),
    ),
    "off_policy": (
        Claim("pipeline_k8", "same", "ppo_k8", "A", _PIPELINE),
        Claim("pipeline_k8", "higher", "ppo_k8", "B", _PIPELINE),
    ),
    "aggregation": choice_more_efficient(
        "prompt_avg",
        ("sample_avg", "token_avg"),
        _MOVED_B
        + "loss aggregation"
        + _RECIPE
        + "loss: ... prompt-level aggregation",
    ),
    "adv_norm": choice_more_efficient(
        "norm_batch",
        ("norm_prompt", "norm_none"),
        _MOVED_B
        + "advantage normalisation"
        + _RECIPE
        + "loss: ... batch-level advantage normalisation",
    ),
    "zero_variance_filter": choice_more_efficient(
        "filter_on",
        ("filter_off",),
        _MOVED_B
        + "zero-variance filtering"
        + _RECIPE
        + "zero-variance filtering",
    ),
    "no_positive_resampling": choice_more_efficient(
        "npr_on",
        ("npr_off",),
        _MOVED_B
        + "No-Positive-Resampling"
        + _RECIPE
        + "No-Positive-Resampling",
    ),
}


def find_grid(workdirs: Sequence[str]) -> Optional[str]:
  """The grid of `PAPER_CLAIMS` that runs belong to, from their paths.

  A directory anywhere in a workdir's path named as a grid's sweep file, seed
  marker aside (`loss_type`, `loss_type_seed1`), names the grid. Returns None
  when no path names one; raises ValueError when they name several.
  """
  found = sorted(
      {
          seeds.split_seed(part)[0]
          for w in workdirs
          for part in os.path.abspath(w).split(os.sep)
      }
      & set(PAPER_CLAIMS)
  )
  if len(found) > 1:
    raise ValueError(
        f"the runs' paths name several grids, {found}; pick one with --grid"
    )
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
  return tuple(
      uncertainty.bootstrap(
          *curve, fit, num_samples=num_samples, seed=seed, fix_a=fix_a, **grids
      )
      for curve, fit in zip(curves, fits)
  )


def compare(
    curve_a: tuple[Sequence[float], Sequence[float]],
    curve_b: tuple[Sequence[float], Sequence[float]],
    *,
    a_noise: float = A_NOISE,
    stds: Optional[tuple[Stds, Stds]] = None,
    num_bootstrap: int = uncertainty.NUM_BOOTSTRAP,
    seed: int = 0,
    **fit_kwargs,
) -> Comparison:
  """Which of two (compute, score) curves is better by the paper's rule.

  Ceilings that differ by at least `a_noise` decide on A; otherwise both are
  refitted with a shared A and decide on B. `stds` gives each recipe's u of
  A and B (e.g. `seeds.spread`); None bootstraps each fit. `fit_kwargs` go to
  the fits (the grids also to the bootstrap).
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


def check_claim(
    claim: Claim, first: Estimate, second: Estimate, *, a_noise: float = A_NOISE
) -> Verdict:
  """Checks one claim: d = first - second against u = sqrt(u_1^2 + u_2^2).

  "higher" agrees when d counts (|d| > u and, in A, |d| >= `a_noise`) and is
  positive, disagrees when it counts and is negative. "same" disagrees when d
  counts and agrees when |d| + u lies under the floor. Otherwise:
  "inconclusive".
  """
  field = _FIELDS[claim.param]
  d = getattr(first, field) - getattr(second, field)
  u = math.hypot(
      getattr(first, f"{field}_std"), getattr(second, f"{field}_std")
  )
  floor = a_noise if claim.param == "A" else 0.0
  if _counts(d, u, floor):
    verdict = "disagrees" if claim.relation == "same" or d < 0 else "agrees"
  elif claim.relation == "same" and abs(d) + u < floor:
    verdict = "agrees"
  else:
    verdict = "inconclusive"
  return Verdict(claim, verdict, d, u)


def grid_verdicts(
    points: Mapping[str, Estimate],
    claims: Sequence[Claim],
    *,
    a_noise: float = A_NOISE,
) -> list[Verdict]:
  """One `check_claim` verdict per claim on a grid's fitted `points`, in order.

  A point not run or not fitted is absent from `points`: its claims are
  "missing".
  """
  out = []
  for claim in claims:
    if claim.first in points and claim.second in points:
      out.append(
          check_claim(
              claim, points[claim.first], points[claim.second], a_noise=a_noise
          )
      )
    else:
      out.append(Verdict(claim, "missing", math.nan, math.nan))
  return out


def fit_power_law(
    compute: Sequence[float],
    score: Sequence[float],
    *,
    min_compute: float = 0.0,
) -> PowerLawFit:
  """The power-law baseline R(C) = A - D * C^-alpha (A <= 1), fitted."""
  x, y, _, _ = sigmoid.check_curve(compute, score, min_compute)
  best = None
  # For fixed alpha, A and D are linear.
  for alpha in np.geomspace(1e-3, 5.0, 60):
    basis = np.stack([np.ones_like(x), -(x**-alpha)], 1)
    (a, d), *_ = np.linalg.lstsq(basis, y, rcond=None)
    a, d = min(a, 1.0), max(d, 0.0)
    sse = float(np.sum((a - d * x**-alpha - y) ** 2))
    if best is None or sse < best[0]:
      best = (sse, [a, d, alpha])
  res = optimize.least_squares(
      lambda p: p[0] - p[1] * x ** -p[2] - y,
      np.clip(best[1], [-np.inf, 0, 1e-3], [1.0, np.inf, 5.0]),
      bounds=([-np.inf, 0.0, 1e-3], [1.0, np.inf, 5.0]),
  )
  a, d, alpha = res.x
  return PowerLawFit(
      a=float(a),
      d=float(d),
      alpha=float(alpha),
      rmse=float(np.sqrt(np.mean(res.fun**2))),
  )


def predict_power_law(fit: PowerLawFit, compute) -> np.ndarray:
  """The power-law fit's scores at `compute` (> 0)."""
  return fit.a - fit.d * np.asarray(compute, dtype=float) ** -fit.alpha
