"""Runs that differ only in seed: grouping, the mean curve, the fits' spread.

A run's seed is a part `seed<n>`, `seed=<n>`, `seed_<n>` or `seed-<n>` of
its name (`cispo_seed1`, `seed=1/cispo`); runs whose names agree without it
are one configuration's seeds.

Shape letters: the package key (scalerl_jax/__init__.py), and J steps that
every seed of a group evaluated. Design: docs/design/scaling.md.
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Optional, Sequence

import numpy as np

from scalerl_jax.scaling import runs as runs_lib
from scalerl_jax.scaling import sigmoid

# A seed marker inside one path component, between separators or the ends.
_SEED = re.compile(r"(?:^|[_.-])seed[=_-]?(\d+)(?=$|[_.-])")


@dataclasses.dataclass(frozen=True)
class MeanCurve:
  """The seeds' curves averaged step by step, at steps all seeds evaluated."""

  steps: np.ndarray  # [J]
  # [J] mean over seeds (device time differs between seeds).
  compute: np.ndarray
  score: np.ndarray  # [J] mean over seeds.
  score_std: np.ndarray  # [J] sample standard deviation over seeds.
  score_min: np.ndarray  # [J]
  score_max: np.ndarray  # [J]
  num_seeds: int
  steps_left_out: tuple[int, ...]  # Evaluated by some seeds but not all.


@dataclasses.dataclass(frozen=True)
class Spread:
  """Mean and sample standard deviation of fitted parameters over seeds."""

  a_mean: float
  a_std: float
  b_mean: float
  b_std: float
  c_mid_mean: float
  c_mid_std: float
  num_runs: int


def split_seed(name: str) -> tuple[str, Optional[int]]:
  """(configuration name, seed) of a run's name, a relative path.

  The seed is None without a marker; the configuration's name is "" for a name
  that is only a seed marker ("seed=1").
  """
  seed, parts = None, []
  for part in name.split("/"):
    match = _SEED.search(part)
    if match and seed is None:
      seed = int(match.group(1))
      part = (part[: match.start()] + part[match.end() :]).strip("_.-")
    if part:
      parts.append(part)
  return "/".join(parts), seed


def group_runs(
    runs: Sequence[runs_lib.Run],
) -> list[tuple[str, list[runs_lib.Run]]]:
  """(configuration name, its runs) for runs differing only in seed, in order.

  A run named only by a seed marker is named after its workdir's parent
  directory (`cispo/seed=1` given alone as `seed=1`).
  """
  groups: dict[str, list[runs_lib.Run]] = {}
  for run in runs:
    key, _ = split_seed(run.name)
    key = key or os.path.basename(os.path.dirname(os.path.abspath(run.workdir)))
    groups.setdefault(key, []).append(run)
  return list(groups.items())


def mean_curve(runs: Sequence[runs_lib.Run]) -> MeanCurve:
  """Two or more seeds' compute and score averaged where all were evaluated."""
  if len(runs) < 2:
    raise ValueError(
        f"a mean over seeds needs at least 2 runs; got {len(runs)}"
    )
  shared = set.intersection(*(set(r.steps.tolist()) for r in runs))
  every = set.union(*(set(r.steps.tolist()) for r in runs))
  common = sorted(shared)
  if not common:
    raise ValueError(
        f"the runs {[r.name for r in runs]} share no evaluated step"
    )
  pick = [np.searchsorted(r.steps, common) for r in runs]
  compute = np.stack([r.compute[i] for r, i in zip(runs, pick)])  # [seeds, J]
  score = np.stack([r.score[i] for r, i in zip(runs, pick)])  # [seeds, J]
  return MeanCurve(
      steps=np.array(common),
      compute=compute.mean(0),
      score=score.mean(0),
      score_std=score.std(0, ddof=1),
      score_min=score.min(0),
      score_max=score.max(0),
      num_seeds=len(runs),
      steps_left_out=tuple(sorted(every - shared)),
  )


def spread(fits: Sequence[sigmoid.SigmoidFit]) -> Spread:
  """Mean and sample std of A, B and C_mid over two or more seeds' fits."""
  if len(fits) < 2:
    raise ValueError(
        f"the spread over seeds needs at least 2 runs; got {len(fits)}"
    )
  v = np.array([[f.a, f.b, f.c_mid] for f in fits])
  m, sd = v.mean(0), v.std(0, ddof=1)
  return Spread(
      a_mean=m[0],
      a_std=sd[0],
      b_mean=m[1],
      b_std=sd[1],
      c_mid_mean=m[2],
      c_mid_std=sd[2],
      num_runs=len(fits),
  )
