"""benchmarks/learn_summary.py: a run's steps from its own records."""

import math

import pytest

from benchmarks import learn_summary
from scalerl_jax.metrics import writer as writer_lib


def _line(step, flops, device_s, gen, train, reward, no_signal, val=None):
  line = {
      "step": step,
      "compute/flops": flops,
      "compute/device_seconds": device_s,
      "time/generate_s": gen,
      "time/train_s": train,
      "train/reward_mean": reward,
      "train/no_signal": no_signal,
      "train/l2_updates": 0.0 if no_signal else 0.1,
  }
  if val is not None:
    line["val/mean_at_k"], line["val/mean_at_k_stderr"] = val
  return line


_METRICS = [
    {
        "step": 0,
        "compute/flops": 0.0,
        "compute/device_seconds": 0.0,
        "val/mean_at_k": 0.20,
        "val/mean_at_k_stderr": 0.006,
    },
    _line(1, 4e12, 2.0, 1.5, 0.5, 0.25, 0.0),
    _line(2, 4e12 + 6e12, 2.0 + 3.0, 2.0, 1.0, 0.0, 1.0, val=(0.30, 0.008)),
]


def test_each_step_splits_its_wall_time_and_counts_its_mfu():
  # Step 1 written 2.5 s after step 0, step 2 6 s after step 1.
  rows = learn_summary.step_rows(
      _METRICS, {0: 100.0, 1: 102.5, 2: 108.5}, peak_flops=1e15
  )
  assert [r["step"] for r in rows] == [1, 2]
  one, two = rows
  # Step 1: 2.5 s wall less 1.5 generating and 0.5 training = 0.5 s host.
  # 4e12 FLOPs in 2 device-seconds at 1e15 FLOP/s peak: 0.002; over its
  # wall, 4e12 / 2.5 / 1e15 = 0.0016.
  assert one["host_s"] == pytest.approx(0.5)
  assert one["mfu"] == pytest.approx(0.002)
  assert one["wall_mfu"] == pytest.approx(0.0016)
  assert one["updated"] and one["val"] is None
  # Step 2: 6 - 2 - 1 = 3 s host with its validation; 6e12 in 3 s: 0.002.
  assert two["host_s"] == pytest.approx(3.0)
  assert two["mfu"] == pytest.approx(0.002)
  assert two["wall_mfu"] == pytest.approx(0.001)
  assert not two["updated"] and two["val"] == 0.30


def test_the_rise_is_judged_against_both_validations_noise():
  v = learn_summary.verdict(_METRICS)
  # sqrt(0.006^2 + 0.008^2) = 0.01; a rise of 0.10 is 10 of it.
  assert v["curve"] == {0: 0.2, 2: 0.3}
  assert v["noise"] == pytest.approx(0.01)
  assert v["rise_over_noise"] == pytest.approx(10.0)
  assert v["learned"]
  flat = _METRICS[:2] + [
      _line(2, 1e13, 5.0, 2.0, 1.0, 0.0, 1.0, val=(0.215, 0.008))
  ]
  assert not learn_summary.verdict(flat)["learned"]


def test_write_times_reads_the_writers_event_files(tmp_path):
  writer = writer_lib.MetricWriter(str(tmp_path), is_primary=True)
  for line in _METRICS:
    writer.write(line["step"], {k: v for k, v in line.items() if k != "step"})
  writer.close()
  times = learn_summary.write_times(str(tmp_path / "tb"))
  assert sorted(times) == [0, 1, 2]
  assert times[0] <= times[1] <= times[2]
  summary = learn_summary.summarize(str(tmp_path), 0.0, 989.0)
  assert summary["steps"] == 2 and summary["setup_s"] is None
  assert all(math.isfinite(r["wall_s"]) for r in summary["per_step"])
  assert summary["no_signal_steps"] == 1 and summary["rewarded_steps"] == 1
