"""Tests a statistician would sign: paired t, Holm, equivalence, power.

A claim compares two points on paired replicates (the same warm-started
base and RL seed), so its evidence is the n differences d_i = first_i -
second_i. Everything here is exact for normally distributed differences:

- `paired_t`: the two-sided Student's t test of mean(d) = 0 with n - 1
  degrees of freedom, and the (1 - alpha) confidence interval of mean(d).
- `tost`: two one-sided tests of |mean(d)| < margin (equivalence); its p is
  the larger of the two one-sided p-values.
- `holm`: Holm's step-down adjustment of a family's p-values (strong control
  of the family-wise error rate).
- `power` / `replicates_for_power`: the probability that the paired t test
  (or TOST) at level alpha decides, for a true difference and sd, from the
  noncentral t distribution.
- `variance_components`: the one-way random-effects split of a statistic's
  variance into between-base and within-base (seed) parts.

Pure numpy / scipy. Design: docs/design/scaling.md.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Mapping, Sequence

import numpy as np
from scipy import stats


@dataclasses.dataclass(frozen=True)
class PairedTest:
  """A paired two-sided t test on differences."""

  n: int  # Replicates (differences).
  mean: float  # Mean difference.
  sd: float  # Sample std of the differences (ddof 1).
  ci: tuple[float, float]  # The (1 - alpha) confidence interval of mean.
  p: float  # Two-sided p-value of mean = 0.
  df: int  # Degrees of freedom, n - 1.


def _check(d: Sequence[float]) -> np.ndarray:
  d = np.asarray(d, float)
  if d.ndim != 1 or len(d) < 2 or not np.all(np.isfinite(d)):
    raise ValueError(
        f"a paired test needs two or more finite differences; got {d.tolist()}"
    )
  return d


def paired_t(d: Sequence[float], alpha: float = 0.05) -> PairedTest:
  """Student's t on the differences `d` (two-sided), with its CI."""
  d = _check(d)
  n, mean, sd = len(d), float(d.mean()), float(d.std(ddof=1))
  se = sd / math.sqrt(n)
  half = float(stats.t.ppf(1 - alpha / 2, n - 1)) * se
  if se == 0:
    p = 1.0 if mean == 0 else 0.0
  else:
    p = float(2 * stats.t.sf(abs(mean) / se, n - 1))
  return PairedTest(n, mean, sd, (mean - half, mean + half), p, n - 1)


def tost(d: Sequence[float], margin: float) -> float:
  """p-value of two one-sided t tests that -margin < mean(d) < margin."""
  if margin <= 0:
    raise ValueError(f"an equivalence margin must be > 0, got {margin}")
  d = _check(d)
  n, mean = len(d), float(d.mean())
  se = float(d.std(ddof=1)) / math.sqrt(n)
  if se == 0:
    return 0.0 if abs(mean) < margin else 1.0
  p_low = stats.t.sf((mean + margin) / se, n - 1)  # H0: mean <= -margin.
  p_high = stats.t.cdf((mean - margin) / se, n - 1)  # H0: mean >= margin.
  return float(max(p_low, p_high))


def holm(p: Mapping[str, float]) -> dict[str, float]:
  """Holm-adjusted p-values of a family {name: p}: the i-th smallest times
  (m - i), made monotone, capped at 1. Rejecting where the adjusted p <
  alpha controls the family-wise error rate at alpha."""
  order = sorted(p, key=lambda k: p[k])
  m, running, out = len(order), 0.0, {}
  for i, name in enumerate(order):
    running = max(running, min(1.0, (m - i) * p[name]))
    out[name] = running
  return out


def power(
    effect: float,
    sd: float,
    n: int,
    alpha: float = 0.05,
    equivalence_margin: float = 0.0,
) -> float:
  """Power of the two-sided paired t test (or, with `equivalence_margin` >
  0, a lower bound on TOST's) at level `alpha` with `n` replicates, when the
  true mean difference is `effect` and the differences' sd is `sd`."""
  if n < 2 or sd <= 0:
    raise ValueError(f"power needs n >= 2 and sd > 0; got {n}, {sd}")
  df, se = n - 1, sd / math.sqrt(n)
  if equivalence_margin > 0:
    # Both one-sided tests at alpha reject: t_low > t_c and t_high < -t_c.
    t_c = stats.t.ppf(1 - alpha, df)
    low = (effect + equivalence_margin) / se
    high = (effect - equivalence_margin) / se
    if low - high <= 2 * t_c:
      return 0.0
    # Both sides share one sample's mean and sd; P(both) >= P(low) +
    # P(high) - 1 (Bonferroni), so this is a lower bound on TOST's power.
    return float(
        max(
            0.0,
            stats.nct.sf(t_c, df, low) + stats.nct.cdf(-t_c, df, high) - 1.0,
        )
    )
  t_c = stats.t.ppf(1 - alpha / 2, df)
  nc = effect / se
  return float(stats.nct.sf(t_c, df, nc) + stats.nct.cdf(-t_c, df, nc))


def replicates_for_power(
    effect: float,
    sd: float,
    target: float = 0.8,
    alpha: float = 0.05,
    equivalence_margin: float = 0.0,
    most: int = 1000,
) -> int:
  """The fewest replicates (>= 2) with `power` >= `target`; `most` + 1 when
  even `most` do not reach it."""
  for n in range(2, most + 1):
    if power(effect, sd, n, alpha, equivalence_margin) >= target:
      return n
  return most + 1


@dataclasses.dataclass(frozen=True)
class Components:
  """Variances of a statistic: between bases, between seeds of a base, and
  of one validation (measured, from the evaluation's standard error)."""

  base: float
  seed: float
  validation: float
  num_bases: int
  seeds_per_base: float


def variance_components(
    values: Mapping[int, Sequence[float]], validation_var: float = 0.0
) -> Components:
  """One-way random effects: `values` maps a base to its seeds' values.

  Between-base variance = (MS_between - MS_within) / n0, floored at 0;
  within-base (seed) variance = MS_within; n0 the ANOVA's effective seeds per
  base. ValueError unless two or more bases each have two or more seeds.
  """
  groups = [np.asarray(v, float) for v in values.values()]
  if len(groups) < 2 or any(len(g) < 2 for g in groups):
    raise ValueError(
        "variance components need two or more bases with two or more seeds "
        f"each; got {[len(g) for g in groups]}"
    )
  sizes = np.array([len(g) for g in groups], float)
  big_n, k = sizes.sum(), len(groups)
  grand = np.concatenate(groups).mean()
  ss_between = sum(len(g) * (g.mean() - grand) ** 2 for g in groups)
  ss_within = sum(((g - g.mean()) ** 2).sum() for g in groups)
  ms_between = ss_between / (k - 1)
  ms_within = ss_within / (big_n - k)
  n0 = (big_n - (sizes**2).sum() / big_n) / (k - 1)
  return Components(
      base=float(max(0.0, (ms_between - ms_within) / n0)),
      seed=float(ms_within),
      validation=float(validation_var),
      num_bases=k,
      seeds_per_base=float(n0),
  )
