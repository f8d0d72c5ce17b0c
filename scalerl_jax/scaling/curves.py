"""Runs and seed groups -> fitted curves, by the paper's procedure (§1).

Every curve, a run's or a seed group's mean, is fitted alike: R_0 is the
score at step 0 (measured), fitted only where a curve has no step 0 (train
metrics); the first `skip_fraction` of the final compute is left out; with
`fit_fraction` < 1 the rest is predicted. A bootstrap spread of at least
`uncertainty.MAX_RELATIVE_STD` of a parameter makes the fit unreliable.

Shape letters: the package key (scalerl_jax/__init__.py), and J evaluations
of a curve. Design: docs/design/scaling.md.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import numpy as np

from scalerl_jax.scaling import runs as runs_lib
from scalerl_jax.scaling import seeds
from scalerl_jax.scaling import sigmoid
from scalerl_jax.scaling import uncertainty

# 1.5k of the paper's 50k GPU-hour runs (docs/design/scaling.md).
SKIP_FRACTION = 0.03


@dataclasses.dataclass(frozen=True)
class CurveFit:
  """A curve (step 0 included, if logged) with its fit, or why it has none."""

  steps: np.ndarray  # [J]
  compute: np.ndarray  # [J]
  score: np.ndarray  # [J]
  skip_until: float  # Points after step 0 with less compute were left out.
  fit: Optional[sigmoid.SigmoidFit] = None
  uncertainty: Optional[uncertainty.Uncertainty] = None
  # Set when fitted on a share of the curve.
  extrapolation: Optional[uncertainty.Extrapolation] = None
  error: str = ""

  def roles(self) -> dict[str, np.ndarray]:
    """Boolean masks over the points: "r0", "skipped", "fitted", "held_out".

    Without a fit every point after step 0 counts as skipped.
    """
    r0 = self.steps == 0
    if self.fit is None:
      nothing = np.zeros_like(r0)
      return {"r0": r0, "skipped": ~r0, "fitted": nothing, "held_out": nothing}
    lo, hi = self.fit.compute_range
    return {
        "r0": r0,
        "skipped": ~r0 & (self.compute < lo),
        "fitted": ~r0 & self.fit.fitted(self.compute),
        "held_out": ~r0 & (self.compute > hi),
    }


@dataclasses.dataclass(frozen=True)
class GroupFit:
  """One configuration: its runs (one per seed), their fits, its mean's fit."""

  name: str
  runs: tuple[runs_lib.Run, ...]
  fits: tuple[CurveFit, ...]  # One per run.
  mean: Optional[seeds.MeanCurve] = None  # With two or more runs.
  mean_fit: Optional[CurveFit] = None  # The mean curve's fit.
  # Over the per-seed fits, when two or more succeeded.
  spread: Optional[seeds.Spread] = None


def fit_curve(
    steps: Sequence[int],
    compute: Sequence[float],
    score: Sequence[float],
    *,
    skip_fraction: float = SKIP_FRACTION,
    fit_fraction: float = 1.0,
    num_bootstrap: int = 0,
    seed: int = 0,
) -> CurveFit:
  """Fits one curve (`steps` increasing) by the paper's procedure.

  R_0 is the score at step 0, or fitted where `steps` has no 0.
  `num_bootstrap` > 0 adds the bootstrap uncertainty, and its spread's
  warnings (`uncertainty.spread_warnings`) to the fit. A curve that cannot be
  fitted has the reason in `error`. ValueError unless 0 <= skip_fraction <
  fit_fraction <= 1.
  """
  if not 0 <= skip_fraction < fit_fraction <= 1:
    raise ValueError(
        f"need 0 <= skip_fraction < fit_fraction <= 1; got {skip_fraction} and "
        f"{fit_fraction}"
    )
  steps = np.asarray(steps, dtype=int)
  compute, score = np.asarray(compute, dtype=float), np.asarray(
      score, dtype=float
  )
  rl = steps > 0
  skip_until = skip_fraction * float(compute[rl][-1]) if rl.any() else 0.0
  curve = CurveFit(steps, compute, score, skip_until)
  # A train metric (train/reward_mean) has no step 0: a step's line scores
  # the batch it trained on, and step 0 trains nothing. Its R_0 is fitted,
  # pinned by all the early points, rather than taken from step 1: that is one
  # batch's sampling noise at a compute above 0, and under PipelineRL the
  # next k batches come from the same early policies too.
  r0 = float(score[steps == 0][0]) if (steps == 0).any() else None
  kwargs = dict(min_compute=skip_until, r0=r0)
  try:
    if fit_fraction < 1:
      ex = uncertainty.extrapolate(
          compute[rl], score[rl], fit_fraction, **kwargs
      )
      fit = ex.fit
    else:
      ex, fit = None, sigmoid.fit(compute[rl], score[rl], **kwargs)
  except ValueError as e:
    return dataclasses.replace(curve, error=str(e))
  if num_bootstrap <= 0:
    return dataclasses.replace(curve, fit=fit, extrapolation=ex)
  unc = uncertainty.bootstrap(
      compute[rl], score[rl], fit, num_samples=num_bootstrap, seed=seed
  )
  fit = dataclasses.replace(
      fit, warnings=fit.warnings + uncertainty.spread_warnings(fit, unc)
  )
  if ex is not None:
    ex = dataclasses.replace(ex, fit=fit)
  return dataclasses.replace(curve, fit=fit, uncertainty=unc, extrapolation=ex)


def fit_groups(runs: Sequence[runs_lib.Run], **fit_kwargs) -> list[GroupFit]:
  """Fits every run and seed group's mean, one GroupFit per configuration.

  Groups come from `seeds.group_runs`, in order of first appearance;
  `fit_kwargs` go to every `fit_curve`.
  """
  out = []
  for name, members in seeds.group_runs(runs):
    fits = tuple(
        fit_curve(r.steps, r.compute, r.score, **fit_kwargs) for r in members
    )
    group = GroupFit(name, tuple(members), fits)
    if len(members) > 1:
      mean = seeds.mean_curve(members)
      fitted = [f.fit for f in fits if f.fit is not None]
      group = dataclasses.replace(
          group,
          mean=mean,
          mean_fit=fit_curve(
              mean.steps, mean.compute, mean.score, **fit_kwargs
          ),
          spread=seeds.spread(fitted) if len(fitted) > 1 else None,
      )
    out.append(group)
  return out
