"""How far to trust a fitted curve: bootstrap spread, extrapolation error.

`bootstrap` refits resamples of a fit's points, all at once; `extrapolate`
is the paper's test (§1): fit the first part of a run, predict the rest;
`spread_warnings` says when a fit's bootstrap spread makes it unreliable.

Shape letters: the package key (scalerl_jax/__init__.py), and J points, R
bootstrap resamples, U free parameters. Design: docs/design/scaling.md.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import numpy as np
from scipy import special

from scalerl_jax.scaling import sigmoid

_LM_STEPS = 30
# A fit is not reliable when the bootstrap std of A, B or C_mid is at least
# this share of the fitted value. A, B and C_mid are positive, and at half its
# value a parameter's value - 2 std (about the bootstrap's 95% band) reaches 0:
# the points do not tell its value from none at all (no ceiling, a flat curve,
# a midpoint at no compute), however well the curve runs through them.
MAX_RELATIVE_STD = 0.5
# Bootstrap resamples behind a fit's uncertainty and its "reliable" mark.
NUM_BOOTSTRAP = 200


@dataclasses.dataclass(frozen=True)
class Uncertainty:
  """Bootstrap spread of fitted parameters (points drawn with replacement)."""

  a_std: float
  b_std: float
  c_mid_std: float
  a_interval: tuple[float, float]  # Central 95% of the bootstrap A values.
  num_samples: int


@dataclasses.dataclass(frozen=True)
class Extrapolation:
  """A fit on the first part of a run, scored on the rest."""

  fit: sigmoid.SigmoidFit
  split: float  # Points with compute <= split were fitted.
  held_out: int  # Points after the split.
  final_prediction: float  # The fit's value at the run's last point.
  final_score: float  # The score measured there.
  mean_abs_error: float  # Over the held-out points.
  max_abs_error: float

  @property
  def final_error(self) -> float:
    """Prediction minus measurement at the run's last point."""
    return self.final_prediction - self.final_score


def _free_columns(fit: sigmoid.SigmoidFit, fix_a: bool) -> list[int]:
  """The columns of the parameters [A, log C_mid, log B, R_0] refitted."""
  return (
      ([] if fix_a else [0])
      + [1, 2]
      + ([3] if fit.r0_source == "fitted" else [])
  )


def _resample_weights(size: int, num_samples: int, seed: int) -> np.ndarray:
  """[R, J] counts of each of `size` points in each resample, from `seed`."""
  rng = np.random.default_rng(seed)
  return rng.multinomial(
      size, np.full(size, 1.0 / size), size=num_samples
  ).astype(float)


def _model(p: np.ndarray, lx: np.ndarray):
  """(scores [R, J], sigmoid of z, z) of parameters `p` [R, 4] at log x."""
  z = np.exp(p[:, 2:3]) * (lx - p[:, 1:2])  # [R, J]
  s = special.expit(z)
  return p[:, 3:4] + (p[:, :1] - p[:, 3:4]) * s, s, z


def _sse(p: np.ndarray, lx: np.ndarray, y: np.ndarray, w: np.ndarray):
  """[R] weighted squared error of each resample's parameters `p`."""
  return (w * (y - _model(p, lx)[0]) ** 2).sum(1)


def _solve_each(mat: np.ndarray, rhs: np.ndarray) -> np.ndarray:
  """[R, U]: each resample's damped step, mat [R, U, U] @ step = rhs [R, U].

  A resample whose points sit on fewer distinct computes than there are free
  parameters has a rank-deficient Hessian; once the damping has shrunk below
  its rounding, LAPACK may find that system exactly singular or not,
  depending on the machine's kernels. Such a resample takes the least-norm
  step instead, so one degenerate resample neither stops the batch (numpy
  raises for all of it) nor makes the result depend on the machine; the
  other resamples keep the batched solve's steps exactly.
  """
  try:
    return np.linalg.solve(mat, rhs[..., None])[..., 0]
  except np.linalg.LinAlgError:
    steps = np.empty_like(rhs)
    for r in range(mat.shape[0]):
      try:
        steps[r] = np.linalg.solve(mat[r], rhs[r])
      except np.linalg.LinAlgError:
        steps[r] = np.linalg.lstsq(mat[r], rhs[r], rcond=None)[0]
    return steps


def _refit(p, lx, y, w, free, lo, hi) -> np.ndarray:
  """`p` [R, 4], refitted in place by Levenberg-Marquardt on columns `free`."""
  current, lam = _sse(p, lx, y, w), np.full(p.shape[0], 1e-3)
  for _ in range(_LM_STEPS):
    f, s, z = _model(p, lx)
    gain, ds = p[:, :1] - p[:, 3:4], s * (1 - s)
    jac = np.stack(
        [s, -gain * ds * np.exp(p[:, 2:3]), gain * ds * z, 1 - s], -1
    )[..., free]
    hess = np.einsum("rju,rj,rjv->ruv", jac, w, jac)  # [R, U, U]
    grad = np.einsum("rju,rj->ru", jac, w * (y - f))
    diag = np.einsum("ruu->ru", hess) + 1e-12
    step = _solve_each(
        hess + lam[:, None, None] * (diag[:, :, None] * np.eye(len(free))),
        grad,
    )
    trial = p.copy()
    trial[:, free] = np.clip(p[:, free] + step, lo, hi)
    new = _sse(trial, lx, y, w)
    better = new < current
    p[better], current[better] = trial[better], new[better]
    lam = np.where(better, lam / 3, lam * 4)
  return p


