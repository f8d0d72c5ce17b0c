"""Sharded == unsharded, on 8 simulated CPU devices (in a subprocess)."""

import pytest

from scalerl_jax import sharding
from tests import helpers


@pytest.fixture(scope="module")
def sharded_results():
  return helpers.run_on_8_devices("tests.scripts.sharded_forward")


@pytest.mark.slow(seconds=10)  # An 8-device subprocess.
@pytest.mark.parametrize("shape", [(8, 1, 1), (2, 2, 2), (1, 1, 8)])
def test_sharded_logits_match_single_device(sharded_results, shape):
  r = sharded_results[shape]
  print(shape, r["max_abs_diff"])
  assert r["same_init"]
  assert r["max_abs_diff"] <= 1e-5


def test_parameters_are_really_sharded(sharded_results):
  # q kernel [L=2, D=64, H=16, E=8]: embed over fsdp, heads over tensor.
  # replicated
  assert sharded_results[(8, 1, 1)]["q_shard_shape"] == [2, 64, 16, 8]
  assert sharded_results[(2, 2, 2)]["q_shard_shape"] == [2, 32, 8, 8]
  assert sharded_results[(1, 1, 8)]["q_shard_shape"] == [2, 64, 2, 8]
  assert sharded_results[(1, 1, 8)]["q_spec"] == [
      "None",
      "fsdp",
      "tensor",
      "None",
  ]
  # embedding [V=128, D=64]: vocab over tensor, embed over fsdp.
  assert sharded_results[(2, 2, 2)]["embedding_shard_shape"] == [64, 32]
  # The batch of 8 rows splits over data x fsdp.
  assert [
      sharded_results[s]["batch_shard_rows"]
      for s in [(8, 1, 1), (2, 2, 2), (1, 1, 8)]
  ] == [1, 2, 8]
  divisors = [
      sharded_results[s]["batch_divisor"]
      for s in [(8, 1, 1), (2, 2, 2), (1, 1, 8)]
  ]
  assert divisors == [8, 4, 1]
  assert all(r["num_devices_holding_q"] == 8 for r in sharded_results.values())


def test_resolve_mesh_shape():
  assert sharding.resolve_mesh_shape((1, -1, 1), 8) == (1, 8, 1)
  assert sharding.resolve_mesh_shape((2, -1, 2), 8) == (2, 2, 2)
  with pytest.raises(ValueError, match="mesh.shape"):
    sharding.resolve_mesh_shape((3, -1, 1), 8)
  with pytest.raises(ValueError, match="mesh.shape"):
    sharding.resolve_mesh_shape((2, 2, 1), 8)


def test_without_axes_drops_mesh_axes_from_a_rule_target():
  assert sharding.without_axes(("data", "fsdp"), ("fsdp",)) == "data"
  assert sharding.without_axes(("data", "fsdp", "tensor"), ("fsdp",)) == (
      "data",
      "tensor",
  )
  assert sharding.without_axes("fsdp", ("data", "fsdp")) is None
  assert sharding.without_axes("tensor", ("fsdp",)) == "tensor"
  assert sharding.without_axes(None, ("fsdp",)) is None


def test_resident_sampler_rules_drop_the_batch_axes_from_weights_only():
  rules = (
      ("act_batch", ("data", "fsdp")),
      ("embed", "fsdp"),
      ("mlp", ("fsdp", "tensor")),
      ("heads", "tensor"),
  )
  resident = (
      ("act_batch", ("data", "fsdp")),
      ("embed", None),
      ("mlp", "tensor"),
      ("heads", "tensor"),
  )
  assert sharding.sampler_rules(rules, "resident") == resident
  assert sharding.sampler_rules(resident, "resident") == resident
  assert sharding.sampler_rules(rules, "sharded") is rules
