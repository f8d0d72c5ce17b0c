"""The text report of fitted groups.

`format_report` gives the settings, the fits (± uncertainty), the points
each used, the seed groups' mean curves, the hidden-half check and notes;
`format_side_by_side` puts several metrics' fits of the same runs side by
side. The verdicts on a grid: scaling/verdicts.py. Design:
docs/design/scaling.md.
"""

from __future__ import annotations

import math
from typing import Mapping, Optional, Sequence

import numpy as np

from scalerl_jax import workdir as workdir_lib
from scalerl_jax.scaling import curves

_ROLES = (
    ("skipped", "skipped"),
    ("fitted", "fitted"),
    ("held_out", "held out"),
)
# The trainer logs a score's sampling standard error as <score key>_stderr
# (`evaluation.summarize`: val/mean_at_k_stderr).
STDERR_SUFFIX = "_stderr"


def _pm(value, std, fmt):
  return f"{value:{fmt}}" + ("" if std is None else f" ± {std:{fmt}}")


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
  widths = [
      max(len(row[i]) for row in [header] + rows) for i in range(len(header))
  ]
  lines = [
      "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip()
      for row in [header] + rows
  ]
  lines.insert(1, "  ".join("-" * w for w in widths))
  return lines


def _fit_row(
    name: str, curve: curves.CurveFit, extrap: bool, width: int
) -> list[str]:
  f = curve.fit
  if f is None:
    return [name, str(int((curve.steps > 0).sum()))] + ["-"] * (width - 2)
  u = curve.uncertainty
  row = [
      name,
      str(f.num_points),
      _pm(f.a, u and u.a_std, ".3f"),
      _pm(f.b, u and u.b_std, ".2f"),
      _pm(f.c_mid, u and u.c_mid_std, ".3g"),
      f"{f.r0:.3f}",
      f"{f.rmse:.4f}",
      "yes" if f.reliable else "NO",
  ]
  if extrap:
    e = curve.extrapolation
    row += [
        f"{e.final_prediction:.3f}",
        f"{e.final_score:.3f}",
        f"{e.final_error:+.4f}",
        f"{e.mean_abs_error:.4f}",
    ]
  return row


def _rows(groups: Sequence[curves.GroupFit]):
  """(label, curve name, curve, group) per row: mean, spread (None), seeds."""
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
    return [name, f"{sum(f.fit is not None for f in g.fits)} seeds"] + ["-"] * (
        width - 2
    )
  return [
      name,
      f"{s.num_runs} seeds",
      _pm(s.a_mean, s.a_std, ".3f"),
      _pm(s.b_mean, s.b_std, ".2f"),
      _pm(s.c_mid_mean, s.c_mid_std, ".3g"),
  ] + ["-"] * (width - 5)


def _points(name: str, curve: curves.CurveFit) -> str:
  """Which steps (and compute) of a curve played which part in its fit."""
  roles = curve.roles()
  r0 = np.flatnonzero(roles["r0"])
  if r0.size:
    parts = [f"R_0 {curve.score[r0[0]]:.3f} at step 0"]
  elif curve.fit is not None:
    parts = [f"R_0 {curve.fit.r0:.3f} fitted (no step 0)"]
  else:
    parts = ["no step 0"]
  for key, label in _ROLES:
    mask = roles[key]
    if key == "skipped":
      label += f" (x < {curve.skip_until:.4g})"
    if not mask.any():
      parts.append(f"{label}: none")
      continue
    s, x, n = curve.steps[mask], curve.compute[mask], int(mask.sum())
    where = (
        f"step {s[0]} (1 point, x {x[0]:.4g})"
        if n == 1
        else f"steps {s[0]}-{s[-1]} ({n} points, x {x[0]:.4g}-{x[-1]:.4g})"
    )
    parts.append(f"{label}: {where}")
  return f"{name}: " + "; ".join(parts)


