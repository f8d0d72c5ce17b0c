"""The compute-performance curve R(C) and its fit (PAPER.md §1).

R(C) = R_0 + (A - R_0) / (1 + (C_mid / C)^B): A the asymptotic pass rate, B
the steepness, C_mid the compute at half the gain (in the unit of C), R_0
the pass rate before RL. `fit` grid-searches, then refines continuously;
a fit not to be trusted carries `warnings` and is not `reliable`.

Shape letters: the package key (scalerl_jax/__init__.py), and J points of a
curve; nA, nC, nB are grid sizes. Design: docs/design/scaling.md.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional, Sequence

import numpy as np
from scipy import optimize
from scipy import special

MIN_POINTS = 4
_EDGE_TOL = 1e-6
_MAX_CELL_MOVES = 10


@dataclasses.dataclass(frozen=True)
class SigmoidFit:
  """A fitted compute-performance curve."""

  a: float
  b: float
  c_mid: float
  r0: float
  r0_source: str  # "measured" (score at compute 0), "given" or "fitted".
  rmse: float  # Root mean squared residual over the fitted points.
  num_points: int
  compute_range: tuple[float, float]  # Smallest and largest compute fitted.
  warnings: tuple[str, ...] = ()

  @property
  def reliable(self) -> bool:
    return not self.warnings

  def fitted(self, compute) -> np.ndarray:
    """Mask of the points of `compute` within the fitted `compute_range`."""
    c = np.asarray(compute, dtype=float)
    return (c >= self.compute_range[0]) & (c <= self.compute_range[1])


def sigmoid(compute, a: float, b: float, c_mid: float, r0: float) -> np.ndarray:
  """R(C) at `compute` (any shape, >= 0; R(0) = r0), c_mid in its unit."""
  c = np.asarray(compute, dtype=float)
  with np.errstate(divide="ignore"):
    share = special.expit(b * (np.log(c) - math.log(c_mid)))
  return r0 + (a - r0) * share


def predict(fit: SigmoidFit, compute) -> np.ndarray:
  """The fitted curve at `compute`, in the unit of the fitted compute."""
  return sigmoid(compute, fit.a, fit.b, fit.c_mid, fit.r0)


def check_curve(
    compute: Sequence[float],
    score: Sequence[float],
    min_compute: float = 0.0,
    r0: Optional[float] = None,
) -> tuple[np.ndarray, np.ndarray, Optional[float], str]:
  """Validates one curve and keeps the points a fit uses.

  Returns (compute_J, score_J) of the points with compute > 0 and >=
  min_compute; R_0 (`r0`, else the score at compute 0 if any, else None); and
  its source, "given", "measured" or "fitted". Raises ValueError on input no
  fit can use, naming the first offending index.
  """
  c = np.asarray(compute, dtype=float)
  r = np.asarray(score, dtype=float)
  if c.ndim != 1 or c.shape != r.shape:
    raise ValueError(
        f"compute and score must be 1-D of equal length; got {c.shape} and {r.shape}"
    )
  for name, v in (("compute", c), ("score", r)):
    bad = np.flatnonzero(~np.isfinite(v))
    if bad.size:
      raise ValueError(
          f"{name} has non-finite values at indices {bad[:10].tolist()}"
      )
  if c.size and c.min() < 0:
    raise ValueError(
        f"compute must be >= 0; compute[{int(c.argmin())}] = {c.min()}"
    )
  steps = np.flatnonzero(np.diff(c) <= 0)
  if steps.size:
    i = int(steps[0]) + 1
    raise ValueError(
        f"compute must be strictly increasing; compute[{i}] = {c[i]} "
        f"follows compute[{i - 1}] = {c[i - 1]}"
    )
  outside = np.flatnonzero((r < 0) | (r > 1))
  if outside.size:
    raise ValueError(
        f"scores are pass rates in [0, 1]; score[{outside[0]}] = {r[outside[0]]}"
    )
  source = "given"
  if r0 is None and c.size and c[0] == 0:
    r0, source = float(r[0]), "measured"
  elif r0 is None:
    source = "fitted"
  keep = (c > 0) & (c >= min_compute)
  if keep.sum() < MIN_POINTS:
    raise ValueError(
        f"need at least {MIN_POINTS} points with compute > 0 and >= min_compute="
        f"{min_compute}; got {int(keep.sum())}"
    )
  return c[keep], r[keep], r0, source


def grids(
    xs: Sequence[np.ndarray], a_grid=None, c_mid_grid=None, b_grid=None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """The (A, C_mid, B) search grids: given ones checked, missing ones made.

  Defaults: A over [0, 1] by 0.005, C_mid log-spaced from a tenth of the
  first compute in `xs` to ten times the last, B log-spaced over [0.05, 20].
  ValueError: a given grid empty or not increasing, C_mid or B not positive.
  """
  lo = min(float(x[0]) for x in xs)
  hi = max(float(x[-1]) for x in xs)
  a = (
      np.linspace(0.0, 1.0, 201)
      if a_grid is None
      else np.asarray(a_grid, dtype=float)
  )
  c = (
      np.geomspace(lo / 10, hi * 10, 100)
      if c_mid_grid is None
      else np.asarray(c_mid_grid, float)
  )
  b = (
      np.geomspace(0.05, 20.0, 61)
      if b_grid is None
      else np.asarray(b_grid, dtype=float)
  )
  for name, g in (("a_grid", a), ("c_mid_grid", c), ("b_grid", b)):
    if (
        g.ndim != 1
        or not g.size
        or np.any(np.diff(g) <= 0)
        or not np.all(np.isfinite(g))
    ):
      raise ValueError(
          f"{name} must be a non-empty, strictly increasing 1-D array"
      )
  if c[0] <= 0 or b[0] <= 0:
    raise ValueError("c_mid_grid and b_grid must be positive")
  return a, c, b


def _shares(x, c_grid, b_grid):
  """s[c, b, j] = 1 / (1 + (C_mid_c / x_j)^B_b): the share of the gain."""
  u = np.log(x)[None, :] - np.log(c_grid)[:, None]  # [nC, J]
  return special.expit(b_grid[None, :, None] * u[:, None, :])  # [nC, nB, J]


def _sums(x, y, s):
  """Sums over the points that determine the residual of every grid cell."""
  return dict(
      w=x.size,
      y=y.sum(),
      yy=(y * y).sum(),
      s=s.sum(-1),
      ss=(s * s).sum(-1),
      ys=s @ y,
  )


def _best_r0(t, a):
  """Least-squares R_0 given A (residual y - R_0 (1 - s) - A s), in [0, 1]."""
  tu = (t["y"] - t["ys"]) - a * (t["s"] - t["ss"])
  uu = t["w"] - 2 * t["s"] + t["ss"]
  with np.errstate(divide="ignore", invalid="ignore"):
    return np.clip(tu / uu, 0.0, 1.0)


def _sse(t, a, r0):
  """RSS of y - R_0 - (A - R_0) s from the sums `t`; +inf where undefined."""
  g = a - r0
  sse = (
      t["yy"]
      - 2 * r0 * t["y"]
      + r0 * r0 * t["w"]
      - 2 * g * (t["ys"] - r0 * t["s"])
      + g * g * t["ss"]
  )
  return np.where(np.isfinite(sse), sse, np.inf)


def _grid_search(x, y, r0, a, c, b):
  """[nA, nC] arrays: per (A, C_mid) cell the residual, best B and R_0."""
  s = _shares(x, c, b)
  t = _sums(x, y, s)
  a = a[:, None, None]
  r0s = _best_r0(t, a) if r0 is None else np.full(a.shape, r0)
  r0s = np.broadcast_to(r0s, (a.size, c.size, b.size))
  sse = _sse(t, a, r0s)  # [nA, nC, nB]
  k = sse.argmin(-1)
  pick = lambda v: np.take_along_axis(v, k[..., None], -1)[..., 0]
  return pick(sse), b[k], pick(r0s)


def _bracket(grid, i):
  return grid[max(i - 1, 0)], grid[min(i + 1, grid.size - 1)]


def _refine(curves, r0s, grid, start):
  """Refines curves sharing A inside the grid cell around `start`.

  The cell spans the grid neighbours of A and of each C_mid; where the optimum
  lands on its boundary, the cell moves there and the refinement repeats.
  `start` and the result hold per curve (A, B, C_mid, R_0).
  """
  a, c, b = grid

  def unpack(theta):
    # theta: A, then per curve log C_mid, log B and (if fitted) R_0.
    out, j = [], 1
    for r0 in r0s:
      free = r0 is None
      out.append(
          (
              theta[0],
              math.exp(theta[j + 1]),
              math.exp(theta[j]),
              theta[j + 2] if free else r0,
          )
      )
      j += 3 if free else 2
    return out  # Per curve (A, B, C_mid, R_0).

  def residuals(theta):
    return np.concatenate(
        [sigmoid(x, *p) - y for (x, y), p in zip(curves, unpack(theta))]
    )

  def cells(params):
    return (
        int(np.abs(a - params[0][0]).argmin()),
        *(int(np.abs(np.log(c / p[2])).argmin()) for p in params),
    )

  params = start
  for _ in range(_MAX_CELL_MOVES):
    ia, *ics = cells(params)
    lo, hi = [_bracket(a, ia)[0]], [_bracket(a, ia)[1]]
    x0 = [params[0][0]]
    for r0, ic, (_, b0, c0, r00) in zip(r0s, ics, params):
      clo, chi = _bracket(c, ic)
      lo += [math.log(clo), math.log(b[0])] + ([0.0] if r0 is None else [])
      hi += [math.log(chi), math.log(b[-1])] + ([1.0] if r0 is None else [])
      x0 += [math.log(c0), math.log(b0)] + ([r00] if r0 is None else [])
    lo, hi = np.array(lo), np.array(hi)
    hi = np.maximum(hi, lo + 1e-12)  # A one-point grid pins that parameter.
    res = optimize.least_squares(
        residuals, np.clip(x0, lo, hi), bounds=(lo, hi), x_scale="jac"
    )
    params = unpack(res.x)
    if cells(params) == (ia, *ics):
      break
  return params


def _warnings(x, y, a, b, c_mid, r0, rmse, grid):
  """Reasons not to trust a fit; empty when none apply."""
  out = []
  ag, cg, bg = grid
  for name, v, g in (("A", a, ag), ("C_mid", c_mid, cg), ("B", b, bg)):
    if g.size > 1 and min(abs(v - g[0]), abs(v - g[-1])) <= _EDGE_TOL * max(
        1.0, abs(v)
    ):
      out.append(
          f"{name}={v:.4g} is at the edge of its grid [{g[0]:.4g}, {g[-1]:.4g}]: "
          "the data do not pin it down"
      )
  ranks = np.argsort(np.argsort(x))
  if a < r0 or np.corrcoef(ranks, y)[0, 1] < 0:
    out.append("the score decreases with compute")
  gain = abs(float(np.diff(sigmoid(x[[0, -1]], a, b, c_mid, r0))[0]))
  if gain < max(3 * rmse, 1e-3):
    out.append(
        f"the curve is flat: fitted gain {gain:.4f} over the data is within 3x the "
        f"residual noise {rmse:.4f}"
    )
  if c_mid > x[-1]:
    out.append(
        f"C_mid={c_mid:.4g} lies beyond the last point ({x[-1]:.4g}): less than half "
        "the gain is observed, so A is an extrapolation"
    )
  return tuple(out)


def fit_shared_a(
    curves: Sequence[tuple[Sequence[float], Sequence[float]]],
    *,
    min_compute: float = 0.0,
    r0: Optional[float] = None,
    a_grid=None,
    c_mid_grid=None,
    b_grid=None,
) -> list[SigmoidFit]:
  """Fits several (compute, score) curves with one common A.

  Each keeps its own B, C_mid and R_0; the arguments are as for `fit`.
  Returns one SigmoidFit per curve, all with the same `a`.
  """
  checked = [check_curve(c, r, min_compute, r0) for c, r in curves]
  grid = grids([x for x, _, _, _ in checked], a_grid, c_mid_grid, b_grid)
  cells = [_grid_search(x, y, r, *grid) for x, y, r, _ in checked]
  # [nA]: the best total residual per A.
  profile = sum(sse.min(1) for sse, _, _ in cells)
  ia = int(profile.argmin())
  ics = [int(sse[ia].argmin()) for sse, _, _ in cells]
  start = [
      (grid[0][ia], bb[ia, ic], grid[1][ic], rr[ia, ic])
      for (_, bb, rr), ic in zip(cells, ics)
  ]
  params = _refine(
      [(x, y) for x, y, _, _ in checked],
      [r for _, _, r, _ in checked],
      grid,
      start,
  )
  fits = []
  for (x, y, _, source), (a, b, c_mid, r0_fit) in zip(checked, params):
    rmse = float(np.sqrt(np.mean((sigmoid(x, a, b, c_mid, r0_fit) - y) ** 2)))
    fits.append(
        SigmoidFit(
            a=float(a),
            b=float(b),
            c_mid=float(c_mid),
            r0=float(r0_fit),
            r0_source=source,
            rmse=rmse,
            num_points=int(x.size),
            compute_range=(float(x[0]), float(x[-1])),
            warnings=_warnings(x, y, a, b, c_mid, r0_fit, rmse, grid),
        )
    )
  return fits


def fit(
    compute: Sequence[float],
    score: Sequence[float],
    *,
    min_compute: float = 0.0,
    r0: Optional[float] = None,
    a_grid=None,
    c_mid_grid=None,
    b_grid=None,
) -> SigmoidFit:
  """Fits R(C) to one run: the paper's grid search, then refinement.

  `compute` is cumulative, strictly increasing, in any unit (C_mid comes back
  in it); `score` pass rates in [0, 1]; points below `min_compute` are
  dropped. `r0` None measures R_0 at compute 0 if present, else fits it.
  Raises ValueError on fewer than 4 usable points or invalid input.
  """
  (result,) = fit_shared_a(
      [(compute, score)],
      min_compute=min_compute,
      r0=r0,
      a_grid=a_grid,
      c_mid_grid=c_mid_grid,
      b_grid=b_grid,
  )
  return result
