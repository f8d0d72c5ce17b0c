"""Figures of fitted compute-performance curves (matplotlib, an Agg canvas).

One figure holds every configuration, one colour each: points filled where
fitted, hollow where held out, crosses where skipped; the fit solid over the
fitted compute, dashed beyond, and A dotted. No pyplot state is touched.
Design: docs/design/scaling.md.
"""

from __future__ import annotations

import os
from typing import Sequence

import matplotlib
from matplotlib import figure
from matplotlib.backends import backend_agg
import numpy as np

from scalerl_jax.scaling import curves
from scalerl_jax.scaling import sigmoid

_EXTEND = 1.5  # The dashed curve runs this factor past the last point.


def _draw_curve(
    ax, curve: curves.CurveFit, colour: str, label: str, log_x: bool
) -> None:
  """The curve's points by role, its fit, and the fit/extrapolation boundary."""
  x, y = curve.compute, curve.score
  shown = x > 0 if log_x else np.ones_like(x, dtype=bool)
  roles = curve.roles()
  f = curve.fit
  label = label if f is None else f"{label}: A={f.a:.3f} B={f.b:.2f}"
  fitted = shown & (roles["fitted"] | roles["r0"])
  ax.scatter(x[fitted], y[fitted], s=12, color=colour, label=label)
  ax.scatter(
      x[shown & roles["held_out"]],
      y[shown & roles["held_out"]],
      s=12,
      facecolors="none",
      edgecolors=colour,
  )
  ax.scatter(
      x[shown & roles["skipped"]],
      y[shown & roles["skipped"]],
      s=12,
      color=colour,
      marker="x",
  )
  if f is None:
    return
  lo, fit_end = f.compute_range
  end = max(fit_end, float(x.max())) * _EXTEND
  xs = np.geomspace(lo, fit_end, 200) if log_x else np.linspace(0, fit_end, 200)
  ax.plot(xs, sigmoid.predict(f, xs), color=colour, linewidth=1.5)
  xs = (
      np.geomspace(fit_end, end, 100)
      if log_x
      else np.linspace(fit_end, end, 100)
  )
  ax.plot(
      xs, sigmoid.predict(f, xs), color=colour, linewidth=1.5, linestyle="--"
  )
  ax.axhline(f.a, color=colour, linewidth=0.8, linestyle=":")
  if curve.extrapolation is not None:
    ax.axvline(
        curve.extrapolation.split, color=colour, linewidth=0.8, linestyle="-."
    )


def plot_groups(
    groups: Sequence[curves.GroupFit],
    path: str,
    *,
    x_label: str,
    y_label: str,
    title: str = "",
    log_x: bool = True,
) -> str:
  """Draws the groups and their fits into one PNG at `path`; returns `path`.

  Curves without a fit show their points only; with `log_x`, points at
  compute 0 are not drawn. The directory of `path` is created.
  """
  fig = figure.Figure(figsize=(8, 5.5), dpi=120)
  backend_agg.FigureCanvasAgg(fig)
  ax = fig.add_subplot()
  colours = matplotlib.rcParams["axes.prop_cycle"].by_key()["color"]
  for i, g in enumerate(groups):
    colour = colours[i % len(colours)]
    if g.mean is None:
      _draw_curve(ax, g.fits[0], colour, g.runs[0].name, log_x)
      continue
    m = g.mean
    band = m.compute > 0 if log_x else np.ones_like(m.compute, dtype=bool)
    ax.fill_between(
        m.compute[band],
        m.score_min[band],
        m.score_max[band],
        color=colour,
        alpha=0.2,
        linewidth=0,
    )
    _draw_curve(
        ax,
        g.mean_fit,
        colour,
        f"{g.name} (mean of {m.num_seeds} seeds, band min-max)",
        log_x,
    )
  if log_x:
    ax.set_xscale("log")
  ax.set_xlabel(x_label)
  ax.set_ylabel(y_label)
  ax.set_title(
      title
      or "fitted curves (dashed: extrapolated, dash-dot: end of the fitted "
      "compute, dotted: A, x: skipped)",
      fontsize=9,
  )
  ax.grid(True, alpha=0.3)
  ax.legend(fontsize=8, loc="lower right")
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fig.savefig(path)
  return path
