"""jobs.planner.roofline: a program's roofline from its cost analysis."""

import pytest

from scalerl_jax.jobs.planner import accelerators
from scalerl_jax.jobs.planner import roofline

V5E = accelerators.ACCELERATORS["tpu_v5e"]  # 197 TFLOP/s, 819 GB/s.


def test_a_negative_optimal_seconds_falls_back_to_flops_and_bytes():
  # libtpu's optimal_seconds came out negative on v5e: the bound is taken
  # from the same cost analysis, here 1 s of FLOPs against 0.5 s of bytes.
  cost = {"flops": 197e12, "bytes accessed": 0.5 * 819e9, "optimal_seconds": -3}
  r = roofline.program_roofline(cost, V5E)
  assert r == roofline.Roofline(pytest.approx(1.0), roofline.BOUND, 0.0, 0.0)
  # The decode kernel's 2 s of reads join the bytes: 2.5 s of bytes.
  r = roofline.program_roofline(cost, V5E, kernel_bytes=2 * 819e9)
  assert r.seconds == pytest.approx(2.5)
  assert r.kernel_seconds == pytest.approx(2.0)
  # So do splash attention's FLOPs: 1 + 3 s of FLOPs.
  r = roofline.program_roofline(cost, V5E, kernel_flops=3 * 197e12)
  assert r.seconds == pytest.approx(4.0)
  assert roofline.program_roofline(
      {"flops": 197e12}, V5E
  ).seconds == pytest.approx(1.0)


def test_a_positive_optimal_seconds_is_the_compilers_part():
  cost = {"flops": 197e12, "bytes accessed": 0.0, "optimal_seconds": 0.25}
  r = roofline.program_roofline(cost, V5E)
  assert r == roofline.Roofline(0.25, roofline.OPTIMAL, 0.0, 0.0)
  # The kernels' work, which the compiler's figure omits, is added to it.
  r = roofline.program_roofline(cost, V5E, kernel_bytes=819e9)
  assert r.seconds == pytest.approx(1.25) and r.source == roofline.OPTIMAL


def test_the_runs_flops_at_peak_are_the_floor():
  # A remat model's layers are a loop the cost analysis counts once: its
  # 1 s of FLOPs (and 0.5 s of bytes) fall short of the 6 s the run needs.
  cost = {"flops": 197e12, "bytes accessed": 0.5 * 819e9, "optimal_seconds": -3}
  r = roofline.program_roofline(cost, V5E, model_flops=6 * 197e12)
  assert r == roofline.Roofline(
      pytest.approx(6.0), roofline.FLOOR, 0.0, pytest.approx(6.0)
  )
  # Under the compiler's figure the floor changes nothing.
  r = roofline.program_roofline(cost, V5E, model_flops=0.5 * 197e12)
  assert r.source == roofline.BOUND and r.seconds == pytest.approx(1.0)
  assert r.floor_seconds == pytest.approx(0.5)
  cost["optimal_seconds"] = 2.0
  r = roofline.program_roofline(cost, V5E, model_flops=0.5 * 197e12)
  assert r.source == roofline.OPTIMAL and r.seconds == 2.0


def test_no_roofline_without_a_cost_analysis_or_the_chips_figures():
  cost = {"flops": 1e12, "bytes accessed": 1e9}
  assert roofline.program_roofline(None, V5E) is None
  assert roofline.program_roofline({}, V5E) is None
  cpu = accelerators.Accelerator("cpu", 1e9, 0.0, "RAM")
  assert roofline.program_roofline(cost, cpu) is None


def test_every_chip_has_a_bandwidth():
  for chip in accelerators.ACCELERATORS.values():
    assert chip.hbm_bandwidth > 0 and chip.peak_flops > 0, chip.name
