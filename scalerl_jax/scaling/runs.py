"""Finished runs -> fitted curves -> a table.

A run's workdir holds `metrics.jsonl`, one JSON object per line with an int
"step" and metric keys. Validation lines carry the pass rate (by default
"val/mean_at_k"); every line carries cumulative compute ("compute/flops",
"compute/device_seconds"). Lines without the score key are training lines and
are skipped; lines that cannot be used are reported with file and line number,
never dropped silently.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Optional, Sequence

from absl import logging
import numpy as np

from scalerl_jax.scaling import sigmoid

METRICS = "metrics.jsonl"
# Compute measures derived from a logged key: name -> (source key, factor).
DERIVED = {"compute/device_hours": ("compute/device_seconds", 1 / 3600)}


@dataclasses.dataclass(frozen=True)
class Run:
  """The (compute, score) curve of one run."""
  name: str
  workdir: str
  compute: np.ndarray  # [N] cumulative compute at each evaluation, by step.
  score: np.ndarray  # [N] validation pass rate.
  problems: tuple[str, ...]  # "path:line: what is wrong" for every unusable line.


@dataclasses.dataclass(frozen=True)
class RunFit:
  """A run with its fit, or the reason it could not be fitted."""
  run: Run
  fit: Optional[sigmoid.SigmoidFit] = None
  extrapolation: Optional[sigmoid.Extrapolation] = None  # Set when fit on a fraction.
  error: str = ""


def find_workdirs(paths: Sequence[str]) -> list[str]:
  """Expands each path: a run's workdir, or a sweep directory of workdirs.

  Args:
    paths: directories holding `metrics.jsonl` or whose subdirectories do.

  Returns:
    The run workdirs, in the given order, a sweep's runs sorted by name.
  """
  out = []
  for path in paths:
    if os.path.isfile(os.path.join(path, METRICS)):
      out.append(path)
    elif os.path.isdir(path):
      subdirs = sorted(d for d in os.listdir(path) if os.path.isdir(os.path.join(path, d)))
      runs = [d for d in subdirs if os.path.isfile(os.path.join(path, d, METRICS))]
      if not runs:
        raise FileNotFoundError(f"{path}: no {METRICS} in it or in its subdirectories")
      for d in sorted(set(subdirs) - set(runs)):
        logging.warning("%s: no %s yet, left out", os.path.join(path, d), METRICS)
      out.extend(os.path.join(path, d) for d in runs)
    else:
      raise FileNotFoundError(f"{path}: no such directory")
  return out


def _number(value):
  return (isinstance(value, (int, float)) and not isinstance(value, bool)
          and math.isfinite(value))


def read_run(workdir: str, x_key: str = "compute/flops", y_key: str = "val/mean_at_k",
             name: Optional[str] = None) -> Run:
  """Reads the (x_key, y_key) curve of one run, ordered by step.

  Args:
    workdir: the run's directory.
    x_key: compute measure; a logged key or one of `DERIVED`.
    y_key: the validation score key.
    name: label of the run; defaults to the workdir's base name.

  Returns:
    The run. A step logged twice (a resumed run) keeps its last line and is
    reported in `problems`, like every malformed line.
  """
  path = os.path.join(workdir, METRICS)
  source, factor = DERIVED.get(x_key, (x_key, 1.0))
  problems, by_step = [], {}
  with open(path) as f:
    for lineno, line in enumerate(f, 1):
      where = f"{path}:{lineno}"
      if not line.strip():
        continue
      try:
        row = json.loads(line)
      except json.JSONDecodeError as e:
        problems.append(f"{where}: not valid JSON ({e.msg})")
        continue
      if not isinstance(row, dict):
        problems.append(f"{where}: not a JSON object")
        continue
      if y_key not in row:
        continue
      step, x, y = row.get("step"), row.get(source), row[y_key]
      if not isinstance(step, int) or isinstance(step, bool):
        problems.append(f"{where}: no integer 'step'")
      elif not _number(x):
        problems.append(f"{where}: {source!r} is {x!r}, not a finite number")
      elif not _number(y):
        problems.append(f"{where}: {y_key!r} is {y!r}, not a finite number")
      else:
        if step in by_step:
          problems.append(f"{where}: step {step} logged again; keeping this line")
        by_step[step] = (x * factor, y)
  steps = sorted(by_step)
  xy = np.array([by_step[s] for s in steps], dtype=float).reshape(-1, 2)
  return Run(name=name or os.path.basename(os.path.normpath(workdir)), workdir=workdir,
             compute=xy[:, 0], score=xy[:, 1], problems=tuple(problems))


def fit_runs(runs: Sequence[Run], fit_fraction: float = 1.0, **fit_kwargs) -> list[RunFit]:
  """Fits every run; a run that cannot be fitted carries the reason instead.

  Args:
    runs: the runs.
    fit_fraction: 1 fits the whole run; below 1 fits that share of the final
      compute and measures the prediction error on the rest.
    **fit_kwargs: passed to `sigmoid.fit`.

  Returns:
    One RunFit per run, in order.
  """
  out = []
  for run in runs:
    try:
      if fit_fraction >= 1:
        out.append(RunFit(run, fit=sigmoid.fit(run.compute, run.score, **fit_kwargs)))
      else:
        ex = sigmoid.extrapolate(run.compute, run.score, fit_fraction, **fit_kwargs)
        out.append(RunFit(run, fit=ex.fit, extrapolation=ex))
    except ValueError as e:
      out.append(RunFit(run, error=str(e)))
  return out


def _pm(value, std, fmt):
  return f"{value:{fmt}}" + ("" if std is None else f" ± {std:{fmt}}")


def format_table(results: Sequence[RunFit], x_key: str) -> str:
  """A plain-text table of A, B, C_mid (± bootstrap std), R_0 and the residual.

  Args:
    results: fitted runs.
    x_key: the compute measure, named in the C_mid header.

  Returns:
    The table, followed by notes on unreliable fits, failures and bad lines.
  """
  extrap = any(r.extrapolation for r in results)
  header = ["run", "points", "A", "B", f"C_mid [{x_key}]", "R_0", "RMSE", "reliable"]
  if extrap:
    header += ["fit up to", "last err", "mean |err|"]
  rows, notes = [], []
  for r in results:
    f = r.fit
    if f is None:
      rows.append([r.run.name, str(r.run.compute.size)] + ["-"] * (len(header) - 2))
      notes.append(f"{r.run.name}: not fitted: {r.error}")
    else:
      u = f.uncertainty
      rows.append([r.run.name, str(f.num_points), _pm(f.a, u and u.a_std, ".3f"),
                   _pm(f.b, u and u.b_std, ".2f"), _pm(f.c_mid, u and u.c_mid_std, ".3g"),
                   f"{f.r0:.3f} ({f.r0_source})", f"{f.rmse:.4f}", "yes" if f.reliable else "NO"])
      notes.extend(f"{r.run.name}: {w}" for w in f.warnings)
      if extrap:
        e = r.extrapolation
        rows[-1] += [f"{e.split:.3g}", f"{e.last_error:+.4f}", f"{e.mean_abs_error:.4f}"]
    if r.run.problems:
      notes.append(f"{r.run.name}: {len(r.run.problems)} unusable line(s) in {METRICS}, "
                   f"first: {r.run.problems[0]}")
  widths = [max(len(row[i]) for row in [header] + rows) for i in range(len(header))]
  lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in [header] + rows]
  lines.insert(1, "  ".join("-" * w for w in widths))
  return "\n".join(lines + ([""] + notes if notes else [])) + "\n"
