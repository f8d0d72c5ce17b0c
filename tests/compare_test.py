"""Tests of the comparison rule, the paper's claims on the grids and
the power-law baseline."""

import os

import numpy as np
import pytest

from configs import scalerl
from scalerl_jax.jobs import sweep
from scalerl_jax.scaling import compare
from scalerl_jax.scaling import seeds
from scalerl_jax.scaling import sigmoid

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

R0 = 0.3
NOISE = 0.005
# GPU-hours, 20x the C_mid of the curves below.
COMPUTE = np.linspace(500, 50000, 100)


def _curve(a, b, c_mid, seed, compute=COMPUTE, noise=NOISE):
  noise = np.random.default_rng(seed).normal(0.0, noise, compute.size)
  return sigmoid.sigmoid(compute, a, b, c_mid, R0) + noise


def _estimate(a=0.6, a_std=0.0, b=2.0, b_std=0.0):
  return compare.Estimate(
      a=a,
      a_std=a_std,
      b=b,
      b_std=b_std,
      c_mid=2500.0,
      c_mid_std=0.0,
      u_source="given",
  )


def test_compare_decides_on_a_when_ceilings_differ():
  low, high = _curve(0.58, 1.9, 2500, 0), _curve(0.64, 1.5, 2500, 1)
  result = compare.compare((COMPUTE, low), (COMPUTE, high))
  assert (result.better, result.decided_by, result.shared) == ("b", "A", None)
  assert result.fit_b.a - result.fit_a.a >= 0.02
  # Far outside the bootstrap uncertainty (about 0.0013 here).
  assert result.difference == result.fit_a.a - result.fit_b.a
  assert abs(result.difference) > 10 * result.difference_std > 0


def test_compare_decides_on_b_with_a_shared_a():
  # CISPO B = 2.01 vs DAPO B = 1.77 at the same ceiling (PAPER.md §1).
  dapo, cispo = _curve(0.61, 1.77, 2500, 2), _curve(0.61, 2.01, 2500, 3)
  result = compare.compare((COMPUTE, dapo), (COMPUTE, cispo))
  assert (result.better, result.decided_by) == ("b", "B")
  shared_dapo, shared_cispo = result.shared
  assert shared_dapo.a == shared_cispo.a
  assert abs(shared_dapo.a - 0.61) <= 0.01
  assert shared_cispo.b > shared_dapo.b
  assert result.difference == shared_dapo.b - shared_cispo.b
  # About 0.31 vs 0.087.
  assert abs(result.difference) > 2 * result.difference_std > 0
  swapped = compare.compare((COMPUTE, cispo), (COMPUTE, dapo))
  assert (swapped.better, swapped.decided_by) == ("a", "B")


def test_compare_is_inconclusive_when_b_differs_within_the_noise():
  # B 1.90 vs 1.93 under noise 0.01: the fits' B differ by 0.09, the bootstrap
  # stds of B at the shared A combine to 0.16.
  first, second = _curve(0.61, 1.90, 2500, 4, noise=0.01), _curve(
      0.61, 1.93, 2500, 5, noise=0.01
  )
  result = compare.compare((COMPUTE, first), (COMPUTE, second))
  assert (result.better, result.decided_by) == ("inconclusive", "B")
  assert abs(result.difference) <= result.difference_std
  # Told that the fits are exact (u = 0), the rule decides on the sign alone.
  exact = seeds.Spread(
      a_mean=0.61,
      a_std=0.0,
      b_mean=1.9,
      b_std=0.0,
      c_mid_mean=2500.0,
      c_mid_std=0.0,
      num_runs=3,
  )
  told = compare.compare(
      (COMPUTE, first), (COMPUTE, second), stds=(exact, exact)
  )
  assert told.better == ("a" if result.difference > 0 else "b")


def test_compare_is_inconclusive_when_a_differs_within_the_noise():
  # A run that stops at 3.2 C_mid under noise 0.02 leaves A loose: the fits'
  # ceilings differ by 0.079 (more than 0.02), their bootstrap
  # stds combine to 0.098.
  compute = np.linspace(500, 8000, 25)
  low = _curve(0.60, 1.9, 2500, 8, compute, noise=0.02)
  high = _curve(0.63, 1.9, 2500, 9, compute, noise=0.02)
  result = compare.compare((compute, low), (compute, high))
  assert (result.better, result.decided_by, result.shared) == (
      "inconclusive",
      "A",
      None,
  )
  assert 0.02 <= abs(result.difference) <= result.difference_std


def test_compare_of_a_curve_with_itself_is_inconclusive():
  curve = (COMPUTE, _curve(0.61, 1.9, 2500, 0))
  result = compare.compare(curve, curve)
  assert (result.better, result.decided_by) == ("inconclusive", "B")
  # The shared-A refit fits both copies jointly, so their B agree to rounding,
  # not bit for bit (-5e-9 on one machine, 0.0 on another).
  assert abs(result.difference) < 1e-6 < result.difference_std


def test_a_noise_threshold_is_configurable():
  low, high = _curve(0.58, 1.9, 2500, 0), _curve(0.64, 1.5, 2500, 1)
  result = compare.compare((COMPUTE, low), (COMPUTE, high), a_noise=0.1)
  assert result.decided_by == "B" and result.shared[0].a == result.shared[1].a


