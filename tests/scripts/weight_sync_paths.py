"""The weight sync's path through the runtime, on 8 simulated devices.

For two splits of the devices between the roles, 4 + 4 (alike: shard for
shard) and 4 + 2 (6 of the 8 devices: the generator's shards twice the
trainer's), moves tiny_cpu's parameters from the trainer's shardings into the
generator's as `Experiment.to_generator` does (`jax.device_put`), with
host-to-device copies refused, and prints one JSON line: whether the move
went device to device, and whether `weight_sync` says it would. Used by
tests/weight_sync_test.py, which sets
XLA_FLAGS=--xla_force_host_platform_device_count=8 before JAX starts.
"""

import json

import jax

from configs import scalerl
from scalerl_jax import sharding
from scalerl_jax.jobs.planner import accelerators
from scalerl_jax.jobs.planner import weight_sync
from scalerl_jax.rl import step_parts


def main():
  for num_devices, generator_devices in ((8, 4), (6, 2)):
    config = scalerl.get_config("tiny_cpu")
    config.mesh.layout = "disaggregated"
    config.mesh.generator_devices = generator_devices
    rules = sharding.logical_rules(config.mesh)
    trainer, generator = (
        sharding.make_mesh(config.mesh, d)
        for d in sharding.role_devices(config.mesh, jax.devices()[:num_devices])
    )
    parts = step_parts.build(config, trainer, rules, rng=jax.random.key(0))
    targets = sharding.param_shardings(parts.model, generator, rules)
    sync = weight_sync.weight_sync(
        parts.params, targets, accelerators.ACCELERATORS["tpu_v5e"]
    )
    try:
      with jax.transfer_guard_host_to_device("disallow_explicit"):
        jax.block_until_ready(jax.device_put(parts.params, targets))
      device_to_device = True
    except Exception as e:  # pylint: disable=broad-except
      if "host-to-device" not in str(e):
        raise
      device_to_device = False
    print(
        json.dumps(
            {
                "trainer_devices": trainer.size,
                "generator_devices": generator.size,
                "device_to_device": device_to_device,
                "shard_to_shard": sync.shard_to_shard,
            }
        )
    )


if __name__ == "__main__":
  main()
