"""Paired verdicts: two points of a grid compared seed by seed.

Points run with the same seed share that seed's warm-started base and data
order, so their difference d_s = v_first(s) - v_second(s) cancels the luck of
the base, which dominates the spread between seeds (docs/ablations.md). The
verdict rests on the mean of d over n seeds and its standard error
sigma = sd(d) / sqrt(n): the first is higher when mean(d) > z sigma (and at
least `floor`), lower when mean(d) < -z sigma, otherwise inconclusive. For an
effect `delta` to clear z sigma, n >= (z sd(d) / delta)^2 seeds are needed.

A grid's claims (`GridClaim`: the paper's relation between two points in A
or B, `compare.Claim`) are checked on such differences with a statistic of
the validation curve standing in for each parameter (`STATISTICS`): the end
point for A, the mean after step 0 (how soon the curve rises, at equal
compute) for B. A claim of "same" agrees when the whole z-sigma interval
lies within the paper's noise, compare.A_NOISE. Design: docs/search_task.md,
docs/ablations.md.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Mapping, Optional, Sequence

import numpy as np

from scalerl_jax.scaling import compare
from scalerl_jax.scaling import curves
from scalerl_jax.scaling import runs as runs_lib
from scalerl_jax.scaling import seeds
from scalerl_jax.scaling import uncertainty

# What stands for each fitted parameter when points are compared seed by seed
# on their validation curves at equal compute.
STATISTICS = {
    "A": "end point: the mean of the last validations",
    "B": "speed: the mean of the validations after step 0",
    # For runs long enough that each one's sigmoid pins its C_mid.
    "A_fit": "fitted A: the asymptote of each run's own sigmoid fit",
}


# How `mechanism_size` summarises a run's logged mechanism.
MECHANISM_SUMMARIES = ("mean", "last", "first")


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


def speed_score(run: runs_lib.Run) -> float:
  """Mean of a run's validation scores after its first (step 0): how soon
  the curve rises, B's stand-in at equal compute."""
  if len(run.score) < 2:
    raise ValueError(
        f"{run.workdir}: {len(run.score)} validation scores; the mean after "
        "the first needs two or more"
    )
  return float(np.mean(run.score[1:]))


def fitted_a(run: runs_lib.Run) -> float:
  """A of the run's own sigmoid, fitted by the paper's procedure
  (`curves.fit_curve`). ValueError when it cannot be fitted or the fit is
  not reliable: it warns, or its bootstrap spread leaves A, B or C_mid
  unpinned (as launch.fit marks it)."""
  curve = curves.fit_curve(
      run.steps, run.compute, run.score, num_bootstrap=uncertainty.NUM_BOOTSTRAP
  )
  if curve.fit is None:
    raise ValueError(f"{run.workdir}: no sigmoid fit: {curve.error}")
  if not curve.fit.reliable:
    raise ValueError(
        f"{run.workdir}: its fitted A is not pinned: "
        + "; ".join(curve.fit.warnings)
    )
  return float(curve.fit.a)


def score(run: runs_lib.Run, param: str = "A", last: int = 1) -> float:
  """The statistic standing for `param` (`STATISTICS`) on one run."""
  if param == "A":
    return final_score(run, last)
  if param == "B":
    return speed_score(run)
  if param == "A_fit":
    return fitted_a(run)
  raise ValueError(
      f"paired statistics exist for {list(STATISTICS)}, not {param!r}"
  )


def by_seed(
    runs: Sequence[runs_lib.Run], point: str, last: int = 1, param: str = "A"
) -> dict[int, float]:
  """seed -> `score` of the runs of `point` (named `seed=N/point`)."""
  out = {}
  for run in runs:
    name, seed = seeds.split_seed(run.name)
    if name == point and seed is not None:
      if seed in out:
        raise ValueError(f"point {point!r} has two runs with seed {seed}")
      out[seed] = score(run, param, last)
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


@dataclasses.dataclass(frozen=True)
class GridClaim:
  """A claim of the paper on two points of a grid, with what to measure."""

  claim: compare.Claim
  paper: str  # The paper's numbers or words (PAPER.md).
  # (logged key, how `mechanism_size` summarises it: MECHANISM_SUMMARIES):
  # the quantity through which the paper says the choice acts.
  mechanism: tuple[tuple[str, str], ...] = ()


def claim_verdict(p: Paired, claim: compare.Claim, z: float = 2.0) -> str:
  """'agrees', 'disagrees' or 'inconclusive': `p` (first - second) against
  `claim` at z sigma. "same" agrees when mean ± z sigma lies within
  ±compare.A_NOISE and disagrees when it lies wholly outside."""
  if claim.relation == "higher":
    found = {"higher": "agrees", "lower": "disagrees"}
    return found.get(verdict(p, z), "inconclusive")
  lo, hi = p.mean - z * p.sigma, p.mean + z * p.sigma
  if -compare.A_NOISE <= lo and hi <= compare.A_NOISE:
    return "agrees"
  if lo > compare.A_NOISE or hi < -compare.A_NOISE:
    return "disagrees"
  return "inconclusive"


def mechanism_size(
    workdir: str, key: str, how: str = "mean"
) -> Optional[float]:
  """A run's `key`: its mean over the logged steps (`how` "mean"), its last
  value, or its first (before any update has reached the sampler: the
  sampler-trainer mismatch of precision alone); None when the run never
  logged it."""
  if how not in MECHANISM_SUMMARIES:
    raise ValueError(f"how is one of {MECHANISM_SUMMARIES}, not {how!r}")
  run = runs_lib.read_run(workdir, x_key="step", y_key=key)
  if not len(run.score):
    return None
  if how == "mean":
    return float(np.mean(run.score))
  return float(run.score[0 if how == "first" else -1])