def _spread(p: np.ndarray, num_samples: int) -> Uncertainty:
  """The Uncertainty of the refitted parameters `p` [R, 4]."""
  a_s, c_s, b_s = p[:, 0], np.exp(p[:, 1]), np.exp(p[:, 2])
  return Uncertainty(
      a_std=float(a_s.std()),
      b_std=float(b_s.std()),
      c_mid_std=float(c_s.std()),
      a_interval=(
          float(np.percentile(a_s, 2.5)),
          float(np.percentile(a_s, 97.5)),
      ),
      num_samples=num_samples,
  )


def bootstrap(
    compute: Sequence[float],
    score: Sequence[float],
    fit: sigmoid.SigmoidFit,
    *,
    num_samples: int = NUM_BOOTSTRAP,
    seed: int = 0,
    fix_a: bool = False,
    a_grid=None,
    c_mid_grid=None,
    b_grid=None,
) -> Uncertainty:
  """Pairs bootstrap of `fit` over the points of `compute` it was fitted on.

  R_0 is refitted only where `fit` fitted it; `fix_a` holds A at the fit's
  value (its std is then 0), as `compare.compare` does at a shared A. The
  refits stay within the ranges of the fit's grids (None: the defaults).
  Raises ValueError unless `num_samples` >= 1.
  """
  if num_samples < 1:
    raise ValueError(f"num_samples must be >= 1; got {num_samples}")
  c, r = np.asarray(compute, dtype=float), np.asarray(score, dtype=float)
  used = fit.fitted(c)
  x, y = c[used], r[used]
  a, cg, b = sigmoid.grids([x], a_grid, c_mid_grid, b_grid)
  # Columns of p [R, 4]: A, log C_mid, log B, R_0; the free ones are refitted.
  free = _free_columns(fit, fix_a)
  lo = np.array([a[0], math.log(cg[0]), math.log(b[0]), 0.0])[free]
  hi = np.array([a[-1], math.log(cg[-1]), math.log(b[-1]), 1.0])[free]
  w = _resample_weights(x.size, num_samples, seed)
  p = np.tile(
      [fit.a, math.log(fit.c_mid), math.log(fit.b), fit.r0], (num_samples, 1)
  )
  return _spread(_refit(p, np.log(x), y, w, free, lo, hi), num_samples)


def spread_warnings(
    fit: sigmoid.SigmoidFit, unc: Uncertainty
) -> tuple[str, ...]:
  """A warning per parameter with bootstrap std >= MAX_RELATIVE_STD of it."""
  out = []
  for name, value, std in (
      ("A", fit.a, unc.a_std),
      ("B", fit.b, unc.b_std),
      ("C_mid", fit.c_mid, unc.c_mid_std),
  ):
    if std >= MAX_RELATIVE_STD * abs(value):
      out.append(
          f"{name}={value:.4g} has bootstrap std {std:.4g}, at least "
          f"{MAX_RELATIVE_STD:.0%} of it: the points do not pin it down"
      )
  return tuple(out)


def extrapolate(
    compute: Sequence[float],
    score: Sequence[float],
    fit_fraction: float = 0.5,
    **fit_kwargs,
) -> Extrapolation:
  """Fits the points up to `fit_fraction` of the final compute; scores the rest.

  `fit_kwargs` go to `sigmoid.fit`. Raises ValueError unless 0 < fit_fraction
  < 1 and some points lie beyond the split.
  """
  c = np.asarray(compute, dtype=float)
  r = np.asarray(score, dtype=float)
  if not 0 < fit_fraction < 1:
    raise ValueError(f"fit_fraction must be in (0, 1); got {fit_fraction}")
  if c.size == 0:
    raise ValueError("no points to extrapolate from")
  split = fit_fraction * float(c[-1])
  head = c <= split
  if head.all():
    raise ValueError(f"no points beyond the split at compute {split:.4g}")
  result = sigmoid.fit(c[head], r[head], **fit_kwargs)
  predicted = sigmoid.predict(result, c[~head])
  err = np.abs(predicted - r[~head])
  return Extrapolation(
      fit=result,
      split=split,
      held_out=int(err.size),
      final_prediction=float(predicted[-1]),
      final_score=float(r[-1]),
      mean_abs_error=float(err.mean()),
      max_abs_error=float(err.max()),
  )
