"""Rollout buffer: staleness bound, eviction, histogram, checkpoint round trip, collate."""

import numpy as np
import pytest

from scalerl_jax.rl import buffer as buffer_lib


def _group(pid, versions_GxC, prompt_len=2, seq=8, reward=(1.0, 0.0)):
  """A group whose completions hold the given per-token versions (-1 = pad)."""
  g = len(versions_GxC)
  version = np.full((g, seq), -1, np.int32)
  mask = np.zeros((g, seq), np.float32)
  lengths = np.zeros((g,), np.int32)
  for i, vs in enumerate(versions_GxC):
    version[i, prompt_len:prompt_len + len(vs)] = vs
    mask[i, prompt_len:prompt_len + len(vs)] = 1
    lengths[i] = len(vs)
  return buffer_lib.Group(
      record={"id": pid}, tokens_GxS=np.arange(g * seq, dtype=np.int32).reshape(g, seq),
      mask_GxS=mask, gen_logp_GxS=-mask, version_GxS=version,
      rewards_G=np.asarray(reward[:g], np.float32), prompt_lens_G=np.full((g,), prompt_len, np.int32),
      lengths_G=lengths, truncated_G=np.zeros((g,), bool))


def test_groups_staler_than_k_are_never_consumed():
  buf = buffer_lib.RolloutBuffer(max_off_policy=2)
  buf.add(_group("a", [[0, 0], [0, 1]]))  # oldest 0
  buf.add(_group("b", [[1, 2], [2]]))  # oldest 1
  buf.add(_group("c", [[3], [3, 3]]))  # oldest 3
  # At version 3: a is 3 stale (> 2) and is evicted; b (2) and c (0) may go.
  assert buf.num_ready(3) == 2
  taken = buf.take(2, 3)
  assert [g.record["id"] for g in taken] == ["b", "c"]
  assert buf.num_evicted == 1 and len(buf) == 0
  assert all(3 - g.oldest_version() <= 2 for g in taken)


def test_take_returns_none_until_enough_fresh_groups():
  buf = buffer_lib.RolloutBuffer(max_off_policy=1)
  buf.add(_group("a", [[5, 5], [5]]))
  assert buf.take(2, 5) is None
  assert len(buf) == 1  # Nothing consumed by a failed take.
  buf.add(_group("b", [[6], [6]]))
  assert [g.record["id"] for g in buf.take(2, 6)] == ["a", "b"]


def test_staleness_histogram_counts_sampled_tokens():
  # At version 4 with k = 3: tokens of versions 4, 3, 3, 1, 0 have staleness
  # 0, 1, 1, 3, 4 -> clipped to 3: counts [1, 2, 0, 2].
  groups = [_group("a", [[4, 3], [3]]), _group("b", [[1], [0]])]
  np.testing.assert_array_equal(buffer_lib.staleness_histogram(groups, 4, 3), [1, 2, 0, 2])


def test_mixed_versions_and_oldest_newest():
  g = _group("a", [[2, 3, 4], [3]])
  assert (g.oldest_version(), g.newest_version()) == (2, 4)


def test_state_round_trip():
  buf = buffer_lib.RolloutBuffer(max_off_policy=4)
  buf.add(_group("a", [[0, 1], [1]]))
  buf.add(_group("b", [[2], [2, 2, 2]]))
  buf.evict_stale(100)
  buf.add(_group("c", [[7], [7]]))
  arrays, meta = buf.state()
  other = buffer_lib.RolloutBuffer(max_off_policy=4)
  other.restore(arrays, meta)
  assert other.num_evicted == 2 and len(other) == 1
  (g,) = other.take(1, 7)
  ref = _group("c", [[7], [7]])
  assert g.record == {"id": "c"}
  for name in buffer_lib.Group._ARRAYS:  # pylint: disable=protected-access
    np.testing.assert_array_equal(getattr(g, name), getattr(ref, name))


def test_collate_is_prompt_major_and_trims_padding():
  groups = [_group("a", [[0, 0, 0], [0]], seq=80), _group("b", [[0], [0, 0]], seq=80)]
  batch = buffer_lib.collate(groups, length_multiple=32)
  # Longest row: prompt 2 + 3 tokens = 5 -> trimmed to 32 of 80 columns.
  assert batch["tokens_BxS"].shape == (4, 32)
  np.testing.assert_array_equal(batch["tokens_BxS"][2], groups[1].tokens_GxS[0, :32])
  np.testing.assert_array_equal(batch["rewards_PxG"], [[1, 0], [1, 0]])
  assert batch["mask_BxS"].sum() == 3 + 1 + 1 + 2


def test_bad_k_is_rejected():
  with pytest.raises(ValueError, match="buffer.max_off_policy"):
    buffer_lib.RolloutBuffer(0)
