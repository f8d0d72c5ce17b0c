"""Figures of fitted compute-performance curves (matplotlib, Agg canvas).

One figure holds every run of a sweep: measured points (filled where fitted,
hollow where held out), the fitted curve (solid over the fitted compute,
dashed where it extrapolates) and the asymptote A (dotted), one colour per run.
No pyplot state is touched, so plotting is safe inside tests and servers.
"""

from __future__ import annotations

import os
from typing import Sequence

import matplotlib
from matplotlib import figure
from matplotlib.backends import backend_agg
import numpy as np

from scalerl_jax.scaling import runs as runs_lib
from scalerl_jax.scaling import sigmoid

_EXTEND = 1.5  # The dashed curve runs this factor past the last point.


def plot_runs(results: Sequence[runs_lib.RunFit], path: str, *, x_label: str, y_label: str,
              title: str = "", log_x: bool = True) -> str:
  """Draws the runs and their fits into one PNG.

  Args:
    results: fitted runs (runs without a fit show their points only).
    path: output file; its directory is created.
    x_label: the compute measure.
    y_label: the score.
    title: figure title.
    log_x: logarithmic compute axis (points at compute 0 are then not drawn).

  Returns:
    `path`.
  """
  fig = figure.Figure(figsize=(8, 5.5), dpi=120)
  backend_agg.FigureCanvasAgg(fig)
  ax = fig.add_subplot()
  colours = matplotlib.rcParams["axes.prop_cycle"].by_key()["color"]
  for i, r in enumerate(results):
    colour = colours[i % len(colours)]
    x, y = r.run.compute, r.run.score
    shown = x > 0 if log_x else np.ones_like(x, dtype=bool)
    f = r.fit
    fitted = x <= (r.extrapolation.split if r.extrapolation else np.inf)
    label = r.run.name if f is None else f"{r.run.name}: A={f.a:.3f} B={f.b:.2f}"
    ax.scatter(x[shown & fitted], y[shown & fitted], s=12, color=colour, label=label)
    ax.scatter(x[shown & ~fitted], y[shown & ~fitted], s=12, facecolors="none",
               edgecolors=colour)
    if f is None:
      continue
    lo, fit_end = f.compute_range
    end = max(fit_end, float(x.max())) * _EXTEND
    xs = np.geomspace(lo, fit_end, 200) if log_x else np.linspace(0, fit_end, 200)
    ax.plot(xs, sigmoid.predict(f, xs), color=colour, linewidth=1.5)
    xs = np.geomspace(fit_end, end, 100) if log_x else np.linspace(fit_end, end, 100)
    ax.plot(xs, sigmoid.predict(f, xs), color=colour, linewidth=1.5, linestyle="--")
    ax.axhline(f.a, color=colour, linewidth=0.8, linestyle=":")
  if log_x:
    ax.set_xscale("log")
  ax.set_xlabel(x_label)
  ax.set_ylabel(y_label)
  ax.set_title(title or "fitted compute-performance curves (dashed: extrapolated, dotted: A)")
  ax.grid(True, alpha=0.3)
  ax.legend(fontsize=8, loc="lower right")
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fig.savefig(path)
  return path
