"""Runs of `helpers.rl_test_config` with mesh.layout='disaggregated' on 2
simulated devices (one a role), for tests/disaggregated_test.py, which sets
XLA_FLAGS=--xla_force_host_platform_device_count=2 before JAX starts.

Usage: python -m tests.scripts.disaggregated_runs BASE_DIR OUT_DIR. Each run
copies BASE_DIR (the warm-started base) into OUT_DIR/<name> and trains there:
`sync0` (the weights swapped in before each step's first decode step), `ahead`
(after 16 steps: one decode call under the previous weights while the train
step computes) straight for 4 steps, `ahead_split` (2 steps, then resumed
to 4), and `bf16_float32` / `bf16_bfloat16` (model.compute_dtype='bfloat16'
from the same float32 base, the weights sent in mesh.transfer_dtype, 2
steps). Prints one JSON line: each role's devices as the trainer placed its
state and the sampler its slots, and each run's final parameters' file.
"""

import json
import os
import shutil
import sys

import jax
import numpy as np

from scalerl_jax import trainer as trainer_lib
from tests import helpers


def config(num_steps, sync_at, transfer_dtype=None):
  """`helpers.rl_test_config`, disaggregated 1 + 1, swapping at `sync_at`;
  with `transfer_dtype`, computing in bfloat16 and sending the weights in
  it (the base stays the float32 one: trainer.warm_start_float32)."""
  c = helpers.rl_test_config("pipeline_rl", num_steps=num_steps)
  c.mesh.layout, c.mesh.generator_devices = "disaggregated", 1
  c.buffer.sync_at_decode_step = sync_at
  if transfer_dtype:
    c.model.compute_dtype, c.trainer.warm_start_float32 = "bfloat16", True
    c.mesh.transfer_dtype = transfer_dtype
  return c


def devices_of(tree):
  """Ids of the devices holding `tree`'s arrays."""
  return sorted(
      {d.id for x in jax.tree.leaves(tree) for d in x.sharding.device_set}
  )


def main(base_dir, out_dir):
  runs = {
      "sync0": [(4, 0)],
      "ahead": [(4, 16)],
      "ahead_split": [(2, 16), (4, 16)],
      "bf16_float32": [(2, 0, "float32")],
      "bf16_bfloat16": [(2, 0, "bfloat16")],
  }
  out = {"params": {}}
  for name, legs in runs.items():
    workdir = os.path.join(out_dir, name)
    shutil.copytree(base_dir, workdir)
    for leg in legs:
      trainer_lib.train_and_evaluate(config(*leg), workdir)
    trainer = trainer_lib.Trainer(config(*legs[-1]), workdir)
    try:
      out["trainer_devices"] = devices_of(trainer.state)
      out["generator_devices"] = devices_of(
          trainer.generation.slot_runner.slots
      )
      path = os.path.join(out_dir, f"{name}_params.npz")
      leaves = jax.tree.leaves(jax.device_get(trainer.state.params))
      np.savez(path, *leaves)
      out["params"][name] = path
    finally:
      trainer.close()
  print(json.dumps(out))


if __name__ == "__main__":
  main(*sys.argv[1:])
