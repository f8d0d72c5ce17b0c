"""Reading runs' workdirs: the (step, compute, score) curve of each run.

Unusable lines of `metrics.jsonl` are reported in `Run.problems` with file
and line number, never dropped silently.

Shape letters: the package key (scalerl_jax/__init__.py), and J evaluated
steps of a run. Design: docs/design/scaling.md.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Optional, Sequence

from absl import logging
import numpy as np

from scalerl_jax import workdir as workdir_lib
from scalerl_jax.metrics import rows as rows_lib

# Compute measures derived from a logged key: name -> (source key, factor).
# Device-hours are the paper's GPU-hours.
DERIVED = {"compute/device_hours": ("compute/device_seconds", 1 / 3600)}


@dataclasses.dataclass(frozen=True)
class Run:
  """The (step, compute, score) curve of one run."""

  name: str
  workdir: str
  steps: np.ndarray  # [J] increasing steps with a validation score.
  compute: np.ndarray  # [J] cumulative compute at each of them.
  score: np.ndarray  # [J] validation pass rate.
  # "path:line: what is wrong" for every unusable line.
  problems: tuple[str, ...]


def find_workdirs(paths: Sequence[str]) -> list[str]:
  """Run workdirs in or below each path, each once, in the order given.

  Below a directory the search stops at the first workdir of each branch
  (runs sorted by path); subdirectories without `metrics.jsonl` are left out
  with a warning. Raises FileNotFoundError for a path with no run.
  """
  out = []
  for path in paths:
    if os.path.isfile(os.path.join(path, workdir_lib.METRICS_FILE)):
      found = [path]
    elif os.path.isdir(path):
      found = []
      for root, dirs, files in os.walk(path):
        dirs.sort()
        if workdir_lib.METRICS_FILE in files:
          found.append(root)
          dirs.clear()
      if not found:
        raise FileNotFoundError(
            f"{path}: no {workdir_lib.METRICS_FILE} in it or below it"
        )
      for d in sorted(os.listdir(path)):
        sub = os.path.join(path, d)
        if os.path.isdir(sub) and not any(
            w == sub or w.startswith(sub + os.sep) for w in found
        ):
          logging.warning(
              "%s: no %s yet, left out", sub, workdir_lib.METRICS_FILE
          )
    else:
      raise FileNotFoundError(f"{path}: no such directory")
    out.extend(w for w in found if w not in out)
  return out


def labels(workdirs: Sequence[str]) -> list[str]:
  """Each workdir's path below their common directory; alone, its base name."""
  paths = [os.path.abspath(w) for w in workdirs]
  if len(paths) == 1:
    return [os.path.basename(paths[0])]
  root = os.path.commonpath(paths)
  return [os.path.relpath(p, root) for p in paths]


def _number(value):
  return (
      isinstance(value, (int, float))
      and not isinstance(value, bool)
      and math.isfinite(value)
  )


def read_run(
    workdir: str,
    x_key: str = "compute/device_hours",
    y_key: str = "val/mean_at_k",
    name: Optional[str] = None,
) -> Run:
  """The (`x_key`, `y_key`) curve of one run, ordered by step.

  `x_key` is a logged key ("compute/flops", even "step") or one of `DERIVED`.
  A step logged twice (a resumed run) keeps its last line; that and every
  malformed line are reported in `problems`.
  """
  source, factor = DERIVED.get(x_key, (x_key, 1.0))
  problems, by_step = [], {}
  for where, row in rows_lib.lines(workdir):
    if isinstance(row, str):
      problems.append(f"{where}: {row}")
      continue
    if y_key not in row:
      continue
    step, x, y = row.get("step"), row.get(source), row[y_key]
    if not rows_lib.is_step(step):
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
  return Run(
      name=name or os.path.basename(os.path.normpath(workdir)),
      workdir=workdir,
      steps=np.array(steps, dtype=int),
      compute=xy[:, 0],
      score=xy[:, 1],
      problems=tuple(problems),
  )
