"""Tests of scalerl_jax/scaling/paired.py: paired differences and the seeds
a claim needs."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from scalerl_jax.scaling import compare
from scalerl_jax.scaling import curves
from scalerl_jax.scaling import paired
from scalerl_jax.scaling import runs
from scalerl_jax.scaling import sigmoid

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_paired_differences_worked_by_hand():
  # d = 0.06, 0.04, 0.08: mean 0.06, sd sqrt((0 + 0.0004 + 0.0004) / 2) =
  # 0.02, sigma 0.02 / sqrt(3) = 0.011547.
  p = paired.paired({0: 0.56, 1: 0.44, 2: 0.68}, {0: 0.5, 1: 0.4, 2: 0.6})
  assert p.seeds == (0, 1, 2)
  assert p.differences == pytest.approx((0.06, 0.04, 0.08))
  assert p.mean == pytest.approx(0.06)
  assert p.sd == pytest.approx(0.02)
  assert p.sigma == pytest.approx(0.02 / 3**0.5)
  assert paired.verdict(p) == "higher"  # 0.06 > 2 x 0.0115.
  assert paired.verdict(p, z=6.0) == "inconclusive"  # 0.06 < 6 x 0.0115.
  assert paired.verdict(p, floor=0.07) == "inconclusive"


def test_pairing_cancels_a_shared_base_that_unpaired_spread_would_not():
  # The bases differ by 0.2 between seeds; the second is 0.03 lower on each.
  base = {0: 0.3, 1: 0.5, 2: 0.7}
  p = paired.paired(base, {s: v - 0.03 for s, v in base.items()})
  assert p.sd == pytest.approx(0.0, abs=1e-12)
  assert paired.verdict(p) == "higher"
  q = paired.paired({s: v - 0.03 for s, v in base.items()}, base)
  assert paired.verdict(q) == "lower"


def test_only_shared_seeds_pair_and_two_are_needed():
  p = paired.paired({0: 0.5, 1: 0.6, 5: 0.9}, {1: 0.5, 0: 0.4, 3: 0.1})
  assert p.seeds == (0, 1)
  with pytest.raises(ValueError, match="two or more shared seeds"):
    paired.paired({0: 0.5, 1: 0.6}, {1: 0.5})


def test_seeds_needed():
  # (2 x 0.019 / 0.02)^2 = 3.61 -> 4; (2 x 0.03 / 0.05)^2 = 1.44 -> 2.
  assert paired.seeds_needed(0.019, 0.02) == 4
  assert paired.seeds_needed(0.03, 0.05) == 2
  assert paired.seeds_needed(0.05, 0.02, z=3.0) == 57  # 56.25 -> 57.
  with pytest.raises(ValueError):
    paired.seeds_needed(0.01, 0.0)


def _write_run(path, scores):
  os.makedirs(path)
  with open(os.path.join(path, "metrics.jsonl"), "w") as f:
    for i, score in enumerate(scores):
      f.write(json.dumps({"step": 10 * i, "val/mean_at_k": score}) + "\n")


def _launch_paired(workdirs, *flags):
  """launch.paired's printout on `workdirs` with `flags`."""
  return subprocess.run(
      [sys.executable, "-m", "launch.paired", f"--workdirs={workdirs}", *flags],
      cwd=REPO,
      capture_output=True,
      text=True,
      check=True,
  ).stdout


def test_launcher_reads_seed_point_layout(tmp_path):
  for seed, (a, b) in enumerate([(0.50, 0.40), (0.60, 0.52), (0.45, 0.33)]):
    _write_run(str(tmp_path / f"seed={seed}" / "cispo"), [0.2, a - 0.02, a])
    _write_run(str(tmp_path / f"seed={seed}" / "dapo"), [0.2, b + 0.02, b])
  found = [
      runs.read_run(w, x_key="step", name=n)
      for w, n in zip(
          runs.find_workdirs([str(tmp_path)]),
          runs.labels(runs.find_workdirs([str(tmp_path)])),
      )
  ]
  # Mean of the last two: a - 0.01 and b + 0.01.
  assert paired.by_seed(found, "cispo", last=2) == pytest.approx(
      {0: 0.49, 1: 0.59, 2: 0.44}
  )
  out = _launch_paired(tmp_path, "--first=cispo", "--second=dapo")
  # d = 0.10, 0.08, 0.12: mean 0.10, sd 0.02, sigma 0.0115.
  assert "cispo - dapo: +0.1000 ± 0.0115 (sd 0.0200 over 3 seeds)" in out
  assert "cispo higher at 2 sigma" in out