def _mean_curve(g: curves.GroupFit) -> list[str]:
  m = g.mean
  worst = int(m.score_std.argmax())
  lines = [
      f"{g.name}: {m.num_seeds} seeds ({', '.join(r.name for r in g.runs)}); score std over "
      f"seeds: mean {m.score_std.mean():.4f}, max {m.score_std[worst]:.4f} at step "
      f"{m.steps[worst]}"
  ]
  if m.steps_left_out:
    lines.append(
        f"  steps not evaluated by every seed, left out: {list(m.steps_left_out)}"
    )
  rows = [
      [str(s), f"{x:.4g}", f"{v:.4f}", f"{sd:.4f}", f"{lo:.4f}", f"{hi:.4f}"]
      for s, x, v, sd, lo, hi in zip(
          m.steps, m.compute, m.score, m.score_std, m.score_min, m.score_max
      )
  ]
  lines += [
      "  " + line
      for line in _table(["step", "x", "mean", "std", "min", "max"], rows)
  ]
  return lines


def _noise(
    curve: curves.CurveFit, stderrs: Sequence[np.ndarray], noise_key: str
):
  """(noise, what it is) of a curve's score, from its runs' `stderrs`."""
  n = len(stderrs)
  if n and all(v.size for v in stderrs):
    value = float(np.mean([v.mean() for v in stderrs]))
    if n == 1:
      return value, f"mean {noise_key} over {stderrs[0].size} evaluations"
    return (
        value / math.sqrt(n),
        f"mean {noise_key} / sqrt({n}), for a mean of {n} seeds",
    )
  return curve.fit.rmse, (
      f"RMSE of the fit on its {curve.fit.num_points} fitted points; "
      f"no {noise_key} logged"
  )


def _holdout(
    groups: Sequence[curves.GroupFit],
    noise: Mapping[str, np.ndarray],
    noise_key: str,
) -> list[str]:
  """The hidden-half check: per curve, the held-out error beside the noise."""
  lines = []
  for label, name, curve, g in _rows(groups):
    if curve is None:
      continue
    if curve.fit is None:
      lines.append(f"{label.strip()}: not fitted (see notes)")
      continue
    members = (
        g.runs if curve is g.mean_fit else [r for r in g.runs if r.name == name]
    )
    value, what = _noise(
        curve, [noise.get(r.name, np.zeros(0)) for r in members], noise_key
    )
    e = curve.extrapolation
    line = (
        f"{label.strip()}: {e.held_out} held-out points, mean |err| "
        f"{e.mean_abs_error:.4f}, final err {e.final_error:+.4f}; noise {value:.4f} ({what})"
    )
    # A score every prompt's samples agree on has no sampling noise.
    if value > 0:
      line += f"; mean |err| / noise {e.mean_abs_error / value:.2f}"
    if curve is g.mean_fit:
      line += (
          f"; seed-to-seed std of the final value {g.mean.score_std[-1]:.4f} "
          f"(step {g.mean.steps[-1]})"
      )
    lines.append(line)
  return lines


def _settings(
    groups: Sequence[curves.GroupFit],
    x_key: str,
    y_key: str,
    skip_fraction: float,
    fit_fraction: float,
    num_bootstrap: int,
) -> list[str]:
  """The report's first lines: its axes and what was skipped, fitted and ±."""
  extrap = fit_fraction < 1
  no_step_0 = any(not (c.steps == 0).any() for _, _, c, _ in _rows(groups) if c)
  out = [
      f"x: {x_key}; y: {y_key}; R_0: the score at step 0, measured, not fitted"
      + (
          "; fitted where a curve has no step 0 (train metrics)"
          if no_step_0
          else ""
      ),
      f"skipped: points below {skip_fraction:.1%} of each curve's final compute, but step 0",
  ]
  out.append(
      f"fitted: up to {fit_fraction:.0%} of each curve's final compute; the final value "
      "is predicted from it (final err = predicted - measured)"
      if extrap
      else "fitted: the whole curve after the skipped points"
  )
  out.append(
      "±: "
      + (
          f"bootstrap std over {num_bootstrap} resamples"
          if num_bootstrap
          else "none (no bootstrap)"
      )
      + "; over seeds, std of the per-seed fits"
  )
  return out


def _fit_header(x_key: str, extrap: bool) -> list[str]:
  """The fit table's column names; `extrap` adds the extrapolation's."""
  header = [
      "curve",
      "points",
      "A",
      "B",
      f"C_mid [{x_key}]",
      "R_0",
      "RMSE",
      "reliable",
  ]
  if extrap:
    header += ["final pred", "final meas", "final err", "mean |err|"]
  return header


