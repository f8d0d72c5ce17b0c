"""Tests of reading runs' metrics.jsonl, of the text report and of the
launch/fit.py launcher.

The fabricated runs (`scaling_helpers.write_workdir`) validate at steps 0, 5,
..., 200 and spend 36 device-seconds a step: step s sits at s / 100
device-hours, s * 1e14 FLOPs.
"""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from scalerl_jax import workdir as workdir_lib
from scalerl_jax.scaling import curves
from scalerl_jax.scaling import report
from scalerl_jax.scaling import runs
from scalerl_jax.scaling import verdicts
from tests import scaling_helpers

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CURVE = dict(a=0.6, b=1.9, c_mid_step=20)


def _write(workdir, seed=0, **kwargs):
  return scaling_helpers.write_workdir(
      str(workdir), seed=seed, **{**CURVE, **kwargs}
  )


def test_read_run_reports_bad_lines_and_keeps_good_ones(tmp_path):
  workdir = str(tmp_path / "run")
  _write(
      workdir,
      extra_lines=[
          # Truncated write.
          '{"step": 300, "compute/flops": 3e16, "val/mean_at_k": 0.6',
          "[1, 2]",
          '{"step": "x", "compute/flops": 3e16, "val/mean_at_k": 0.6}',
          '{"step": 301, "val/mean_at_k": 0.6}',
          '{"step": 302, "compute/flops": 3.02e16, "val/mean_at_k": NaN}',
          '{"step": 200, "compute/flops": 2e16, "val/mean_at_k": 0.5}',
      ],
  )
  run = runs.read_run(workdir, x_key="compute/flops")
  path = os.path.join(workdir, workdir_lib.METRICS_FILE)
  assert run.name == "run"
  np.testing.assert_array_equal(run.steps, np.arange(0, 201, 5))
  assert np.all(np.diff(run.compute) > 0)
  assert run.score[-1] == 0.5  # Step 200 logged again: the later line wins.
  assert [p.split(": ", 1)[0] for p in run.problems] == [
      f"{path}:{n}" for n in (202, 203, 204, 205, 206, 207)
  ]
  assert "not valid JSON" in run.problems[0]
  assert "compute/flops" in run.problems[3]
  assert "logged again" in run.problems[5]


@pytest.mark.parametrize(
    "x_key, expected",
    [
        ("compute/device_hours", [0.0, 0.05, 0.1]),  # 5 steps x 36 s = 0.05 h.
        ("compute/flops", [0.0, 5e14, 1e15]),
        ("step", [0.0, 5.0, 10.0]),
    ],
)
def test_read_run_compute_measures(tmp_path, x_key, expected):
  _write(tmp_path / "run")
  np.testing.assert_allclose(
      runs.read_run(str(tmp_path / "run"), x_key=x_key).compute[:3], expected
  )


def test_find_workdirs_and_labels(tmp_path):
  for name in ("b", "a", "seed=1/a", "seed=0/a"):
    _write(tmp_path / "sweep" / name)
  (tmp_path / "sweep" / "empty").mkdir()
  sweep = str(tmp_path / "sweep")
  found = runs.find_workdirs([sweep, os.path.join(sweep, "b")])
  assert found == [
      os.path.join(sweep, n) for n in ("a", "b", "seed=0/a", "seed=1/a")
  ]
  assert runs.labels(found) == ["a", "b", "seed=0/a", "seed=1/a"]
  assert runs.labels(found[1:2]) == ["b"]
  with pytest.raises(FileNotFoundError, match="no metrics.jsonl"):
    runs.find_workdirs([str(tmp_path / "sweep" / "empty")])
  with pytest.raises(FileNotFoundError, match="no such directory"):
    runs.find_workdirs([str(tmp_path / "missing")])


