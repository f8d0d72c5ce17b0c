"""Compiles qwen3_0.6b's `prepare` for tpu7x:4x4x4 with XLA dumps.

    python docs/runs/tpu/2026-11-28_prepare_cast/dump_prepare.py DIR [BUDGET]

DIR receives the dumps (the program after the SPMD partitioner, the final
program, its buffer assignment and memory-usage report); BUDGET, bytes,
holds the program within that much HBM (`sharding.hbm_budget_options`).
"""

import os
import sys

from configs import scalerl
from scalerl_jax import sharding
from scalerl_jax.jobs.planner import topology as topology_lib
from scalerl_jax.jobs.planner.aot_programs import build_programs


def main():
  out = sys.argv[1]
  config = scalerl.get_config("variant=qwen3_0.6b")
  config.trainer.microbatches = 6
  devices, _ = topology_lib.slice_devices("tpu7x:4x4x4")
  mesh = sharding.make_mesh(config.mesh, devices)
  rules = sharding.logical_rules(config.mesh)
  lowered = build_programs(config, mesh, rules).lower["prepare"]()
  options = {"xla_dump_to": out, "xla_dump_hlo_pass_re": "spmd-partitioning"}
  if len(sys.argv) > 2:
    options |= sharding.hbm_budget_options("tpu", float(sys.argv[2]))
  compiled = lowered.compile(options)
  print(compiled.memory_analysis())
  with open(os.path.join(out, "final.txt"), "w") as f:
    f.write(compiled.as_text())


if __name__ == "__main__":
  main()
