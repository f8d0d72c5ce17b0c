"""Tests of reading runs' metrics.jsonl and of the launch/fit.py launcher."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from scalerl_jax.scaling import runs
from scalerl_jax.scaling import sigmoid

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _write_run(workdir, a, b, c_mid, seed, extra_lines=()):
  """A fabricated run: a training line every step, validation every 5 steps."""
  os.makedirs(workdir, exist_ok=True)
  rng = np.random.default_rng(seed)
  with open(os.path.join(workdir, runs.METRICS), "w") as f:
    for step in range(201):
      flops = step * 1e14
      row = {"step": step, "compute/flops": flops, "compute/device_seconds": step * 36.0,
             "train/loss": 0.1}
      if step % 5 == 0:
        score = sigmoid.sigmoid(flops, a, b, c_mid, 0.2) + rng.normal(0, 0.005)
        row["val/mean_at_k"] = float(np.clip(score, 0, 1))
      f.write(json.dumps(row) + "\n")
    f.writelines(line + "\n" for line in extra_lines)


def test_read_run_reports_bad_lines_and_keeps_good_ones(tmp_path):
  workdir = str(tmp_path / "run")
  _write_run(workdir, 0.6, 1.9, 2e15, 0, extra_lines=[
      '{"step": 300, "compute/flops": 3e16, "val/mean_at_k": 0.6',  # Truncated write.
      '[1, 2]',
      '{"step": "x", "compute/flops": 3e16, "val/mean_at_k": 0.6}',
      '{"step": 301, "val/mean_at_k": 0.6}',
      '{"step": 302, "compute/flops": 3.02e16, "val/mean_at_k": NaN}',
      '{"step": 200, "compute/flops": 2e16, "val/mean_at_k": 0.5}',
  ])
  run = runs.read_run(workdir)
  path = os.path.join(workdir, runs.METRICS)
  assert run.name == "run"
  assert run.compute.size == 41  # Steps 0, 5, ..., 200.
  assert np.all(np.diff(run.compute) > 0)
  assert run.score[-1] == 0.5  # Step 200 logged again: the later line wins.
  assert [p.split(": ", 1)[0] for p in run.problems] == [
      f"{path}:{n}" for n in (202, 203, 204, 205, 206, 207)]
  assert "not valid JSON" in run.problems[0]
  assert "compute/flops" in run.problems[3]
  assert "logged again" in run.problems[5]


def test_read_run_derives_device_hours(tmp_path):
  workdir = str(tmp_path / "run")
  _write_run(workdir, 0.6, 1.9, 2e15, 0)
  run = runs.read_run(workdir, x_key="compute/device_hours")
  np.testing.assert_allclose(run.compute[:3], [0.0, 0.05, 0.1])  # 5 steps x 36 s = 0.05 h.


def test_find_workdirs(tmp_path):
  for name in ("b", "a"):
    _write_run(str(tmp_path / "sweep" / name), 0.6, 1.9, 2e15, 0)
  (tmp_path / "sweep" / "empty").mkdir()
  assert runs.find_workdirs([str(tmp_path / "sweep")]) == [
      str(tmp_path / "sweep" / n) for n in ("a", "b")]
  assert runs.find_workdirs([str(tmp_path / "sweep" / "b")]) == [str(tmp_path / "sweep" / "b")]
  with pytest.raises(FileNotFoundError, match="no metrics.jsonl"):
    runs.find_workdirs([str(tmp_path / "sweep" / "empty")])
  with pytest.raises(FileNotFoundError, match="no such directory"):
    runs.find_workdirs([str(tmp_path / "missing")])


def test_table_names_runs_that_cannot_be_fitted(tmp_path):
  good, short = str(tmp_path / "good"), str(tmp_path / "short")
  _write_run(good, 0.6, 1.9, 2e15, 0)
  os.makedirs(short)
  with open(os.path.join(short, runs.METRICS), "w") as f:
    f.write('{"step": 0, "compute/flops": 0.0, "val/mean_at_k": 0.2}\n')
  results = runs.fit_runs([runs.read_run(good), runs.read_run(short)], num_bootstrap=0)
  table = runs.format_table(results, "compute/flops")
  assert results[0].fit is not None and results[1].fit is None
  assert "short: not fitted: need at least 4 points" in table


def test_fit_launcher_writes_table_and_png(tmp_path):
  sweep_dir = tmp_path / "sweep"
  _write_run(str(sweep_dir / "cispo"), 0.61, 1.9, 2e15, 0, extra_lines=["{oops"])
  _write_run(str(sweep_dir / "dapo"), 0.55, 1.6, 3e15, 1)
  out = tmp_path / "plots" / "grid.png"
  proc = subprocess.run(
      [sys.executable, "-m", "launch.fit", f"--workdirs={sweep_dir / 'cispo'},{sweep_dir / 'dapo'}",
       "--fit_fraction=0.5", "--num_bootstrap=50", f"--out={out}"],
      cwd=REPO, capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr
  header = proc.stdout.splitlines()[0].split()
  assert header[:3] == ["run", "points", "A"] and "last" in header
  rows = {line.split()[0]: line for line in proc.stdout.splitlines()[2:4]}
  assert set(rows) == {"cispo", "dapo"}
  assert "±" in rows["cispo"] and "(measured)" in rows["cispo"]
  assert f"{sweep_dir / 'cispo' / 'metrics.jsonl'}:202: not valid JSON" in proc.stderr
  assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  assert (tmp_path / "plots" / "grid.txt").read_text() in proc.stdout


def test_fit_launcher_fails_clearly_on_a_missing_workdir(tmp_path):
  proc = subprocess.run([sys.executable, "-m", "launch.fit", f"--workdirs={tmp_path / 'nope'}"],
                        cwd=REPO, capture_output=True, text=True, timeout=120)
  assert proc.returncode != 0
  assert "no such directory" in proc.stderr and "Traceback" not in proc.stderr
