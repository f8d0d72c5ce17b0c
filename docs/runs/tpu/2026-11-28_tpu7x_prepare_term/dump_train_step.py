"""Compiles qwen3_0.6b's train step for tpu7x:4x4x4 within BUDGET bytes.

    python docs/runs/tpu/2026-11-28_tpu7x_prepare_term/dump_train_step.py \
        BUDGET [DIR]

Prints every field of `compiled.memory_analysis()` but the serialized
buffer assignment, or the first line of the compiler's refusal. DIR, if
given, receives the XLA dumps (the final program, its buffer assignment and
memory-usage report) and the printed fields as memory_analysis.json.
"""

import json
import os
import sys
import time

from configs import scalerl
from scalerl_jax import sharding
from scalerl_jax.jobs.planner import topology as topology_lib
from scalerl_jax.jobs.planner.aot_programs import build_programs


def main():
  config = scalerl.get_config("variant=qwen3_0.6b")
  config.trainer.microbatches = 6
  devices, _ = topology_lib.slice_devices("tpu7x:4x4x4")
  mesh = sharding.make_mesh(config.mesh, devices)
  rules = sharding.logical_rules(config.mesh)
  lowered = build_programs(config, mesh, rules).lower["train_step"]()
  options = sharding.hbm_budget_options("tpu", float(sys.argv[1]))
  out = sys.argv[2] if len(sys.argv) > 2 else None
  if out:
    options |= {"xla_dump_to": out, "xla_dump_hlo_as_text": True}
  fields = {"options": options}
  start = time.perf_counter()
  try:
    compiled = lowered.compile(options)
  except Exception as e:  # pylint: disable=broad-except
    fields["refused"] = str(e).splitlines()[0]
  else:
    m = compiled.memory_analysis()
    fields |= {
        k: getattr(m, k)
        for k in dir(m)
        if k.endswith("bytes") or k == "indefinite_allocations"
    }
  fields["compile_s"] = time.perf_counter() - start
  text = json.dumps(fields, indent=1)
  print(text)
  if out:
    with open(os.path.join(out, "memory_analysis.json"), "w") as f:
      f.write(text)


if __name__ == "__main__":
  main()
