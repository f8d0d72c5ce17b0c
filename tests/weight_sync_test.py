"""scalerl_jax.jobs.planner.weight_sync: the path `jax.device_put` takes
between the roles' devices, as `weight_sync` tells it (the bytes and the
roofline: tests/aot_roles_test.py)."""

import json

import pytest

from tests import helpers


@pytest.mark.slow(seconds=20)  # A subprocess on 8 simulated devices.
def test_shard_to_shard_is_the_device_to_device_path():
  # Where the roles lay the parameters out alike (4 + 4), jax.device_put
  # copies each shard device to device; where not (4 + 2), it goes through
  # the host, which `weight_sync` must say, as its roofline does not hold.
  rows = [
      json.loads(line)
      for line in helpers.run_on_devices(
          "tests.scripts.weight_sync_paths", 8
      ).splitlines()
  ]
  assert rows == [
      {
          "trainer_devices": 4,
          "generator_devices": 4,
          "device_to_device": True,
          "shard_to_shard": True,
      },
      {
          "trainer_devices": 4,
          "generator_devices": 2,
          "device_to_device": False,
          "shard_to_shard": False,
      },
  ]
