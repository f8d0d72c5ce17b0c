"""Fits compute-performance curves to finished runs; prints a table, writes a plot.

  python -m launch.fit --workdirs=/tmp/sweeps/loss_type --fit_fraction=0.5

Each entry of --workdirs is a run's workdir (holding metrics.jsonl) or a sweep
directory of such workdirs; all runs go into one table and one figure. With
--fit_fraction below 1 the curves are fitted on that share of each run's final
compute and the table reports the prediction error on the rest.
"""

import os

from absl import app
from absl import flags
from absl import logging

from scalerl_jax.scaling import plots
from scalerl_jax.scaling import runs

_WORKDIRS = flags.DEFINE_list("workdirs", None, "Run workdirs or sweep directories.",
                              required=True)
_X = flags.DEFINE_string(
    "x", "compute/flops",
    "Compute measure: a metrics key, or compute/device_hours (from device seconds).")
_Y = flags.DEFINE_string("y", "val/mean_at_k", "Validation score key.")
_FIT_FRACTION = flags.DEFINE_float(
    "fit_fraction", 1.0, "Share of each run's final compute to fit on; the rest is predicted.")
_MIN_X = flags.DEFINE_float("min_x", 0.0, "Drop points with less compute (paper: ~1 epoch).")
_NUM_BOOTSTRAP = flags.DEFINE_integer("num_bootstrap", 200, "Resamples for uncertainties.")
_OUT = flags.DEFINE_string(
    "out", None, "PNG path; the table goes beside it as .txt. Default: <first workdir>/fit.png.")
_LOG_X = flags.DEFINE_bool("log_x", True, "Logarithmic compute axis.")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  if not 0 < _FIT_FRACTION.value <= 1:
    raise app.UsageError(f"--fit_fraction must be in (0, 1]; got {_FIT_FRACTION.value}")
  try:
    workdirs = runs.find_workdirs(_WORKDIRS.value)
  except FileNotFoundError as e:
    raise SystemExit(f"launch.fit: {e}") from None
  loaded = [runs.read_run(w, _X.value, _Y.value) for w in workdirs]
  for run in loaded:
    for problem in run.problems:
      logging.warning("%s", problem)
  results = runs.fit_runs(loaded, _FIT_FRACTION.value, min_compute=_MIN_X.value,
                          num_bootstrap=_NUM_BOOTSTRAP.value)
  table = runs.format_table(results, _X.value)
  print(table, end="")
  out = _OUT.value or os.path.join(_WORKDIRS.value[0], "fit.png")
  plots.plot_runs(results, out, x_label=_X.value, y_label=_Y.value, log_x=_LOG_X.value)
  with open(os.path.splitext(out)[0] + ".txt", "w") as f:
    f.write(table)
  print(f"wrote {out} and {os.path.splitext(out)[0]}.txt")


if __name__ == "__main__":
  app.run(main)