def _claim(relation, param="A"):
  return compare.Claim("a", relation, "b", param, "test")


def test_claim_verdicts_worked_by_hand():
  # d = 0.06, 0.04, 0.08: mean 0.06, sigma 0.011547; 2 sigma 0.0231.
  p = paired.paired({0: 0.56, 1: 0.44, 2: 0.68}, {0: 0.5, 1: 0.4, 2: 0.6})
  assert paired.claim_verdict(p, _claim("higher")) == "agrees"
  # Reversed: b - a = -0.06.
  q = paired.paired({0: 0.5, 1: 0.4, 2: 0.6}, {0: 0.56, 1: 0.44, 2: 0.68})
  assert paired.claim_verdict(q, _claim("higher")) == "disagrees"
  assert paired.claim_verdict(p, _claim("higher"), z=6.0) == "inconclusive"
  # "same": 0.06 - 0.0231 = 0.0369 > 0.02, wholly outside the noise.
  assert paired.claim_verdict(p, _claim("same")) == "disagrees"
  # d = 0.004, -0.002, 0.004: mean 0.002, sd 0.003464, sigma 0.002; the
  # interval [-0.002, 0.006] lies within ±0.02.
  s = paired.paired({0: 0.504, 1: 0.398, 2: 0.604}, {0: 0.5, 1: 0.4, 2: 0.6})
  assert s.sigma == pytest.approx(0.002)
  assert paired.claim_verdict(s, _claim("same")) == "agrees"
  # d = 0.02, -0.02, 0.0: mean 0, sigma 0.011547; [-0.023, 0.023] straddles
  # the noise's edge.
  w = paired.paired({0: 0.52, 1: 0.38, 2: 0.6}, {0: 0.5, 1: 0.4, 2: 0.6})
  assert paired.claim_verdict(w, _claim("same")) == "inconclusive"


def test_statistics_stand_for_a_and_b(tmp_path):
  path = str(tmp_path / "seed=0" / "a")
  _write_run(path, [0.2, 0.3, 0.5, 0.7])
  run = runs.read_run(path, x_key="step", name="seed=0/a")
  assert paired.score(run, "A", last=2) == pytest.approx(0.6)
  # The mean after step 0: (0.3 + 0.5 + 0.7) / 3.
  assert paired.score(run, "B") == pytest.approx(0.5)
  with pytest.raises(ValueError, match="C_mid"):
    paired.score(run, "C_mid")
  one = str(tmp_path / "seed=0" / "one")
  _write_run(one, [0.2])
  with pytest.raises(ValueError, match="two or more"):
    paired.speed_score(runs.read_run(one, x_key="step"))


def test_mechanism_size_mean_or_last(tmp_path):
  path = tmp_path / "run"
  os.makedirs(path)
  with open(path / "metrics.jsonl", "w") as f:
    for step, retired in enumerate([0, 2, 7]):
      f.write(json.dumps({"step": step, "prompts_retired": retired}) + "\n")
  assert paired.mechanism_size(str(path), "prompts_retired") == 3.0
  assert paired.mechanism_size(str(path), "prompts_retired", "last") == 7.0
  assert paired.mechanism_size(str(path), "prompts_retired", "first") == 0.0
  with pytest.raises(ValueError, match="not 'median'"):
    paired.mechanism_size(str(path), "prompts_retired", "median")
  assert paired.mechanism_size(str(path), "train/l2_grads") is None


