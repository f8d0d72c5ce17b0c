"""Tests of the curriculum: No-Positive-Resampling,
zero-variance counts, checkpointing."""

import json
import math

import numpy as np
import orbax.checkpoint as ocp
import pytest

from configs import scalerl
from scalerl_jax.data import curriculum as curriculum_lib


def test_retires_exactly_when_the_history_reaches_the_threshold():
  c = curriculum_lib.Curriculum.from_config(scalerl.get_config().curriculum)
  assert c.retire_threshold == 0.9
  # Worked by hand, one prompt, threshold 0.9:
  #   3/4 = 0.75 -> kept;  7/8 = 0.875 -> kept;  11/12 = 0.917 -> retired.
  assert c.update(["p"], [[1, 1, 1, 0]]) == []
  assert c.update(["p"], [[1, 1, 1, 1]]) == []
  assert c.pass_rate("p") == 0.875 and not c.is_retired("p")
  assert c.update(["p"], [[1, 1, 1, 1]]) == ["p"]
  assert c.is_retired("p") and c.metrics()["prompts_retired"] == 1
  # Retirement is permanent, even if the pass rate falls again.
  assert c.update(["p"] * 3, np.zeros((3, 4))) == []
  assert c.is_retired("p") and c.pass_rate("p") < 0.5


def test_reaching_the_threshold_exactly_retires():
  c = curriculum_lib.Curriculum(retire_threshold=0.9)
  # 0.9 and 0.8.
  assert c.update(["a", "b"], [[1] * 9 + [0], [1] * 8 + [0, 0]]) == ["a"]
  # b: 18 / 20 = 0.9 after the first of these rows;
  # the second adds history only.
  assert c.update(["b"] * 2, [[1] * 10, [1] * 10]) == ["b"]
  assert c.num_samples("b") == 30


def test_matches_a_reference_on_random_histories():
  rng = np.random.default_rng(0)
  c = curriculum_lib.Curriculum(retire_threshold=0.9)
  sums, counts, retired_at = {}, {}, {}
  for step in range(300):
    ids = [f"p{i}" for i in rng.integers(0, 20, size=4)]
    solve_rate = rng.uniform(0.5, 1.0, size=(4, 1))
    scores = (rng.uniform(size=(4, 8)) < solve_rate).astype(np.float32)
    expected_new = []
    for pid, row in zip(ids, scores):
      sums[pid] = sums.get(pid, 0) + int(row.sum())
      counts[pid] = counts.get(pid, 0) + 8
      # Exact arithmetic.
      if pid not in retired_at and 10 * sums[pid] >= 9 * counts[pid]:
        retired_at[pid] = step
        expected_new.append(pid)
    assert c.update(ids, scores) == expected_new
  assert 0 < len(retired_at) < 20  # Some, not all, prompts retired.
  assert {p for p in sums if c.is_retired(p)} == set(retired_at)
  records = [{"id": f"p{i}"} for i in range(25)]
  assert [r["id"] for r in c.filter_records(records)] == [
      r["id"] for r in records if r["id"] not in retired_at
  ]


def test_without_no_positive_resampling_nothing_retires():
  c = curriculum_lib.Curriculum(
      retire_threshold=0.9, no_positive_resampling=False
  )
  assert c.update(["p"], [[1, 1, 1, 1]]) == []
  assert not c.is_retired("p") and c.pass_rate("p") == 1.0


def test_zero_variance_mask_and_counts():
  scores = np.array(
      [[1, 1, 1], [0, 0, 0], [0.5, 0.5, 0.5], [1, 0, 1]], np.float32
  )
  np.testing.assert_array_equal(
      curriculum_lib.zero_variance_mask(scores), [True, True, True, False]
  )
  c = curriculum_lib.Curriculum()
  c.update(["a", "b", "c", "d"], scores)
  metrics = c.metrics()
  assert metrics["groups_seen"] == 4
  assert metrics["zero_variance_groups"] == 3
  assert metrics["zero_variance_fraction"] == 0.75
  assert metrics["all_correct_groups"] == 1 and metrics["all_wrong_groups"] == 1
  assert metrics["prompts_seen"] == 4 and metrics["prompts_retired"] == 1


@pytest.mark.parametrize(
    "ids, scores, message",
    [
        (["a"], [[1, 2]], "in \\[0, 1\\]"),
        (["a", "b"], [[1, 0]], "expected \\[P, G\\]"),
        (["a"], [1, 0], "expected \\[P, G\\]"),
        ([1], [[1, 0]], "prompt ids must be strings"),
    ],
)
def test_bad_updates_are_errors(ids, scores, message):
  with pytest.raises(ValueError, match=message):
    curriculum_lib.Curriculum().update(ids, scores)


def test_unseen_prompt():
  c = curriculum_lib.Curriculum()
  assert math.isnan(c.pass_rate("never")) and c.num_samples("never") == 0
  assert not c.is_retired("never")


def _played(c, steps, seed):
  rng = np.random.default_rng(seed)
  retired = []
  for _ in range(steps):
    ids = [f"prompt/{i}" for i in rng.integers(0, 12, size=3)]
    retired += c.update(
        ids, rng.choice([0.0, 0.5, 1.0], p=[0.1, 0.1, 0.8], size=(3, 4))
    )
  return retired


def test_state_round_trips_through_an_orbax_checkpoint(tmp_path):
  c = curriculum_lib.Curriculum(retire_threshold=0.85)
  _played(c, 20, seed=1)
  assert 0 < c.metrics()["prompts_retired"]
  with ocp.CheckpointManager(tmp_path) as manager:
    manager.save(
        20,
        args=ocp.args.Composite(curriculum=ocp.args.JsonSave(c.state_dict())),
    )
    manager.wait_until_finished()
  with ocp.CheckpointManager(tmp_path) as manager:
    restored = manager.restore(
        manager.latest_step(),
        args=ocp.args.Composite(curriculum=ocp.args.JsonRestore()),
    )
  r = curriculum_lib.Curriculum.from_state_dict(restored.curriculum)
  assert r.state_dict() == c.state_dict()
  assert r.metrics() == c.metrics()
  # The restored curriculum then evolves exactly like the uninterrupted one.
  assert _played(r, 30, seed=2) == _played(c, 30, seed=2)
  assert r.state_dict() == c.state_dict()


def test_state_is_plain_json():
  c = curriculum_lib.Curriculum()
  _played(c, 5, seed=3)
  assert json.loads(json.dumps(c.state_dict())) == c.state_dict()


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda s: s.pop("counts"), "keys"),
        (lambda s: s.update(version=99), "version 99"),
        (lambda s: s["counts"].append(1), "counts"),
        (lambda s: s["retired"].append("ghost"), "without history"),
    ],
)
def test_bad_state_is_an_error(edit, message):
  c = curriculum_lib.Curriculum()
  _played(c, 5, seed=4)
  state = c.state_dict()
  edit(state)
  with pytest.raises(ValueError, match=message):
    curriculum_lib.Curriculum.from_state_dict(state)
