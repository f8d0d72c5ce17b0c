"""Sampler on 8 simulated CPU devices == one device (in a subprocess)."""

import pytest

from tests import helpers

SHAPES = [(1, 8, 1), (2, 2, 2)]


@pytest.fixture(scope="module")
def sharded_results():
  return helpers.run_on_8_devices("tests.scripts.sampler_sharded")


@pytest.mark.parametrize("shape", SHAPES)
def test_sharded_greedy_equals_single_device(sharded_results, shape):
  r = sharded_results[shape]
  assert r["greedy_tokens_equal"] and r["greedy_mask_equal"]
  assert r["greedy_logp_max_diff"] <= 1e-5


def test_sharded_sampling_equals_single_device(sharded_results):
  # Each sequence has its own key stream, so the layout cannot change the draws;
  # (2, 2, 2) also splits the vocabulary over `tensor`.
  r = sharded_results[(2, 2, 2)]
  assert r["sampled_tokens_equal"] and r["sampled_mask_equal"]
  assert r["sampled_logp_max_diff"] <= 1e-5


def test_kv_cache_is_sharded_over_slots(sharded_results):
  # One layer's keys [N=8, K=2, E=16, S=128]: slots over data x fsdp, kv heads over tensor.
  assert sharded_results[(1, 8, 1)]["cache_shard_shape"] == [1, 2, 16, 128]
  assert sharded_results[(2, 2, 2)]["cache_shard_shape"] == [2, 1, 16, 128]
