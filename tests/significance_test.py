"""Tests of scaling/significance.py: against scipy's own tests, numbers worked
by hand, and simulation."""

import math

import numpy as np
import pytest
from scipy import stats

from scalerl_jax.scaling import significance

D = [0.013, 0.020, 0.010]  # The long runs' CISPO - DAPO end points.


def test_paired_t_matches_scipy_and_hand():
  t = significance.paired_t(D)
  ref = stats.ttest_1samp(D, 0.0)
  assert t.p == pytest.approx(ref.pvalue, rel=1e-12)
  # mean 0.014333, sd 0.0051316, se 0.0029627; t_0.975,2 = 4.302653.
  assert t.mean == pytest.approx(0.0143333, abs=1e-7)
  assert t.sd == pytest.approx(0.0051316, abs=1e-7)
  half = 4.302653 * 0.0029627
  assert t.ci == pytest.approx((0.0143333 - half, 0.0143333 + half), abs=1e-6)
  assert t.df == 2 and t.n == 3
  # The interval excludes 0 exactly when p < 0.05.
  assert (t.ci[0] > 0) == (t.p < 0.05)


def test_paired_t_refuses_one_difference_and_nan():
  with pytest.raises(ValueError, match="two or more finite"):
    significance.paired_t([0.1])
  with pytest.raises(ValueError, match="two or more finite"):
    significance.paired_t([0.1, float("nan")])


def test_tost_by_hand():
  # mean 0.005, sd 0.01 over 4: se 0.005; t_low = (0.005 + 0.02) / 0.005 = 5,
  # t_high = (0.005 - 0.02) / 0.005 = -3; p = max(sf(5), cdf(-3)) at df 3.
  d = [0.005 - 0.01 * x for x in (-1.161895, -0.387298, 0.387298, 1.161895)]
  assert np.std(d, ddof=1) == pytest.approx(0.01, rel=1e-5)
  p = significance.tost(d, 0.02)
  assert p == pytest.approx(stats.t.cdf(-3, 3), rel=1e-4)
  assert p > stats.t.sf(5, 3)
  # A mean outside the margin is never equivalent.
  assert significance.tost([0.03, 0.031, 0.029], 0.02) > 0.5


def test_holm_by_hand():
  # Sorted 0.01, 0.02, 0.04 over 3: 0.03, 0.04, max(0.04, 0.04) = 0.04.
  adj = significance.holm({"a": 0.04, "b": 0.01, "c": 0.02})
  assert adj == pytest.approx({"b": 0.03, "c": 0.04, "a": 0.04})
  # Monotone: a larger raw p never gets a smaller adjusted one; capped at 1.
  adj = significance.holm({"a": 0.011, "b": 0.01, "c": 0.9})
  assert adj == pytest.approx({"b": 0.03, "a": 0.03, "c": 0.9})
  assert significance.holm({"a": 0.6, "b": 0.5}) == pytest.approx(
      {"b": 1.0, "a": 1.0}
  )


def test_power_matches_simulation():
  rng = np.random.default_rng(0)
  effect, sd, n, trials = 0.02, 0.02, 6, 20_000
  d = rng.normal(effect, sd, size=(trials, n))
  p = stats.ttest_1samp(d, 0.0, axis=1).pvalue
  simulated = float(np.mean(p < 0.05))
  assert significance.power(effect, sd, n) == pytest.approx(simulated, abs=0.01)
  # Under the null, the power is the level.
  assert significance.power(0.0, sd, n) == pytest.approx(0.05, abs=1e-9)


def test_tost_power_is_a_lower_bound_near_simulation():
  rng = np.random.default_rng(1)
  sd, n, margin, trials = 0.01, 8, 0.02, 20_000
  d = rng.normal(0.0, sd, size=(trials, n))
  p = np.array([significance.tost(row, margin) for row in d[:4000]])
  simulated = float(np.mean(p < 0.05))
  bound = significance.power(0.0, sd, n, equivalence_margin=margin)
  assert bound <= simulated + 0.02
  assert bound >= simulated - 0.05


def test_replicates_for_power():
  n = significance.replicates_for_power(0.02, 0.02)
  assert significance.power(0.02, 0.02, n) >= 0.8
  assert significance.power(0.02, 0.02, n - 1) < 0.8
  # The normal approximation (z_0.975 + z_0.8)^2 (sd / effect)^2 = 7.85 is
  # below the t test's need at small n.
  assert n >= math.ceil(7.85)
  assert significance.replicates_for_power(0.001, 1.0, most=50) == 51


def test_variance_components_by_hand():
  # Bases 0.80 +- 0.01 and 0.86 +- 0.01 (two seeds each): MS_within = 4e-4 / 2,
  # MS_between = 2 * 2 * 0.03^2 = 3.6e-3, n0 = 2: base = (3.6e-3 - 1e-4) / 2.
  c = significance.variance_components(
      {0: [0.79, 0.81], 1: [0.85, 0.87]}, validation_var=3e-5
  )
  assert c.seed == pytest.approx(2e-4)
  assert c.base == pytest.approx((3.6e-3 - 2e-4) / 2)
  assert c.validation == 3e-5 and c.num_bases == 2 and c.seeds_per_base == 2
  with pytest.raises(ValueError, match="two or more bases"):
    significance.variance_components({0: [0.8, 0.81]})
