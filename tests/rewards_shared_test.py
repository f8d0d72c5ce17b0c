"""SharedRewardPool in one process: the pool's own scores and
counts, its errors raised.

The split over processes is exercised by tests/multi_controller_test.py, where
each of two processes verifies half of every batch.
"""

from concurrent import futures

import numpy as np
import pytest

from scalerl_jax.rewards.workers.shared import SharedRewardPool


class _FakePool:
  """Scores 1 for completions that say 'yes'; counts like RewardPool."""

  def __init__(self):
    self.calls, self.closed = [], False

  def score(self, completions, records):
    self.calls.append(list(completions))
    if any(r.get("bad") for r in records):
      raise ValueError("record 'x' has no answer")
    invalid = sum(not isinstance(c, str) for c in completions)
    scores = np.array([float(c == "yes") for c in completions], np.float32)
    return scores, {
        "num_completions": len(completions),
        "num_timeouts": 1,
        "num_errors": 2,
        "num_crashes": 0,
        "num_invalid": invalid,
        "num_worker_restarts": 3,
        "slowest_s": 0.5,
        "mean_s": 0.25,
        "wall_s": 0.75,
    }

  def submit(self, completions, records):
    """`score`, run at once; its result or error in a finished future."""
    future = futures.Future()
    try:
      future.set_result(self.score(completions, records))
    except ValueError as e:
      future.set_exception(e)
    return future

  def close(self):
    self.closed = True


def test_one_process_returns_the_pools_scores_and_counts():
  fake = _FakePool()
  completions = ["yes", "no", None, "yes", "yes"]
  with SharedRewardPool(fake) as shared:
    scores, stats = shared.score(completions, [{}] * 5)
  # Verified once, all of it here.
  assert fake.calls == [completions] and fake.closed
  np.testing.assert_array_equal(scores, [1, 0, 0, 1, 1])
  assert stats == {
      "num_completions": 5,
      "num_timeouts": 1,
      "num_errors": 2,
      "num_crashes": 0,
      "num_invalid": 1,
      "num_worker_restarts": 3,
      "slowest_s": 0.5,
      "mean_s": 0.25,
      "wall_s": 0.75,
  }


def test_a_failing_share_raises_its_error():
  with pytest.raises(ValueError, match="no answer"):
    SharedRewardPool(_FakePool()).score(["yes"], [{"bad": True}])


def test_an_empty_batch_is_not_gathered():
  scores, stats = SharedRewardPool(_FakePool()).score([], [])
  assert scores.shape == (0,) and stats["num_completions"] == 0


def test_mismatched_lengths_are_refused():
  with pytest.raises(ValueError, match="2 completions but 1 records"):
    SharedRewardPool(_FakePool()).score(["a", "b"], [{}])


def test_submit_hands_back_what_score_returns_and_raises_the_shares_error_at_result():
  fake = _FakePool()
  shared = SharedRewardPool(fake)
  completions = ["yes", "no", None]
  scoring = shared.submit(completions, [{}] * 3)
  scores, stats = scoring.result()
  assert scoring.result()[0] is scores  # Gathered once.
  np.testing.assert_array_equal(scores, shared.score(completions, [{}] * 3)[0])
  assert stats["num_completions"] == 3 and len(fake.calls) == 2
  # The share fails in the pool's thread.
  failing = shared.submit(["yes"], [{"bad": True}])
  with pytest.raises(ValueError, match="no answer"):
    failing.result()
