"""Tests of fitting runs and seed groups by the paper's procedure,
on synthetic workdirs.

Every run below validates at steps 0, 5, ..., 200 and spends 36 device-seconds
a step unless said otherwise, so step s sits at s / 100 device-hours and the
run ends at 2 device-hours. Its scores follow a sigmoid in steps (A = 0.6,
B = 1.9, C_mid at step 20, R_0 = 0.2) plus noise of sd 0.005.
"""

import numpy as np
import pytest

from scalerl_jax.scaling import curves
from scalerl_jax.scaling import runs
from scalerl_jax.scaling import sigmoid
from scalerl_jax.scaling import uncertainty
from tests import scaling_helpers

CURVE = dict(a=0.6, b=1.9, c_mid_step=20)


def _read(tmp_path, name="run", seed=0, **kwargs):
  workdir = str(tmp_path / name)
  scores = scaling_helpers.write_workdir(
      workdir, seed=seed, **{**CURVE, **kwargs}
  )
  return runs.read_run(workdir, "compute/device_hours", name=name), scores


def _steps(curve, role):
  return curve.steps[curve.roles()[role]].tolist()


def test_default_skip_leaves_out_the_first_three_percent(tmp_path):
  # 3% of 2 hours is 0.06 hours: step 5 (0.05 h) goes, step 10 (0.1 h) stays.
  run, _ = _read(tmp_path)
  curve = curves.fit_curve(run.steps, run.compute, run.score)
  assert curve.skip_until == pytest.approx(0.06)
  assert _steps(curve, "skipped") == [5]
  assert _steps(curve, "fitted") == list(range(10, 201, 5))
  assert _steps(curve, "held_out") == []
  assert (
      curve.fit.num_points == 39
      and curve.fit.compute_range == pytest.approx((0.1, 2.0))
  )


def test_skip_fraction_sets_the_prefix(tmp_path):
  # 12% of 2 hours is 0.24 hours: steps 5-20 (0.05-0.2 h) go.
  run, _ = _read(tmp_path)
  curve = curves.fit_curve(
      run.steps, run.compute, run.score, skip_fraction=0.12
  )
  assert _steps(curve, "skipped") == [5, 10, 15, 20]
  assert curve.fit.num_points == 36
  none = curves.fit_curve(run.steps, run.compute, run.score, skip_fraction=0.0)
  assert _steps(none, "skipped") == [] and none.fit.num_points == 40


def test_r0_is_the_score_at_step_0(tmp_path):
  run, scores = _read(tmp_path)
  curve = curves.fit_curve(run.steps, run.compute, run.score)
  assert curve.fit.r0 == scores[0] and curve.fit.r0_source == "given"
  assert _steps(curve, "r0") == [0]
  raised = run.score.copy()
  raised[0] = 0.25  # Measured, not fitted: R_0 follows the point exactly.
  assert curves.fit_curve(run.steps, run.compute, raised).fit.r0 == 0.25


def test_a_curve_without_step_0_fits_r0(tmp_path):
  # A train metric has no step 0. R_0 becomes a fourth parameter, pinned by
  # the early points: the truth, 0.2, within 0.02; steps play their parts as
  # with a step 0 (step 5 skipped, 10-200 fitted).
  run, _ = _read(tmp_path)
  curve = curves.fit_curve(run.steps[1:], run.compute[1:], run.score[1:])
  assert curve.error == "" and curve.fit.r0_source == "fitted"
  assert abs(curve.fit.r0 - 0.2) <= 0.02, curve.fit
  assert abs(curve.fit.a - 0.6) <= 0.01, curve.fit
  assert _steps(curve, "r0") == [] and _steps(curve, "skipped") == [5]
  assert _steps(curve, "fitted") == list(range(10, 201, 5))


def test_bootstrap_spread_as_large_as_the_value_makes_a_fit_unreliable(
    tmp_path,
):
  # The shape of the case (docs/multitask.txt, math, first half: A
  # 0.316 ± 0.213, B 2.73 ± 3.10): a gain of 0.13 over 60 steps, evaluated
  # every 4, with noise 0.02. Its half-run fit raises no other warning, but
  # the bootstrap std of each parameter exceeds MAX_RELATIVE_STD of it.
  run, _ = _read(
      tmp_path,
      a=0.32,
      b=2.7,
      c_mid_step=24,
      r0=0.19,
      noise=0.02,
      num_steps=60,
      eval_every=4,
  )
  kwargs = dict(fit_fraction=0.5)
  plain = curves.fit_curve(run.steps, run.compute, run.score, **kwargs)
  assert plain.fit.reliable, plain.fit.warnings
  curve = curves.fit_curve(
      run.steps, run.compute, run.score, num_bootstrap=100, **kwargs
  )
  f, u = curve.fit, curve.uncertainty
  limit = uncertainty.MAX_RELATIVE_STD
  assert u.a_std >= limit * f.a and u.b_std >= limit * f.b
  assert u.c_mid_std >= limit * f.c_mid
  assert not f.reliable and curve.extrapolation.fit is f
  assert [w.split("=")[0] for w in f.warnings] == ["A", "B", "C_mid"]
  # The well-measured curve of the other tests keeps its verdict.
  good, _ = _read(tmp_path, name="good")
  fitted = curves.fit_curve(
      good.steps, good.compute, good.score, num_bootstrap=100, **kwargs
  )
  assert fitted.fit.reliable, fitted.fit.warnings