def _curve_lines(
    groups: Sequence[curves.GroupFit], extrap: bool, width: int
) -> tuple[list[list[str]], list[str], list[str]]:
  """(fit table rows, points used, notes) of every curve of `groups`."""
  rows, points, notes = [], [], []
  for label, name, curve, g in _rows(groups):
    if curve is None:
      rows.append(_spread_row(label, g, width))
      continue
    rows.append(_fit_row(label, curve, extrap, width))
    points.append(_points(name, curve))
    if curve.fit is None:
      notes.append(f"{name}: not fitted: {curve.error}")
    else:
      notes.extend(f"{name}: {w}" for w in curve.fit.warnings)
  for g in groups:
    for run in g.runs:
      if run.problems:
        notes.append(
            f"{run.name}: {len(run.problems)} unusable line(s) in {workdir_lib.METRICS_FILE}, "
            f"first: {run.problems[0]}"
        )
  return rows, points, notes


def _mean_curves(groups: Sequence[curves.GroupFit], y_key: str) -> list[str]:
  """The seed groups' mean curves, headed; none without a seed group."""
  means = [g for g in groups if g.mean is not None]
  if not means:
    return []
  out = ["", f"mean curves over seeds ({y_key} per step):"]
  for g in means:
    out += _mean_curve(g)
  return out


def format_report(
    groups: Sequence[curves.GroupFit],
    *,
    x_key: str,
    y_key: str,
    skip_fraction: float,
    fit_fraction: float,
    num_bootstrap: int = 0,
    noise: Optional[Mapping[str, np.ndarray]] = None,
) -> str:
  """The report of the module docstring, ending in a newline.

  `noise` maps a run's name to the sampling standard error of its score at
  each evaluation (`y_key` + STDERR_SUFFIX): the hidden-half check's noise,
  divided by sqrt(n) for a mean of n seeds, or the fit's RMSE where none was
  logged. `num_bootstrap` (0: none) is reported as the source of the ±.
  """
  extrap = fit_fraction < 1
  out = _settings(
      groups, x_key, y_key, skip_fraction, fit_fraction, num_bootstrap
  )
  header = _fit_header(x_key, extrap)
  rows, points, notes = _curve_lines(groups, extrap, len(header))
  out += (
      [""]
      + _table(header, rows)
      + ["", "points used (steps, and x in " + x_key + "):"]
  )
  out += points
  out += _mean_curves(groups, y_key)
  if extrap:
    out += [
        "",
        f"hidden-half check: the fit of the first {fit_fraction:.0%} of each curve's "
        "compute, its error on the rest, and the noise of one validation score:",
    ]
    out += _holdout(groups, noise or {}, y_key + STDERR_SUFFIX)
  if notes:
    out += ["", "notes:"] + notes
  return "\n".join(out) + "\n"


def format_side_by_side(
    by_metric: Mapping[str, Sequence[curves.GroupFit]], fit_fraction: float
) -> str:
  """One row per curve, one block of columns per metric, ending in a newline.

  `by_metric` holds each metric's fitted groups, the same runs in the same
  order for every metric; below 1, `fit_fraction` adds the final error.
  """
  metrics = list(by_metric)
  columns = ["A", "B", "C_mid"] + (["final err"] if fit_fraction < 1 else [])
  header = ["curve"] + [f"{m} {c}" for m in metrics for c in columns]
  labels = [
      (label, curve is None)
      for label, _, curve, _ in _rows(by_metric[metrics[0]])
  ]
  blocks = []
  for metric in metrics:
    block = []
    for _, _, curve, g in _rows(by_metric[metric]):
      if curve is None:
        s = g.spread
        block.append(
            ["-"] * len(columns)
            if s is None
            else [
                _pm(s.a_mean, s.a_std, ".3f"),
                _pm(s.b_mean, s.b_std, ".2f"),
                _pm(s.c_mid_mean, s.c_mid_std, ".3g"),
            ]
            + ["-"] * (len(columns) - 3)
        )
      elif curve.fit is None:
        block.append(["-"] * len(columns))
      else:
        f = curve.fit
        block.append(
            [f"{f.a:.3f}", f"{f.b:.2f}", f"{f.c_mid:.3g}"]
            + (
                [f"{curve.extrapolation.final_error:+.4f}"]
                if fit_fraction < 1
                else []
            )
        )
    blocks.append(block)
  rows = [
      [label] + [c for block in blocks for c in block[i]]
      for i, (label, _) in enumerate(labels)
  ]
  return "\n".join(["side by side:"] + _table(header, rows)) + "\n"
