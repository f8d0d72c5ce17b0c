"""Paired verdicts: two points of a grid compared seed by seed.

Points run with the same seed share that seed's warm-started base and data
order, so their difference d_s = v_first(s) - v_second(s) cancels the luck of
the base, which dominates the spread between seeds (docs/ablations.md). The
verdict rests on the mean of d over n seeds and its standard error
sigma = sd(d) / sqrt(n): the first is higher when mean(d) > z sigma (and at
least `floor`), lower when mean(d) < -z sigma, otherwise inconclusive. For an
effect `delta` to clear z sigma, n >= (z sd(d) / delta)^2 seeds are needed.
Design: docs/search_task.md.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Mapping, Sequence

import numpy as np

from scalerl_jax.scaling import runs as runs_lib
from scalerl_jax.scaling import seeds


@dataclasses.dataclass(frozen=True)
class Paired:
  """The seed-by-seed differences of two points and their summary."""

  seeds: tuple[int, ...]  # Seeds both points ran with, ascending.
  first: tuple[float, ...]  # The first point's value per seed.
  second: tuple[float, ...]  # The second point's value per seed.
  differences: tuple[float, ...]  # first - second, per seed.
  mean: float  # Mean difference.
  sd: float  # Sample std of the differences (ddof 1).
  sigma: float  # Standard error of the mean, sd / sqrt(n).


def final_score(run: runs_lib.Run, last: int = 1) -> float:
  """Mean of a run's last `last` validation scores (its end point)."""
  if last < 1 or len(run.score) < last:
    raise ValueError(
        f"{run.workdir}: {len(run.score)} validation scores, cannot average the "
        f"last {last}"
    )
  return float(np.mean(run.score[-last:]))


def by_seed(
    runs: Sequence[runs_lib.Run], point: str, last: int = 1
) -> dict[int, float]:
  """seed -> final score of the runs of `point` (named `seed=N/point`)."""
  out = {}
  for run in runs:
    name, seed = seeds.split_seed(run.name)
    if name == point and seed is not None:
      if seed in out:
        raise ValueError(f"point {point!r} has two runs with seed {seed}")
      out[seed] = final_score(run, last)
  return out


def paired(first: Mapping[int, float], second: Mapping[int, float]) -> Paired:
  """The differences over the seeds both points have; at least two."""
  shared = sorted(set(first) & set(second))
  if len(shared) < 2:
    raise ValueError(
        f"a paired comparison needs two or more shared seeds; got {shared}"
    )
  v1 = np.array([first[s] for s in shared], float)
  v2 = np.array([second[s] for s in shared], float)
  d = v1 - v2
  sd = float(np.std(d, ddof=1))
  return Paired(
      seeds=tuple(shared),
      first=tuple(v1.tolist()),
      second=tuple(v2.tolist()),
      differences=tuple(d.tolist()),
      mean=float(d.mean()),
      sd=sd,
      sigma=sd / math.sqrt(len(shared)),
  )


def verdict(p: Paired, z: float = 2.0, floor: float = 0.0) -> str:
  """'higher', 'lower' (the first against the second) or 'inconclusive'."""
  if abs(p.mean) <= z * p.sigma or abs(p.mean) < floor:
    return "inconclusive"
  return "higher" if p.mean > 0 else "lower"


def seeds_needed(sd: float, effect: float, z: float = 2.0) -> int:
  """Seeds for a mean paired difference of `effect` to clear z sigma.

  `sd` is the std of one seed's paired difference; at least 2 (one
  difference has no spread to measure).
  """
  if effect <= 0 or sd < 0:
    raise ValueError(f"need effect > 0 and sd >= 0; got {effect}, {sd}")
  return max(2, math.ceil((z * sd / effect) ** 2))