def test_fit_fraction_holds_out_the_second_half_and_predicts_the_final_value(
    tmp_path,
):
  # Half of 2 hours is 1 hour, step 100: steps 10-100 fitted (step 5 skipped),
  # steps 105-200 held out.
  run, scores = _read(tmp_path)
  curve = curves.fit_curve(run.steps, run.compute, run.score, fit_fraction=0.5)
  ex = curve.extrapolation
  assert _steps(curve, "skipped") == [5]
  assert _steps(curve, "fitted") == list(range(10, 101, 5))
  assert _steps(curve, "held_out") == list(range(105, 201, 5))
  assert (
      ex.split == pytest.approx(1.0)
      and ex.held_out == 20
      and curve.fit is ex.fit
  )
  assert ex.final_score == scores[200]
  assert ex.final_prediction == pytest.approx(
      float(sigmoid.predict(ex.fit, 2.0))
  )
  assert ex.final_error == pytest.approx(ex.final_prediction - scores[200])
  truth = sigmoid.sigmoid(200, 0.6, 1.9, 20, 0.2)
  assert abs(ex.final_prediction - truth) <= 0.01, ex


def test_fractions_are_checked():
  with pytest.raises(ValueError, match="skip_fraction < fit_fraction"):
    curves.fit_curve(
        [0, 1, 2],
        [0.0, 1.0, 2.0],
        [0.1, 0.2, 0.3],
        skip_fraction=0.5,
        fit_fraction=0.5,
    )


def test_curve_too_short_carries_the_reason():
  curve = curves.fit_curve([0, 5, 10], [0.0, 1.0, 2.0], [0.1, 0.2, 0.3])
  assert curve.fit is None and "at least 4 points" in curve.error
  assert curve.roles()["skipped"].tolist() == [False, True, True]


def test_fit_groups_seeds_by_name(tmp_path):
  # Three seeds whose steps cost 36, 37.8 and 39.6 device-seconds (2.0, 2.1 and
  # 2.2 hours in all), and one unrelated run.
  members = [
      _read(
          tmp_path,
          f"cispo_seed{s}",
          seed=s,
          seconds_per_step=36 * (1 + 0.05 * s),
      )[0]
      for s in range(3)
  ]
  other, _ = _read(tmp_path, "dapo", seed=9, a=0.5)
  groups = curves.fit_groups(members + [other], num_bootstrap=20)
  assert [g.name for g in groups] == ["cispo", "dapo"]
  cispo, dapo = groups
  assert [r.name for r in cispo.runs] == [
      "cispo_seed0",
      "cispo_seed1",
      "cispo_seed2",
  ]
  assert cispo.mean.compute[-1] == pytest.approx(2.1)
  np.testing.assert_allclose(
      cispo.mean.score, np.mean([r.score for r in members], 0)
  )
  per_seed = [f.fit for f in cispo.fits]
  assert cispo.spread.num_runs == 3
  assert cispo.spread.a_mean == pytest.approx(np.mean([f.a for f in per_seed]))
  assert cispo.spread.c_mid_std == pytest.approx(
      np.std([f.c_mid for f in per_seed], ddof=1)
  )
  # C_mid is step 20: 0.2, 0.21 and 0.22 hours; the mean curve's is about 0.21.
  assert [f.c_mid for f in per_seed] == pytest.approx(
      [0.2, 0.21, 0.22], rel=0.05
  )
  mean = cispo.mean_fit
  assert abs(mean.fit.a - 0.6) <= 0.01 and mean.fit.c_mid == pytest.approx(
      0.21, rel=0.05
  )
  assert mean.fit.r0 == pytest.approx(np.mean([r.score[0] for r in members]))
  assert mean.uncertainty.num_samples == 20
  assert dapo.mean is None and dapo.mean_fit is None and dapo.spread is None
  assert abs(dapo.fits[0].fit.a - 0.5) <= 0.01
