"""Runs `launch.compile`, also printing both readings of each compile's HBM.

    D=docs/runs/tpu/2026-11-28_libtpu_0.0.50.1_train_steps
    python $D/both_readings.py --config=... --topology=... \
        [launch.compile's flags]

For every program that compiles (the first compile and `--check_planner`'s
search) prints one line `readings: {...}`: `memory_analysis()`'s
`temp_size_in_bytes` and `total_allocation_bytes`, and the temporaries
`aot_least.hbm_memory` reads from them, so that the fragmentation libtpu
counts twice is told apart from what the libtpu version moved.
"""

import json

from absl import app

from launch import compile as compile_launch
from scalerl_jax.jobs.planner import aot_least

_hbm_memory = aot_least.hbm_memory


def _hbm_memory_printed(stats, platform):
  memory = _hbm_memory(stats, platform)
  fields = {
      "temp_size_in_bytes": int(stats.temp_size_in_bytes),
      "total_allocation_bytes": int(stats.total_allocation_bytes),
      "hbm_temporaries": memory.temporaries,
      "hbm_peak": memory.peak,
  }
  print("readings:", json.dumps(fields), flush=True)
  return memory


if __name__ == "__main__":
  aot_least.hbm_memory = _hbm_memory_printed
  app.run(compile_launch.main)
