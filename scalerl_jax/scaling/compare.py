"""Deciding between recipes, and the power-law baseline (PAPER.md §1).

Three seeds of one recipe varied A by up to 0.015 (`seeds.spread` measures
this), so the paper counts a difference in A under 0.02 as noise; such runs are
refitted with a shared A and compared on B. A power law fitted to the same
points extrapolates badly (the paper saw A = 1.0); `fit_power_law` is that
baseline.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import numpy as np
from scipy import optimize

from scalerl_jax.scaling import sigmoid


@dataclasses.dataclass(frozen=True)
class Comparison:
  """Which of two recipes is better under the paper's rule."""
  better: str  # "a" or "b".
  decided_by: str  # "A" (ceilings differ by at least the noise) or "B".
  fit_a: sigmoid.SigmoidFit
  fit_b: sigmoid.SigmoidFit
  # Both curves refitted with a common A, when B decided.
  shared: Optional[tuple[sigmoid.SigmoidFit, sigmoid.SigmoidFit]]


@dataclasses.dataclass(frozen=True)
class PowerLawFit:
  """The baseline R(C) = A - D * C^-alpha with A <= 1."""
  a: float
  d: float
  alpha: float
  rmse: float


def compare(curve_a: tuple[Sequence[float], Sequence[float]],
            curve_b: tuple[Sequence[float], Sequence[float]], *, a_noise: float = 0.02,
            **fit_kwargs) -> Comparison:
  """Applies the paper's rule: a higher A wins when the ceilings differ by at
  least `a_noise` (0.02: three seeds varied A by up to 0.015); otherwise both
  curves are refitted with a shared A and the higher B wins.

  Args:
    curve_a: (compute, score) of the first recipe.
    curve_b: (compute, score) of the second recipe.
    a_noise: smallest difference in A that counts.
    **fit_kwargs: passed to `sigmoid.fit` and `sigmoid.fit_shared_a`.

  Returns:
    The comparison, with both fits and the shared-A refits when B decided.
  """
  fit_a, fit_b = sigmoid.fit(*curve_a, **fit_kwargs), sigmoid.fit(*curve_b, **fit_kwargs)
  if abs(fit_a.a - fit_b.a) >= a_noise:
    return Comparison("a" if fit_a.a > fit_b.a else "b", "A", fit_a, fit_b, None)
  shared_a, shared_b = sigmoid.fit_shared_a([curve_a, curve_b], **fit_kwargs)
  better = "a" if shared_a.b >= shared_b.b else "b"
  return Comparison(better, "B", fit_a, fit_b, (shared_a, shared_b))


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
