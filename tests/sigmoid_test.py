"""Tests of the compute-performance curve fitter on synthetic runs
(`scaling_helpers`)."""

import numpy as np
import pytest

from scalerl_jax.scaling import sigmoid
from tests import scaling_helpers

SEEDS = (0, 1, 2)
TABLE1 = scaling_helpers.TABLE1


@pytest.mark.parametrize(
    "index", range(len(TABLE1)), ids=[t[0] for t in TABLE1]
)
def test_whole_run_recovers_a_and_b(index):
  _, c_mid, b, a = TABLE1[index]
  for seed in SEEDS:
    fit = sigmoid.fit(*scaling_helpers.table1_run(index, seed))
    assert abs(fit.a - a) <= 0.01, (seed, fit)
    assert abs(fit.b / b - 1) <= 0.10, (seed, fit)
    assert fit.reliable, fit.warnings
    assert fit.r0_source == "fitted"


def test_sigmoid_values_by_hand():
  # At C_mid half the gain is reached: 0.3 + (0.7 - 0.3) / 2 = 0.5;
  # at C = 0 it is R_0; at C = 2 C_mid with B = 1:
  # 0.3 + 0.4 / (1 + 1/2) = 0.56666...
  np.testing.assert_allclose(
      sigmoid.sigmoid([0.0, 10.0, 20.0], 0.7, 1.0, 10.0, 0.3),
      [0.3, 0.5, 0.3 + 0.4 / 1.5],
  )


def test_compute_unit_only_rescales_c_mid():
  compute, score = scaling_helpers.table1_run(0, 0)
  in_hours = sigmoid.fit(compute, score)
  in_flops = sigmoid.fit(compute * 3.6e18, score)
  assert in_flops.a == pytest.approx(in_hours.a, abs=1e-4)
  assert in_flops.b == pytest.approx(in_hours.b, rel=1e-3)
  assert in_flops.c_mid == pytest.approx(in_hours.c_mid * 3.6e18, rel=1e-3)


def test_paper_grids_and_threshold():
  compute, score = scaling_helpers.table1_run(0, 1)
  fit = sigmoid.fit(
      compute,
      score,
      min_compute=1500,
      a_grid=np.arange(0.45, 0.8001, 0.005),
      c_mid_grid=np.linspace(100, 40000, 100),
  )
  assert fit.num_points == int((compute >= 1500).sum())
  assert fit.compute_range[0] >= 1500
  assert abs(fit.a - 0.610) <= 0.01 and abs(fit.b / 1.92 - 1) <= 0.1


def test_default_grids_follow_small_runs():
  # A CPU-scale run: pass rates 0.02 -> 0.08 over a device-hour,
  # C_mid 3 minutes; the paper's grid (A >= 0.45, C_mid >= 100 GPU-hours)
  # holds none of this.
  compute = np.linspace(0.01, 1.0, 40)
  score = sigmoid.sigmoid(compute, 0.08, 1.5, 0.05, 0.02)
  score = score + np.random.default_rng(0).normal(0.0, 0.002, compute.size)
  fit = sigmoid.fit(compute, score, r0=0.02)
  assert abs(fit.a - 0.08) <= 0.005 and abs(fit.c_mid / 0.05 - 1) <= 0.15, fit
  assert fit.reliable, fit.warnings
  a, c_mid, _ = sigmoid.grids([compute])
  assert (a[0], a[-1], a.size) == (0.0, 1.0, 201)
  np.testing.assert_allclose([c_mid[0], c_mid[-1]], [0.001, 10.0])


def test_fitted_marks_the_points_used():
  compute, score = scaling_helpers.table1_run(0, 0)
  fit = sigmoid.fit(
      np.r_[0.0, compute], np.r_[0.3, score], min_compute=compute[3]
  )
  used = fit.fitted(np.r_[0.0, compute])
  # Compute 0 and the first three points.
  assert not used[:4].any() and used[4:].all()


