"""Tests of the bootstrap and of extrapolation from the first part of a run."""

import numpy as np
import pytest

from scalerl_jax.scaling import sigmoid
from scalerl_jax.scaling import uncertainty
from tests import scaling_helpers

SEEDS = (0, 1, 2)
TABLE1 = scaling_helpers.TABLE1


@pytest.fixture(scope="module")
def first_half_fits():
  """(true A, extrapolation, bootstrap) per Table 1 curve and seed,
  fitted on the first half."""
  out = []
  for i in range(len(TABLE1)):
    for seed in SEEDS:
      compute, score = scaling_helpers.table1_run(i, seed)
      ex = uncertainty.extrapolate(compute, score, 0.5)
      out.append(
          (
              TABLE1[i][3],
              ex,
              uncertainty.bootstrap(
                  compute, score, ex.fit, num_samples=100, seed=seed
              ),
          )
      )
  return out


def test_first_half_predicts_the_final_value(first_half_fits):
  for _, ex, _ in first_half_fits:
    assert abs(ex.final_error) <= 0.02, ex
    assert ex.held_out >= 50


def test_first_half_uncertainty_covers_true_a(first_half_fits):
  # A 95% interval misses now and then by design (over 100 seeds per curve it
  # covered A 92-94% of the time, its std 1.0-1.3x the true spread of A), so
  # require the rate, and that no miss is far outside.
  covered = [
      lo <= a <= hi for a, _, u in first_half_fits for lo, hi in [u.a_interval]
  ]
  assert np.mean(covered) >= 0.8, covered
  for a, ex, u in first_half_fits:
    assert abs(ex.fit.a - a) <= 4 * u.a_std, ex


def test_final_error_by_hand():
  # Exact points up to the split pin the curve (R_0 given), so the prediction
  # at the end is the true value
  # 0.3 + 0.31 / (1 + (2542 / 50840)^1.92) = 0.60879...
  # and a final measurement raised by 0.05 is missed by -0.05.
  compute = np.linspace(2542 / 5, 20 * 2542, 100)
  score = sigmoid.sigmoid(compute, 0.61, 1.92, 2542, 0.3)
  score[-1] += 0.05
  ex = uncertainty.extrapolate(compute, score, 0.5, r0=0.3)
  assert ex.split == pytest.approx(0.5 * 20 * 2542)
  assert ex.held_out == int((compute > ex.split).sum()) == 50
  assert ex.final_prediction == pytest.approx(
      0.3 + 0.31 / (1 + (1 / 20) ** 1.92), abs=1e-4
  )
  assert ex.final_error == pytest.approx(-0.05, abs=1e-4)
  assert ex.max_abs_error == pytest.approx(0.05, abs=1e-4)
  assert ex.mean_abs_error == pytest.approx(0.05 / 50, abs=1e-4)


def test_bootstrap_is_seeded_and_uses_the_fitted_points():
  compute, score = scaling_helpers.table1_run(3, 0)
  fit = sigmoid.fit(compute, score, min_compute=compute[10])
  u1 = uncertainty.bootstrap(compute, score, fit, num_samples=50, seed=7)
  assert u1 == uncertainty.bootstrap(
      compute, score, fit, num_samples=50, seed=7
  )
  assert u1.num_samples == 50 and 0 < u1.a_std < 0.01
  # The skipped points are not resampled: garbage there changes nothing.
  noisy = score.copy()
  noisy[:10] = 0.0
  assert (
      uncertainty.bootstrap(compute, noisy, fit, num_samples=50, seed=7) == u1
  )


def test_bootstrap_can_hold_a_at_the_fit():
  # As compare.compare bootstraps B at a shared A: A does not move, and B, no
  # longer traded against A, spreads less than when A is free.
  compute, score = scaling_helpers.table1_run(0, 0)
  fit = sigmoid.fit(compute, score)
  free = uncertainty.bootstrap(compute, score, fit, num_samples=50, seed=3)
  held = uncertainty.bootstrap(
      compute, score, fit, num_samples=50, seed=3, fix_a=True
  )
  assert held.a_std == 0 and held.a_interval == (fit.a, fit.a)
  assert 0 < held.b_std < free.b_std and free.a_std > 0


def test_extrapolate_needs_held_out_points():
  compute, score = scaling_helpers.table1_run(0, 0)
  with pytest.raises(ValueError, match="fit_fraction"):
    uncertainty.extrapolate(compute, score, 1.0)


def test_spread_warnings_flag_a_std_of_half_the_value_or_more():
  # MAX_RELATIVE_STD is 0.5: B's std 1.0 is exactly half of B = 2 (flagged),
  # C_mid's 49 is under half of 100, A's 0.1 a fifth of 0.5.
  assert uncertainty.MAX_RELATIVE_STD == 0.5
  fit = sigmoid.SigmoidFit(
      a=0.5,
      b=2.0,
      c_mid=100.0,
      r0=0.2,
      r0_source="given",
      rmse=0.01,
      num_points=10,
      compute_range=(10.0, 400.0),
  )
  unc = uncertainty.Uncertainty(
      a_std=0.1,
      b_std=1.0,
      c_mid_std=49.0,
      a_interval=(0.3, 0.7),
      num_samples=100,
  )
  (warning,) = uncertainty.spread_warnings(fit, unc)
  assert warning.startswith("B=2 has bootstrap std 1")
  wide = uncertainty.Uncertainty(0.25, 0.9, 60.0, (0.0, 1.0), 100)
  assert [w.split("=")[0] for w in uncertainty.spread_warnings(fit, wide)] == [
      "A",
      "C_mid",
  ]


def test_a_singular_resample_takes_the_least_norm_step():
  # Row 1 is exactly singular: numpy's batched solve refuses the whole batch.
  mat = np.array([[[2.0, 0.0], [0.0, 4.0]], [[1.0, 1.0], [1.0, 1.0]]])
  rhs = np.array([[2.0, 2.0], [2.0, 2.0]])
  with pytest.raises(np.linalg.LinAlgError):
    np.linalg.solve(mat, rhs[..., None])
  steps = uncertainty._solve_each(mat, rhs)
  # Row 0 solved exactly; row 1's least-norm solution of x + y = 2 is (1, 1).
  np.testing.assert_allclose(steps, [[1.0, 0.5], [1.0, 1.0]], atol=1e-12)


def test_bootstrap_of_four_points_survives_degenerate_resamples():
  # Of 200 resamples of 4 points about 3 land on a single compute, and about
  # 80 on two, fewer than the 3 free parameters (R_0 is measured).
  compute = np.array([0.0, 100.0, 200.0, 300.0, 400.0])
  score = sigmoid.sigmoid(compute, 0.6, 1.5, 150.0, 0.2)
  fit = sigmoid.fit(compute, score)
  assert fit.num_points == 4 and fit.r0_source != "fitted"
  u = uncertainty.bootstrap(compute, score, fit, num_samples=200, seed=0)
  assert np.isfinite([u.a_std, u.b_std, u.c_mid_std]).all()