def test_report_states_settings_points_and_failures(tmp_path):
  _write(tmp_path / "good")
  _write(tmp_path / "short", num_steps=10)
  loaded = [runs.read_run(str(tmp_path / n), name=n) for n in ("good", "short")]
  groups = curves.fit_groups(loaded, skip_fraction=0.03, fit_fraction=0.5)
  text = report.format_report(
      groups,
      x_key="compute/device_hours",
      y_key="val/mean_at_k",
      skip_fraction=0.03,
      fit_fraction=0.5,
  )
  assert "skipped: points below 3.0% of each curve's final compute" in text
  assert "fitted: up to 50% of each curve's final compute" in text
  # Hand-checked: 3% of 2 h = 0.06 h; half of 2 h = 1 h, step 100.
  assert (
      f"good: R_0 {loaded[0].score[0]:.3f} at step 0; skipped (x < 0.06): step 5 (1 point, "
      "x 0.05); fitted: steps 10-100 (19 points, x 0.1-1); held out: steps 105-200 "
      "(20 points, x 1.05-2)"
  ) in text
  assert "short: not fitted: need at least 4 points" in text
  row = next(line for line in text.splitlines() if line.startswith("good "))
  e = groups[0].fits[0].extrapolation
  assert row.split()[-4:] == [
      f"{e.final_prediction:.3f}",
      f"{e.final_score:.3f}",
      f"{e.final_error:+.4f}",
      f"{e.mean_abs_error:.4f}",
  ]
  # No val/mean_at_k_stderr given: the hidden-half check falls
  # back to the fit's RMSE.
  f = groups[0].fits[0].fit
  assert (
      f"good: 20 held-out points, mean |err| {e.mean_abs_error:.4f}, final err "
      f"{e.final_error:+.4f}; noise {f.rmse:.4f} (RMSE of the fit on its 19 fitted points; "
      f"no val/mean_at_k_stderr logged); mean |err| / noise "
      f"{e.mean_abs_error / f.rmse:.2f}"
  ) in text
  assert "short: not fitted (see notes)" in text


def test_fit_launcher_fits_a_train_metric(tmp_path):
  # train/reward_mean is logged from step 1 on (step 0 trains nothing): its
  # R_0 is fitted and the report says so, where every step used to be
  # listed as skipped and nothing fitted.
  _write(tmp_path / "run", train_score=True)
  out = tmp_path / "fit.png"
  proc = subprocess.run(
      [
          sys.executable,
          "-m",
          "launch.fit",
          f"--workdirs={tmp_path / 'run'}",
          "--metric=train/reward_mean",
          "--num_bootstrap=0",
          f"--out={out}",
      ],
      cwd=REPO,
      capture_output=True,
      text=True,
      timeout=300,
  )
  assert proc.returncode == 0, proc.stderr
  text = proc.stdout
  assert "fitted where a curve has no step 0 (train metrics)" in text
  row = next(line for line in text.splitlines() if line.startswith("run "))
  # Of steps 1-200, 1-5 (x < 0.06 h) are skipped, 6-200 fitted; A near 0.6.
  assert row.split()[1] == "195" and abs(float(row.split()[2]) - 0.6) <= 0.01
  assert re.search(
      r"run: R_0 0\.\d{3} fitted \(no step 0\); skipped \(x < 0\.06\): steps 1-5 "
      r"\(5 points, x 0\.01-0\.05\); fitted: steps 6-200 \(195 points",
      text,
  ), text
  assert "run: not fitted" not in text


def test_estimates_take_the_mean_over_seeds_and_its_standard_error(tmp_path):
  for s in range(3):
    _write(tmp_path / f"cispo_seed{s}", seed=s)
  _write(tmp_path / "dapo", seed=7, a=0.5)
  loaded = [
      runs.read_run(str(tmp_path / n), name=n)
      for n in ("cispo_seed0", "cispo_seed1", "cispo_seed2", "dapo")
  ]
  groups = curves.fit_groups(loaded, num_bootstrap=20)
  points = verdicts.estimates(groups)
  s, u = groups[0].spread, groups[1].fits[0].uncertainty
  assert points["cispo"].a == s.a_mean and points["cispo"].b == s.b_mean
  assert points["cispo"].a_std == pytest.approx(s.a_std / np.sqrt(3))
  assert points["cispo"].u_source == "std over 3 seeds / sqrt(3)"
  assert (points["dapo"].a, points["dapo"].a_std) == (
      groups[1].fits[0].fit.a,
      u.a_std,
  )
  assert points["dapo"].u_source == "bootstrap std"