def test_r0_measured_at_compute_zero_or_given():
  compute, score = scaling_helpers.table1_run(0, 0)
  with_zero = sigmoid.fit(np.r_[0.0, compute], np.r_[0.31, score])
  assert with_zero.r0_source == "measured" and with_zero.r0 == 0.31
  given = sigmoid.fit(compute, score, r0=0.3)
  assert given.r0_source == "given" and given.r0 == 0.3
  assert abs(given.a - 0.610) <= 0.01


@pytest.mark.parametrize(
    "compute, score, match",
    [
        ([1.0, 2.0, 3.0], [0.1, 0.2, 0.3], "at least 4 points"),
        ([1.0, 2.0, 3.0, 4.0, 5.0], [0.1, 0.2, np.nan, 0.3, 0.3], "non-finite"),
        ([1.0, 2.0, np.inf, 4.0, 5.0], [0.1, 0.2, 0.2, 0.3, 0.3], "non-finite"),
        (
            [1.0, 3.0, 2.0, 4.0, 5.0],
            [0.1, 0.2, 0.2, 0.3, 0.3],
            "strictly increasing",
        ),
        (
            [1.0, 2.0, 2.0, 4.0, 5.0],
            [0.1, 0.2, 0.2, 0.3, 0.3],
            "strictly increasing",
        ),
        ([-1.0, 2.0, 3.0, 4.0, 5.0], [0.1, 0.2, 0.2, 0.3, 0.3], ">= 0"),
        ([1.0, 2.0, 3.0, 4.0, 5.0], [0.1, 0.2, 1.2, 0.3, 0.3], r"\[0, 1\]"),
        ([1.0, 2.0, 3.0, 4.0], [0.1, 0.2, 0.3], "equal length"),
    ],
)
def test_unusable_input_raises(compute, score, match):
  with pytest.raises(ValueError, match=match):
    sigmoid.fit(compute, score)


def test_threshold_leaving_too_few_points_raises():
  compute, score = scaling_helpers.table1_run(0, 0)
  with pytest.raises(ValueError, match="at least 4 points"):
    sigmoid.fit(compute, score, min_compute=compute[-3])


def test_flat_curve_is_flagged():
  compute = np.linspace(1, 100, 50)
  score = 0.4 + np.random.default_rng(0).normal(0, scaling_helpers.NOISE, 50)
  fit = sigmoid.fit(compute, score)
  assert not fit.reliable
  assert any("flat" in w for w in fit.warnings), fit.warnings


def test_decreasing_curve_is_flagged():
  compute = np.linspace(1, 100, 50)
  score = sigmoid.sigmoid(compute, 0.2, 1.5, 20, 0.6)
  score = score + np.random.default_rng(0).normal(0, scaling_helpers.NOISE, 50)
  fit = sigmoid.fit(compute, score)
  assert not fit.reliable
  assert any("decreases" in w for w in fit.warnings), fit.warnings


def test_run_stopped_before_c_mid_is_flagged():
  # C_mid = 500: the run saw a sixth of the gain.
  compute = np.linspace(1, 100, 50)
  fit = sigmoid.fit(compute, sigmoid.sigmoid(compute, 0.6, 1.5, 500, 0.3))
  assert any("beyond the last point" in w for w in fit.warnings), fit.warnings


def test_ceiling_outside_the_grid_is_flagged():
  compute, score = scaling_helpers.table1_run(2, 0)  # A = 0.71.
  fit = sigmoid.fit(compute, score, a_grid=np.arange(0.45, 0.65, 0.005))
  assert fit.a == pytest.approx(0.645)
  assert any(
      w.startswith("A=") and "edge of its grid" in w for w in fit.warnings
  ), fit.warnings


def test_bad_grid_raises():
  compute, score = scaling_helpers.table1_run(0, 0)
  with pytest.raises(ValueError, match="a_grid"):
    sigmoid.fit(compute, score, a_grid=[0.6, 0.5])
