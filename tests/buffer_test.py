"""Rollout buffer: start-order consumption, staleness faults, histogram,
checkpoints."""

import dataclasses

import numpy as np
import pytest

from scalerl_jax.rl import buffer as buffer_lib
from scalerl_jax.sampling.completions import Completions


def _group(index, versions_GxC, prompt_len=2, seq=8, reward=(1.0, 0.0)):
  """Group number `index` whose completions hold the
  given per-token versions."""
  g = len(versions_GxC)
  version = np.full((g, seq), -1, np.int32)
  mask = np.zeros((g, seq), bool)
  lengths = np.zeros((g,), np.int32)
  for i, vs in enumerate(versions_GxC):
    version[i, prompt_len : prompt_len + len(vs)] = vs
    mask[i, prompt_len : prompt_len + len(vs)] = True
    lengths[i] = len(vs)
  gen_logp = -mask.astype(np.float32)
  return buffer_lib.Group(
      record={"id": f"p{index}"},
      index=index,
      completions=Completions(
          tokens=np.arange(g * seq, dtype=np.int32).reshape(g, seq),
          gen_logp=gen_logp,
          logp_sampling=2 * gen_logp,
          version=version,
          mask=mask,
          prompt_len=np.full((g,), prompt_len, np.int32),
          seq_len=prompt_len + lengths,
          truncated=np.zeros((g,), bool),
          interrupted=np.array([True, False])[:g],
          thinking_budget=np.full((g,), 5, np.int32),
          meta=np.full((g, 1), index, np.int32),
          slot=np.arange(g, dtype=np.int32),
      ),
      scores_G=np.asarray(reward[:g], np.float32),
      rewards_G=np.asarray(reward[:g], np.float32),
  )


def _ids(groups):
  return [g.index for g in groups]


def test_groups_are_handed_out_in_start_order_not_finish_order():
  buf = buffer_lib.RolloutBuffer()
  k = 2
  buf.add(_group(1, [[0], [0]]))  # Finished before group 0.
  buf.add(_group(2, [[0], [0]]))
  # Group 0 is still in flight: nothing may pass it.
  assert buf.num_ready(0, k) == 0 and buf.take(1, 0, k) is None
  assert len(buf) == 2  # A failed take consumes nothing.
  buf.add(_group(0, [[0, 0], [0]]))
  assert buf.num_ready(0, k) == 3
  assert _ids(buf.take(2, 0, k)) == [0, 1]
  buf.add(_group(4, [[1], [1]]))  # 3 in flight: only 2 is ready.
  assert buf.num_ready(1, k) == 1 and buf.take(2, 1, k) is None
  buf.add(_group(3, [[1], [1]]))
  assert _ids(buf.take(3, 1, k)) == [2, 3, 4]
  assert buf.num_evicted == 0 and len(buf) == 0


def test_a_group_staler_than_k_is_evicted_and_counted_never_consumed():
  buf = buffer_lib.RolloutBuffer()
  k = 2
  buf.add(_group(0, [[0, 0], [0, 1]]))  # Oldest token 0.
  buf.add(_group(1, [[1, 2], [2]]))  # Oldest 1.
  buf.add(_group(2, [[3], [3, 3]]))  # Oldest 3.
  # At version 3: group 0 lags 3 > 2 and does not count; 1 (lag 2) and 2 (0) do.
  assert buf.num_ready(3, k) == 2
  assert buf.take(3, 3, k) is None
  assert _ids(buf.take(2, 3, k)) == [1, 2]
  assert buf.num_evicted == 1 and len(buf) == 0


def test_a_group_is_added_once():
  buf = buffer_lib.RolloutBuffer()
  k = 1
  buf.add(_group(0, [[0], [0]]))
  with pytest.raises(ValueError, match="group 0 was already added"):
    buf.add(_group(0, [[0], [0]]))
  buf.take(1, 0, k)
  with pytest.raises(ValueError, match="group 0 was already added"):
    buf.add(_group(0, [[0], [0]]))


def test_staleness_histogram_counts_true_lags():
  # At version 4: tokens of versions 4, 3, 3, 1, 0 lag 0, 1, 1, 3, 4.
  groups = [_group(0, [[4, 3], [3]]), _group(1, [[1], [0]])]
  np.testing.assert_array_equal(
      buffer_lib.staleness_histogram(groups, 4), [1, 2, 0, 1, 1]
  )
  with pytest.raises(ValueError, match="newer than the trainer's version 2"):
    buffer_lib.staleness_histogram(groups, 2)


def test_a_lag_above_k_is_logged_as_it_is_not_clipped():
  # The review's case: 6 tokens that lagged 7 versions, k = 2. Clipped at k
  # they read as max 2 and hist [0, 0, 6]; here they are a fault.
  groups = [_group(0, [[0, 0, 0], [0, 0, 0]])]
  metrics = buffer_lib.staleness_metrics(groups, 7, 2)
  assert metrics["staleness/max"] == 7 and metrics["staleness/mean"] == 7
  assert [metrics[f"staleness/hist_{i}"] for i in range(3)] == [0, 0, 0]
  assert metrics["staleness/over_k"] == 6 and "staleness/hist_3" not in metrics
  # Within the bound: lags 0, 1, 1, 2 and one completion of mixed versions.
  metrics = buffer_lib.staleness_metrics([_group(0, [[3, 2], [2, 1]])], 3, 2)
  assert [metrics[f"staleness/hist_{i}"] for i in range(3)] == [1, 2, 1]
  assert metrics["staleness/over_k"] == 0 and metrics["staleness/max"] == 2
  assert (
      metrics["staleness/mean"] == 1.0
      and metrics["staleness/mixed_version_frac"] == 1.0
  )


def test_oldest_version_of_mixed_versions():
  g = _group(0, [[2, 3, 4], [3]])
  assert g.oldest_version() == 2


def test_state_round_trip():
  buf = buffer_lib.RolloutBuffer()
  k = 4
  buf.add(_group(0, [[0, 1], [1]]))
  buf.add(_group(1, [[2], [2, 2, 2]]))
  buf.add(_group(2, [[7], [7]]))
  # 0 and 1 lag 7 and 5 > 4: evicted on the way.
  assert _ids(buf.take(1, 7, k)) == [2]
  buf.add(_group(4, [[7], [7]]))
  buf.add(_group(3, [[7], [8]]))
  arrays, meta = buf.state()
  other = buffer_lib.RolloutBuffer()
  other.restore(arrays, meta)
  assert (
      other.num_evicted == 2 and len(other) == 2 and other.num_ready(8, k) == 2
  )
  taken = other.take(2, 8, k)
  assert _ids(taken) == [3, 4]
  ref = _group(3, [[7], [8]])
  assert taken[0].record == {"id": "p3"}
  got_arrays, ref_arrays = taken[0].arrays(), ref.arrays()
  # Every field of the record, and the scores and rewards.
  assert set(got_arrays) == {
      f.name for f in dataclasses.fields(Completions)
  } | {
      "scores_G",
      "rewards_G",
  }
  for name, value in ref_arrays.items():
    np.testing.assert_array_equal(got_arrays[name], value)
    assert got_arrays[name].dtype == value.dtype