def test_fit_launcher_groups_seeds_and_writes_report_and_png(tmp_path):
  sweep = tmp_path / "loss_type"  # Named as the grid: its claims are checked.
  finals = [
      _write(
          sweep / f"cispo_seed{s}",
          seed=s,
          stderr=0.005,
          extra_lines=["{oops"] if s == 0 else (),
      )[200]
      for s in range(3)
  ]
  _write(sweep / "dapo", seed=7, a=0.5)  # Logs no stderr, as older runs.
  out = tmp_path / "plots" / "grid.png"
  proc = subprocess.run(
      [
          sys.executable,
          "-m",
          "launch.fit",
          f"--workdirs={sweep}",
          "--fit_fraction=0.5",
          "--num_bootstrap=20",
          f"--out={out}",
      ],
      cwd=REPO,
      capture_output=True,
      text=True,
      timeout=300,
  )
  assert proc.returncode == 0, proc.stderr
  lines = proc.stdout.splitlines()
  assert lines[0].startswith(
      "x: compute/device_hours; y: val/mean_at_k; R_0: the score at step 0"
  )
  header = next(i for i, line in enumerate(lines) if line.startswith("curve "))
  names = [
      line.strip().split("  ")[0] for line in lines[header + 2 : header + 8]
  ]
  assert names == [
      "cispo [mean of 3 seeds]",
      "cispo [per-seed mean ± std]",
      "cispo_seed0",
      "cispo_seed1",
      "cispo_seed2",
      "dapo",
  ]
  # Over seeds: A, B, C_mid only.
  spread = re.split(r"\s{2,}", lines[header + 3])
  assert (
      spread[1] == "3 seeds"
      and all("±" in c for c in spread[2:5])
      and set(spread[5:]) == {"-"}
  )
  assert "cispo [mean of 3 seeds]: R_0" in proc.stdout
  assert "held out: steps 105-200 (20 points" in proc.stdout
  assert "cispo: 3 seeds (cispo_seed0, cispo_seed1, cispo_seed2)" in proc.stdout
  assert (
      f"{sweep / 'cispo_seed0' / 'metrics.jsonl'}:202: not valid JSON"
      in proc.stderr
  )
  assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  assert (tmp_path / "plots" / "grid.txt").read_text() in proc.stdout
  # The hidden-half check: stderr 0.005 logged on every evaluation,
  # 0.005 / sqrt(3) = 0.0029 for the mean of three seeds; the seeds' final
  # scores' sample std.
  groups = curves.fit_groups(
      [
          runs.read_run(str(sweep / n), name=n)
          for n in ("cispo_seed0", "cispo_seed1", "cispo_seed2", "dapo")
      ],
      fit_fraction=0.5,
  )
  mean, seed1, dapo = groups[0].mean_fit, groups[0].fits[1], groups[1].fits[0]
  held = lambda c: (
      f"20 held-out points, mean |err| {c.extrapolation.mean_abs_error:.4f}, "
      f"final err {c.extrapolation.final_error:+.4f}; noise"
  )
  assert (
      f"cispo [mean of 3 seeds]: {held(mean)} 0.0029 (mean val/mean_at_k_stderr / sqrt(3), "
      f"for a mean of 3 seeds); mean |err| / noise "
      f"{mean.extrapolation.mean_abs_error / (0.005 / np.sqrt(3)):.2f}; seed-to-seed std of "
      f"the final value {np.std(finals, ddof=1):.4f} (step 200)"
  ) in lines
  assert (
      f"cispo_seed1: {held(seed1)} 0.0050 (mean val/mean_at_k_stderr over 41 evaluations); "
      f"mean |err| / noise {seed1.extrapolation.mean_abs_error / 0.005:.2f}"
  ) in lines
  assert (
      f"dapo: {held(dapo)} {dapo.fit.rmse:.4f} (RMSE of the fit on its 19 fitted points; "
      "no val/mean_at_k_stderr logged)"
  ) in proc.stdout
  # The paper's claims on the loss grid, after the report; GSPO was not run.
  verdicts = lines.index(
      "verdicts on the loss_type grid against PAPER.md: a difference d = "
      "first - second counts when |d| > u = sqrt(u_first^2 + u_second^2), "
      "and in A when also |d| >= 0.02:"
  )
  assert re.fullmatch(
      r"  cispo > dapo in A: agrees \(d \+0\.\d{4} ± 0\.\d{4}; u: cispo std "
      r"over 3 seeds / sqrt\(3\), dapo bootstrap std\) \[PAPER\.md §6: Moved the "
      r"ceiling A: the loss \(CISPO/GSPO over DAPO\)\]",
      lines[verdicts + 1],
  )
  assert lines[verdicts + 2].startswith(
      "  gspo > dapo in A: missing (no fit of gspo) [PAPER.md"
  )


