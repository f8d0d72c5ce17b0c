"""Fits compute-performance curves to runs; prints a report, writes a plot.

  python -m launch.fit --workdirs=/tmp/sweeps/loss_type --fit_fraction=0.5
  python -m launch.fit --workdirs=/tmp/multitask --fit_fraction=0.5 \
      --metric=val/math/mean_at_k,val/code/mean_at_k

Each entry of --workdirs is a run's workdir or a directory with workdirs
below it; all runs go into one report and one figure. Runs whose names
differ only in a seed marker (`cispo_seed1`, `seed=1/cispo`) are one
configuration's seeds. Below 1, --fit_fraction predicts the rest of each
curve and sets the error beside the noise of one validation score. Runs of
an ablation grid (a directory in their paths named like its sweep file, or
--grid) are checked against the paper's claims on it: "agrees", "disagrees"
or "inconclusive". A train metric (--metric=train/code/reward_mean) has no
step 0, so its R_0 is fitted. The procedure: docs/design/scaling.md.
"""

import os

from absl import app
from absl import flags
from absl import logging

from scalerl_jax.scaling import compare
from scalerl_jax.scaling import curves
from scalerl_jax.scaling import plots
from scalerl_jax.scaling import report
from scalerl_jax.scaling import runs
from scalerl_jax.scaling import uncertainty
from scalerl_jax.scaling import verdicts

_WORKDIRS = flags.DEFINE_list(
    "workdirs", None, "Run workdirs or directories holding them.", required=True
)
_X = flags.DEFINE_string(
    "x",
    "compute/device_hours",
    "Compute of all generated and trained tokens: compute/device_hours (device seconds / "
    "3600, the paper's GPU-hours), compute/flops, or step.",
)
_Y = flags.DEFINE_string("y", "val/mean_at_k", "Validation score key.")
_METRIC = flags.DEFINE_list(
    "metric",
    None,
    "Logged metrics to fit, each its own sigmoid, e.g. val/math/mean_at_k,val/code/mean_at_k "
    "(a mixture's domains); default --y. With several, one report and plot per metric "
    "(<out>_<metric>.png) and a table of them side by side.",
)
_SKIP_FRACTION = flags.DEFINE_float(
    "skip_fraction",
    curves.SKIP_FRACTION,
    "Leave out the points in this share of each curve's final compute (step 0 stays, as "
    "R_0). The paper drops the first ~1.5k GPU-hours (about an epoch) of 50k-100k GPU-hour "
    "runs, 1.5-3%; the default is its share of a 50k run.",
)
_FIT_FRACTION = flags.DEFINE_float(
    "fit_fraction",
    1.0,
    "Share of each curve's final compute to fit on; the rest is predicted (paper: 0.5).",
)
_NUM_BOOTSTRAP = flags.DEFINE_integer(
    "num_bootstrap",
    uncertainty.NUM_BOOTSTRAP,
    "Resamples for the fits' uncertainties; 0 for none.",
)
_OUT = flags.DEFINE_string(
    "out",
    None,
    "PNG path; the report goes beside it as .txt. Default: <first workdir>/fit.png.",
)
_LOG_X = flags.DEFINE_bool("log_x", True, "Logarithmic compute axis.")
_GRID = flags.DEFINE_enum(
    "grid",
    None,
    list(compare.PAPER_CLAIMS),
    "Ablation grid whose paper claims to check; default: the one the runs' paths name, if any.",
)


def _fit_metric(workdirs, y_key):
  """(fitted groups, report text) of one metric over `workdirs`."""
  loaded = [
      runs.read_run(w, _X.value, y_key, name)
      for w, name in zip(workdirs, runs.labels(workdirs))
  ]
  for run in loaded:
    for problem in run.problems:
      logging.warning("%s", problem)
  noise = {
      r.name: runs.read_run(
          r.workdir, _X.value, y_key + report.STDERR_SUFFIX
      ).score
      for r in loaded
  }
  try:
    groups = curves.fit_groups(
        loaded,
        skip_fraction=_SKIP_FRACTION.value,
        fit_fraction=_FIT_FRACTION.value,
        num_bootstrap=_NUM_BOOTSTRAP.value,
    )
    grid = _GRID.value or compare.find_grid(workdirs)
    checked = verdicts.format_verdicts(grid, groups) if grid else ""
  except ValueError as e:
    raise SystemExit(f"launch.fit: {y_key}: {e}") from None
  text = report.format_report(
      groups,
      x_key=_X.value,
      y_key=y_key,
      skip_fraction=_SKIP_FRACTION.value,
      fit_fraction=_FIT_FRACTION.value,
      num_bootstrap=_NUM_BOOTSTRAP.value,
      noise=noise,
  )
  return groups, text + (checked and "\n" + checked)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  try:
    workdirs = runs.find_workdirs(_WORKDIRS.value)
  except FileNotFoundError as e:
    raise SystemExit(f"launch.fit: {e}") from None
  metrics = _METRIC.value or [_Y.value]
  out = _OUT.value or os.path.join(_WORKDIRS.value[0], "fit.png")
  by_metric, texts = {}, []
  for metric in metrics:
    groups, text = _fit_metric(workdirs, metric)
    by_metric[metric] = groups
    path = out
    if len(metrics) > 1:
      stem, ext = os.path.splitext(out)
      path = f"{stem}_{metric.replace('/', '_')}{ext}"
      text = f"== {metric} ==\n{text}"
    plots.plot_groups(
        groups, path, x_label=_X.value, y_label=metric, log_x=_LOG_X.value
    )
    texts.append(text)
  if len(metrics) > 1:
    texts.append(report.format_side_by_side(by_metric, _FIT_FRACTION.value))
  text = "\n".join(texts)
  print(text, end="")
  with open(os.path.splitext(out)[0] + ".txt", "w") as f:
    f.write(text)
  print(f"wrote {os.path.splitext(out)[0]}.txt and the plot(s) beside it")


if __name__ == "__main__":
  app.run(main)
