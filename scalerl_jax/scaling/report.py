"""The text report of fitted groups: settings, fits, the points used, seed spreads.

Four parts, in order: the settings every curve was fitted with; a table of
A, B, C_mid (± bootstrap std, or ± std over seeds), R_0 and the residual, with
the final-value prediction when part of each curve was held out; which steps
each fit skipped, fitted and held out; and each seed group's mean curve with
the spread of its score per step. Notes on unreliable fits, curves that could
not be fitted and unusable metrics lines close it.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from scalerl_jax.scaling import curves
from scalerl_jax.scaling import runs as runs_lib

_ROLES = (("skipped", "skipped"), ("fitted", "fitted"), ("held_out", "held out"))


def _pm(value, std, fmt):
  return f"{value:{fmt}}" + ("" if std is None else f" ± {std:{fmt}}")


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
  widths = [max(len(row[i]) for row in [header] + rows) for i in range(len(header))]
  lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in [header] + rows]
  lines.insert(1, "  ".join("-" * w for w in widths))
  return lines


def _fit_row(name: str, curve: curves.CurveFit, extrap: bool, width: int) -> list[str]:
  f = curve.fit
  if f is None:
    return [name, str(int((curve.steps > 0).sum()))] + ["-"] * (width - 2)
  u = curve.uncertainty
  row = [name, str(f.num_points), _pm(f.a, u and u.a_std, ".3f"), _pm(f.b, u and u.b_std, ".2f"),
         _pm(f.c_mid, u and u.c_mid_std, ".3g"), f"{f.r0:.3f}", f"{f.rmse:.4f}",
         "yes" if f.reliable else "NO"]
  if extrap:
    e = curve.extrapolation
    row += [f"{e.final_prediction:.3f}", f"{e.final_score:.3f}", f"{e.final_error:+.4f}",
            f"{e.mean_abs_error:.4f}"]
  return row


def _rows(groups: Sequence[curves.GroupFit]):
  """(row label, curve name, curve, group) in table order: a group's mean fit,
  its spread over seeds (curve and name None), its seeds."""
  for g in groups:
    if len(g.runs) == 1:
      yield g.runs[0].name, g.runs[0].name, g.fits[0], g
      continue
    mean = f"{g.name} [mean of {len(g.runs)} seeds]"
    yield mean, mean, g.mean_fit, g
    yield f"{g.name} [per-seed mean ± std]", None, None, g
    for run, curve in zip(g.runs, g.fits):
      yield f"  {run.name}", run.name, curve, g


def _spread_row(name: str, g: curves.GroupFit, width: int) -> list[str]:
  s = g.spread
  if s is None:  # Fewer than two seeds could be fitted.
    return [name, f"{sum(f.fit is not None for f in g.fits)} seeds"] + ["-"] * (width - 2)
  return ([name, f"{s.num_runs} seeds", _pm(s.a_mean, s.a_std, ".3f"),
           _pm(s.b_mean, s.b_std, ".2f"), _pm(s.c_mid_mean, s.c_mid_std, ".3g")]
          + ["-"] * (width - 5))


def _points(name: str, curve: curves.CurveFit) -> str:
  """Which steps (and compute) of a curve played which part in its fit."""
  roles = curve.roles()
  r0 = np.flatnonzero(roles["r0"])
  parts = [f"R_0 {curve.score[r0[0]]:.3f} at step 0" if r0.size else "no step 0"]
  for key, label in _ROLES:
    mask = roles[key]
    if key == "skipped":
      label += f" (x < {curve.skip_until:.4g})"
    if not mask.any():
      parts.append(f"{label}: none")
      continue
    s, x, n = curve.steps[mask], curve.compute[mask], int(mask.sum())
    where = (f"step {s[0]} (1 point, x {x[0]:.4g})" if n == 1 else
             f"steps {s[0]}-{s[-1]} ({n} points, x {x[0]:.4g}-{x[-1]:.4g})")
    parts.append(f"{label}: {where}")
  return f"{name}: " + "; ".join(parts)


def _mean_curve(g: curves.GroupFit) -> list[str]:
  m = g.mean
  worst = int(m.score_std.argmax())
  lines = [f"{g.name}: {m.num_seeds} seeds ({', '.join(r.name for r in g.runs)}); score std over "
           f"seeds: mean {m.score_std.mean():.4f}, max {m.score_std[worst]:.4f} at step "
           f"{m.steps[worst]}"]
  if m.steps_left_out:
    lines.append(f"  steps not evaluated by every seed, left out: {list(m.steps_left_out)}")
  rows = [[str(s), f"{x:.4g}", f"{v:.4f}", f"{sd:.4f}", f"{lo:.4f}", f"{hi:.4f}"]
          for s, x, v, sd, lo, hi in zip(m.steps, m.compute, m.score, m.score_std, m.score_min,
                                         m.score_max)]
  lines += ["  " + line for line in _table(["step", "x", "mean", "std", "min", "max"], rows)]
  return lines


def format_report(groups: Sequence[curves.GroupFit], *, x_key: str, y_key: str,
                  skip_fraction: float, fit_fraction: float, num_bootstrap: int = 0) -> str:
  """The report of the module docstring.

  Args:
    groups: fitted seed groups.
    x_key: the compute measure.
    y_key: the score.
    skip_fraction: share of each curve's final compute left out at the start.
    fit_fraction: share of each curve's final compute fitted.
    num_bootstrap: resamples behind the ± of single fits (0: none).

  Returns:
    The report, ending in a newline.
  """
  extrap = fit_fraction < 1
  out = [f"x: {x_key}; y: {y_key}; R_0: the score at step 0, measured, not fitted",
         f"skipped: points below {skip_fraction:.1%} of each curve's final compute, but step 0"]
  out.append(f"fitted: up to {fit_fraction:.0%} of each curve's final compute; the final value "
             "is predicted from it (final err = predicted - measured)" if extrap
             else "fitted: the whole curve after the skipped points")
  out.append("±: " + (f"bootstrap std over {num_bootstrap} resamples" if num_bootstrap else
                      "none (no bootstrap)") + "; over seeds, std of the per-seed fits")
  header = ["curve", "points", "A", "B", f"C_mid [{x_key}]", "R_0", "RMSE", "reliable"]
  if extrap:
    header += ["final pred", "final meas", "final err", "mean |err|"]
  rows, points, notes = [], [], []
  for label, name, curve, g in _rows(groups):
    if curve is None:
      rows.append(_spread_row(label, g, len(header)))
      continue
    rows.append(_fit_row(label, curve, extrap, len(header)))
    points.append(_points(name, curve))
    if curve.fit is None:
      notes.append(f"{name}: not fitted: {curve.error}")
    else:
      notes.extend(f"{name}: {w}" for w in curve.fit.warnings)
  for g in groups:
    for run in g.runs:
      if run.problems:
        notes.append(f"{run.name}: {len(run.problems)} unusable line(s) in {runs_lib.METRICS}, "
                     f"first: {run.problems[0]}")
  out += [""] + _table(header, rows) + ["", "points used (steps, and x in " + x_key + "):"]
  out += points
  means = [g for g in groups if g.mean is not None]
  if means:
    out += ["", f"mean curves over seeds ({y_key} per step):"]
    for g in means:
      out += _mean_curve(g)
  if notes:
    out += ["", "notes:"] + notes
  return "\n".join(out) + "\n"