@pytest.mark.parametrize(
    "claim, first, second, verdict",
    [
        # A: d = 0.04 beyond u = sqrt(0.006^2 + 0.008^2) = 0.01 and the floor
        # 0.02.
        (
            ("higher", "A"),
            _estimate(a=0.64, a_std=0.006),
            _estimate(a=0.60, a_std=0.008),
            "agrees",
        ),
        (
            ("higher", "A"),
            _estimate(a=0.60, a_std=0.006),
            _estimate(a=0.64, a_std=0.008),
            "disagrees",
        ),
        # d = 0.015 is beyond u = 0.003 but under the floor;
        # d = 0.03 is within u = 0.04.
        (
            ("higher", "A"),
            _estimate(a=0.615, a_std=0.003),
            _estimate(a=0.60),
            "inconclusive",
        ),
        (
            ("higher", "A"),
            _estimate(a=0.63, a_std=0.04),
            _estimate(a=0.60),
            "inconclusive",
        ),
        # B has no floor: d = 0.3 and -0.2 beyond
        # u = sqrt(0.06^2 + 0.08^2) = 0.1, 0.05 within it.
        (
            ("higher", "B"),
            _estimate(b=2.3, b_std=0.06),
            _estimate(b=2.0, b_std=0.08),
            "agrees",
        ),
        (
            ("higher", "B"),
            _estimate(b=1.8, b_std=0.06),
            _estimate(b=2.0, b_std=0.08),
            "disagrees",
        ),
        (
            ("higher", "B"),
            _estimate(b=2.05, b_std=0.06),
            _estimate(b=2.0, b_std=0.08),
            "inconclusive",
        ),
        # Same A: |d| + u = 0.005 + sqrt(0.003^2 + 0.004^2) = 0.01 under the
        # floor agrees; 0.012 + 0.01 reaches it (inconclusive);
        # d = 0.03 beyond u = 0.005 disagrees.
        (
            ("same", "A"),
            _estimate(a=0.605, a_std=0.003),
            _estimate(a=0.60, a_std=0.004),
            "agrees",
        ),
        (
            ("same", "A"),
            _estimate(a=0.612, a_std=0.006),
            _estimate(a=0.60, a_std=0.008),
            "inconclusive",
        ),
        (
            ("same", "A"),
            _estimate(a=0.57, a_std=0.003),
            _estimate(a=0.60, a_std=0.004),
            "disagrees",
        ),
    ],
)
def test_check_claim_by_hand(claim, first, second, verdict):
  relation, param = claim
  result = compare.check_claim(
      compare.Claim("x", relation, "y", param, "test"), first, second
  )
  assert result.verdict == verdict
  field = param.lower()
  assert result.difference == pytest.approx(
      getattr(first, field) - getattr(second, field)
  )


def test_grid_verdicts_report_missing_points_and_claims_check_their_terms():
  claims = compare.PAPER_CLAIMS["loss_type"]
  verdicts = compare.grid_verdicts(
      {"cispo": _estimate(a=0.65), "dapo": _estimate(a=0.6)}, claims
  )
  assert [(str(v.claim), v.verdict) for v in verdicts] == [
      ("cispo > dapo in A", "agrees"),
      ("gspo > dapo in A", "missing"),
  ]
  with pytest.raises(ValueError, match="only A"):
    compare.Claim("a", "same", "b", "B", "test")
  with pytest.raises(ValueError, match="'higher' or 'same'"):
    compare.Claim("a", "lower", "b", "A", "test")


@pytest.mark.parametrize("grid", sorted(compare.PAPER_CLAIMS))
def test_paper_claims_name_points_of_their_sweep_files(grid):
  points = sweep.load_sweep(
      os.path.join(REPO, "configs", "ablations", f"{grid}.py"),
      scalerl.get_config,
  )
  names = {p.name for p in points}
  for claim in compare.PAPER_CLAIMS[grid]:
    assert {claim.first, claim.second} <= names, (claim, names)


def test_find_grid_reads_the_sweep_directory():
  assert compare.find_grid(
      ["/tmp/sweeps/loss_type/cispo", "/tmp/sweeps/loss_type/dapo"]
  ) == ("loss_type")
  assert compare.find_grid(
      ["/s/adv_norm_seed1/norm_batch", "/s/adv_norm_seed2/norm_none"]
  ) == ("adv_norm")
  assert compare.find_grid(["/tmp/sweeps/mine/cispo"]) is None
  with pytest.raises(ValueError, match="several grids"):
    compare.find_grid(["/s/loss_type/cispo", "/s/off_policy/pipeline_k8"])


@pytest.mark.parametrize(
    "c_mid, b, a",
    [(2542, 1.92, 0.610), (11272, 1.89, 0.645), (1675, 1.09, 0.615)],
)
def test_power_law_baseline_extrapolates_worse(c_mid, b, a):
  compute = np.linspace(c_mid / 5, 20 * c_mid, 100)
  score = sigmoid.sigmoid(compute, a, b, c_mid, R0)
  score = score + np.random.default_rng(0).normal(0.0, NOISE, compute.size)
  head = compute <= compute[-1] / 2
  power = compare.fit_power_law(compute[head], score[head])
  fit = sigmoid.fit(compute[head], score[head])
  tail = compute[~head]
  power_error = np.abs(
      compare.predict_power_law(power, tail) - score[~head]
  ).mean()
  sigmoid_error = np.abs(sigmoid.predict(fit, tail) - score[~head]).mean()
  assert power_error > 2 * sigmoid_error
  assert power.a > a + 0.05  # Its ceiling overshoots; the paper saw A = 1.0.