def test_launcher_checks_a_sweep_files_claims(tmp_path):
  for seed, (a, b) in enumerate([(0.50, 0.40), (0.60, 0.52), (0.45, 0.33)]):
    _write_run(str(tmp_path / f"seed={seed}" / "scalerl"), [0.2, a - 0.02, a])
    _write_run(str(tmp_path / f"seed={seed}" / "short"), [0.2, b + 0.02, b])
  out = _launch_paired(tmp_path, "--claims=configs/parity_grid.py", "--last=2")
  # End points a - 0.01 and b + 0.01: d = 0.08, 0.06, 0.10, mean 0.08,
  # sigma 0.0115; (2 x 0.02 / 0.08)^2 = 0.25 -> 2 seeds.
  assert (
      "| scalerl > short in A (end point) | A 0.645 at 32k tokens vs 0.610 at"
      " 14k (§1) | +0.080 ± 0.012 | 3, 20 | agrees | 2 |"
  ) in out
  # Points that did not run are named, not dropped.
  assert "| scalerl > dapo in A |" in out and "missing" in out
  # Another list of the file's claims by name; only its own claims.
  for seed in range(3):
    _write_run(str(tmp_path / f"seed={seed}" / "batch8"), [0.2, 0.3, 0.3])
  long = _launch_paired(
      tmp_path, "--claims=configs/parity_grid.py:LONG_CLAIMS", "--last=2"
  )
  assert "| scalerl > batch8 in A (end point) |" in long
  assert "short" not in long
  with pytest.raises(subprocess.CalledProcessError) as raised:
    _launch_paired(tmp_path, "--claims=configs/parity_grid.py:NOPE")
  assert "configs/parity_grid.py defines no NOPE" in raised.value.stderr


def _write_sigmoid(path, a, b=2.0, c_mid=60.0, r0=0.3, last_step=180):
  steps = range(0, last_step + 1, 10)
  os.makedirs(path)
  with open(os.path.join(path, "metrics.jsonl"), "w") as f:
    for step in steps:
      score = float(sigmoid.sigmoid(step, a, b, c_mid, r0))
      f.write(json.dumps({"step": step, "val/mean_at_k": score}) + "\n")


def test_fitted_a_recovers_each_runs_asymptote_and_pairs_it(tmp_path):
  """Runs drawn from known sigmoids: the fitted A is theirs, the launcher
  pairs it by seed, and the end point (still 0.02-0.03 below A at step 180)
  would not give the asymptotes' difference."""
  for seed, (a1, a2) in enumerate([(0.80, 0.70), (0.85, 0.77), (0.78, 0.66)]):
    _write_sigmoid(str(tmp_path / f"seed={seed}" / "cispo"), a1)
    _write_sigmoid(str(tmp_path / f"seed={seed}" / "dapo"), a2, c_mid=40.0)
  run = runs.read_run(str(tmp_path / "seed=0" / "cispo"), x_key="step")
  assert paired.score(run, "A_fit") == pytest.approx(0.80, abs=2e-3)
  assert paired.score(run, "A") < 0.79
  out = _launch_paired(
      tmp_path, "--first=cispo", "--second=dapo", "--param=A_fit"
  )
  # d = 0.10, 0.08, 0.12: mean 0.10, sd 0.02.
  assert "A_fit: fitted A" in out
  assert "cispo - dapo: +0.100" in out and "(sd 0.020" in out
  assert "cispo higher at 2 sigma" in out


def test_fitted_a_refuses_a_run_that_does_not_pin_it(tmp_path):
  """A run cut off before its midpoint says so, rather than give an A."""
  path = str(tmp_path / "seed=0" / "early")
  _write_sigmoid(path, 0.8, c_mid=600.0, last_step=60)
  with pytest.raises(ValueError, match="not pinned|no sigmoid fit"):
    paired.fitted_a(runs.read_run(path, x_key="step"))


def test_fitted_a_refuses_a_fit_that_only_its_bootstrap_shows_unpinned(
    tmp_path,
):
  """Validation noise of 0.02 around a sigmoid whose midpoint is in range:
  the fit itself does not warn, but its bootstrap leaves a parameter
  unpinned, and launch.fit would mark it unreliable."""
  steps = np.arange(0, 190, 10)
  score = sigmoid.sigmoid(steps, 0.85, 1.4, 60.0, 0.64)
  score += 0.02 * np.random.default_rng(0).standard_normal(len(steps))
  score[0] = 0.64
  path = tmp_path / "seed=0" / "noisy"
  os.makedirs(path)
  with open(path / "metrics.jsonl", "w") as f:
    for step, value in zip(steps, score):
      f.write(json.dumps({"step": int(step), "val/mean_at_k": value}) + "\n")
  run = runs.read_run(str(path), x_key="step")
  assert curves.fit_curve(run.steps, run.compute, run.score).fit.reliable
  with pytest.raises(ValueError, match="bootstrap std"):
    paired.fitted_a(run)