@pytest.mark.parametrize(
    "args, message",
    [
        (["--workdirs={tmp}/nope"], "no such directory"),
        (
            [
                "--workdirs={tmp}/run",
                "--skip_fraction=0.6",
                "--fit_fraction=0.5",
            ],
            "skip_fraction < fit_fraction",
        ),
        (
            ["--workdirs={tmp}/run", "--grid=nope"],
            "--grid=nope: value should be one of",
        ),
    ],
)
def test_fit_launcher_fails_clearly(tmp_path, args, message):
  _write(tmp_path / "run")
  proc = subprocess.run(
      [sys.executable, "-m", "launch.fit"]
      + [a.format(tmp=tmp_path) for a in args],
      cwd=REPO,
      capture_output=True,
      text=True,
      timeout=120,
  )
  assert proc.returncode != 0
  assert message in proc.stderr and "Traceback" not in proc.stderr


def test_fit_launcher_fits_each_metric_and_prints_them_side_by_side(tmp_path):
  # Two domains in one run's metrics: math along CURVE,
  # code along another A and B.
  for s in range(2):
    math = _write(tmp_path / "m" / f"seed={s}", seed=s)
    code = _write(tmp_path / "c" / f"seed={s}", seed=10 + s, a=0.45, b=1.2)
    run = tmp_path / "mix" / f"seed={s}"
    os.makedirs(run)
    with open(tmp_path / "m" / f"seed={s}" / workdir_lib.METRICS_FILE) as f:
      rows = [json.loads(line) for line in f]
    for row in rows:
      if "val/mean_at_k" in row:
        row["val/math/mean_at_k"] = math[row["step"]]
        row["val/code/mean_at_k"] = code[row["step"]]
    (run / workdir_lib.METRICS_FILE).write_text(
        "".join(json.dumps(r) + "\n" for r in rows)
    )
  out = tmp_path / "fit.png"
  proc = subprocess.run(
      [
          sys.executable,
          "-m",
          "launch.fit",
          f"--workdirs={tmp_path / 'mix'}",
          "--fit_fraction=0.5",
          "--num_bootstrap=0",
          f"--out={out}",
          "--metric=val/math/mean_at_k,val/code/mean_at_k",
      ],
      cwd=REPO,
      capture_output=True,
      text=True,
      timeout=300,
  )
  assert proc.returncode == 0, proc.stderr
  assert (
      "== val/math/mean_at_k ==\nx: compute/device_hours; y: val/math/mean_at_k"
      in proc.stdout
  )
  assert (
      "== val/code/mean_at_k ==\nx: compute/device_hours; y: val/code/mean_at_k"
      in proc.stdout
  )
  for metric in ("val_math_mean_at_k", "val_code_mean_at_k"):
    assert (tmp_path / f"fit_{metric}.png").read_bytes()[:4] == b"\x89PNG"
  lines = proc.stdout.splitlines()
  table = lines.index("side by side:")
  header = re.split(r"\s{2,}", lines[table + 1])
  assert header == [
      "curve",
      "val/math/mean_at_k A",
      "val/math/mean_at_k B",
      "val/math/mean_at_k C_mid",
      "val/math/mean_at_k final err",
      "val/code/mean_at_k A",
      "val/code/mean_at_k B",
      "val/code/mean_at_k C_mid",
      "val/code/mean_at_k final err",
  ]
  mean_row = re.split(r"\s{2,}", lines[table + 3])
  fits = {
      m: curves.fit_groups(
          [
              runs.read_run(
                  str(tmp_path / "mix" / f"seed={s}"), y_key=m, name=f"seed={s}"
              )
              for s in range(2)
          ],
          fit_fraction=0.5,
      )[0].mean_fit
      for m in ("val/math/mean_at_k", "val/code/mean_at_k")
  }
  math_fit, code_fit = fits["val/math/mean_at_k"], fits["val/code/mean_at_k"]
  assert mean_row[1:] == [
      f"{math_fit.fit.a:.3f}",
      f"{math_fit.fit.b:.2f}",
      f"{math_fit.fit.c_mid:.3g}",
      f"{math_fit.extrapolation.final_error:+.4f}",
      f"{code_fit.fit.a:.3f}",
      f"{code_fit.fit.b:.2f}",
      f"{code_fit.fit.c_mid:.3g}",
      f"{code_fit.extrapolation.final_error:+.4f}",
  ]
  assert abs(math_fit.fit.a - 0.6) < 0.05 and abs(code_fit.fit.a - 0.45) < 0.05
  assert (tmp_path / "fit.txt").read_text() in proc.stdout
