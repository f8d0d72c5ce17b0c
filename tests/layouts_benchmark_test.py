"""benchmarks/layouts.py's statistics, worked out by hand."""

import pytest

from benchmarks import layouts


def test_mean_until_is_the_area_under_the_linear_curve_over_time():
  x, y = [0.0, 10.0, 20.0], [0.0, 1.0, 1.0]
  # 0..10 rises to 1 (area 5), 10..20 stays at 1 (area 10): 15 / 20.
  assert layouts.mean_until(x, y, 20.0) == pytest.approx(0.75)
  # Cut at 15: 5 + 5 over 15.
  assert layouts.mean_until(x, y, 15.0) == pytest.approx(10 / 15)
  # Cut inside the first segment, at 4: y(4) = 0.4, area 0.8 over 4.
  assert layouts.mean_until(x, y, 4.0) == pytest.approx(0.2)
  with pytest.raises(ValueError, match="outside"):
    layouts.mean_until(x, y, 21.0)


def _run(val, wall, step_s=1.0, end=None):
  return {
      "val": val,
      "val_wall_s": wall,
      "val_steps": [0, 10, 20],
      "step_s_mean": step_s,
      "end": val[-1] if end is None else end,
  }


def test_the_wall_clock_judgment_pairs_seeds_at_the_shorter_runs_time():
  summaries = {}
  for seed, lift in zip(layouts.SEEDS, (0.10, 0.12, 0.11)):
    # PipelineRL reaches the same curve in half the wall time.
    summaries[(seed, "pipeline_free")] = _run(
        [0.2, 0.3 + lift, 0.5], [0.0, 5.0, 10.0], step_s=0.5
    )
    summaries[(seed, "ppo_k8")] = _run([0.2, 0.3, 0.5], [0.0, 10.0, 20.0])
  verdict = layouts.judge(summaries)["pipeline_b_wall"]
  # Over [0, 10]: pipeline's mean is ((0.2 + 0.3 + lift) / 2 * 5
  # + (0.3 + lift + 0.5) / 2 * 5) / 10 = 0.325 + lift / 2; ppo's is
  # (0.2 + 0.3) / 2 = 0.25.
  expected = [0.075 + lift / 2 for lift in (0.10, 0.12, 0.11)]
  assert verdict["wall"]["differences"] == pytest.approx(expected)
  assert verdict["wall"]["verdict"] == "agrees"
  assert verdict["step_s_ratio_ppo_over_pipeline"] == pytest.approx([2.0] * 3)
  # On the step axis the curves differ only at step 10.
  assert verdict["steps"]["mean"] == pytest.approx(
      sum(l / 2 for l in (0.10, 0.12, 0.11)) / 3
  )


def test_same_learning_needs_the_interval_inside_the_margin():
  near = {}
  far = {}
  for seed, d in zip(layouts.SEEDS, (0.001, -0.001, 0.0)):
    near[(seed, "colocated")] = _run([0.2, 0.4, 0.5], [0, 1, 2])
    near[(seed, "pipeline_free")] = _run(
        [0.2, 0.4, 0.5], [0, 1, 2], end=0.5 + d
    )
    far[(seed, "colocated")] = _run([0.2, 0.4, 0.5], [0, 1, 2])
    far[(seed, "pipeline_free")] = _run(
        [0.2, 0.4, 0.5], [0, 1, 2], end=0.5 + 0.1 + d
    )
  assert layouts.judge(near)["same_learning"]["verdict"] == "same"
  assert layouts.judge(far)["same_learning"]["verdict"] == "differs"
