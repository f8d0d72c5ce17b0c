"""Sampler on 8 simulated CPU devices == one device (in a subprocess)."""

import pytest

from tests import helpers

# Minutes on 2 cores: README's test command leaves it out, CI runs it.
pytestmark = pytest.mark.slow(seconds=100)

SHAPES = [(1, 8, 1), (2, 2, 2), (8, 1, 1)]
# The same meshes with `sampling.weight_layout` "resident", and with the
# Pallas decode kernel (in shard_map, Pallas' interpreter here).
RESIDENT = [
    (1, 8, 1, "resident"),
    (2, 2, 2, "resident"),
    (2, 2, 2, "resident", "pallas"),
]


@pytest.fixture(scope="module")
def sharded_results():
  return helpers.run_on_8_devices("tests.scripts.sampler_sharded")


@pytest.mark.parametrize("shape", SHAPES + RESIDENT)
def test_sharded_greedy_equals_single_device(sharded_results, shape):
  r = sharded_results[shape]
  assert r["greedy_tokens_equal"] and r["greedy_mask_equal"]
  assert r["greedy_logp_max_diff"] <= 1e-5


def test_sharded_sampling_equals_single_device(sharded_results):
  # Each sequence has its own key stream, so the layout cannot change the draws;
  # (2, 2, 2) also splits the vocabulary over `tensor`.
  for shape in [
      (2, 2, 2),
      (2, 2, 2, "resident"),
      (2, 2, 2, "resident", "pallas"),
  ]:
    r = sharded_results[shape]
    assert r["sampled_tokens_equal"] and r["sampled_mask_equal"]
    assert r["sampled_logp_max_diff"] <= 1e-5


def test_kv_cache_is_sharded_over_slots(sharded_results):
  # One layer's keys [N=8, K=2, E=16, S=128]: slots over data x fsdp,
  # kv heads over tensor.
  assert sharded_results[(1, 8, 1)]["cache_shard_shape"] == [1, 2, 16, 128]
  assert sharded_results[(2, 2, 2)]["cache_shard_shape"] == [2, 1, 16, 128]


def test_slot_sharded_decode_loop_synchronises_once_per_step(sharded_results):
  # Slots over `data` with replicated weights: each device decodes its own
  # slots, and the loop's only collective is its stopping test (one reduction
  # over the slots per step). Writing the cache with a scatter indexed by
  # global slot numbers made XLA all-gather the indices in every layer.
  for window in ("0", "64"):
    assert sharded_results[(8, 1, 1)]["advance_collectives"][window] == {
        "all-reduce": 1
    }


def test_prefill_of_every_slot_in_order_needs_no_collective(sharded_results):
  # generate fills slots 0..N-1 in order: each device prefills its own slots.
  # Slots in another order must move rows between devices.
  got = sharded_results[(8, 1, 1)]["start_collectives"]
  assert got["in_order"] == 0
  assert got["reversed"] > 0


def test_resident_weights_are_whole_but_for_tensor(sharded_results):
  # tiny's regrouped q, k, v kernel [D=64, K x J x E = 2 x 4 x 16]: sharded,
  # D is split over fsdp; resident, each chip holds all of it but the kv
  # heads' split over tensor.
  assert sharded_results[(1, 8, 1)]["qkv_shape"] == [64, 128]
  assert sharded_results[(1, 8, 1)]["qkv_shard_shape"] == [8, 128]
  assert sharded_results[(1, 8, 1, "resident")]["qkv_shard_shape"] == [64, 128]
  assert sharded_results[(2, 2, 2, "resident")]["qkv_shard_shape"] == [64, 64]


def test_resident_weights_decode_without_gathering_them(sharded_results):
  # Over fsdp the sharded layout gathers the weights inside the decode loop;
  # resident, the loop's only collective is its stopping test, as with slots
  # over `data` alone.
  sharded = sharded_results[(1, 8, 1)]["advance_collectives"]
  resident = sharded_results[(1, 8, 1, "resident")]["advance_collectives"]
  for window in ("0", "64"):
    assert sharded[window].get("all-gather", 0) > 0
    assert resident[window] == {"all-reduce": 1}
  assert (
      sharded_results[(1, 8, 1, "resident")]["start_collectives"]["in_order"]
      == 0
  )
