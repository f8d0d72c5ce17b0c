"""Runs of `helpers.rl_test_config` on a pool that No-Positive-Resampling
retires within the run (4 prompts, a prompt retired by its first correct
completion), for tests/disaggregated_test.py on 2 simulated devices:
`colocated` and `ahead` (mesh.layout='disaggregated', the next step's first
decode call under the previous weights: buffer.sync_at_decode_step=16).

Usage: python -m tests.scripts.retire_runs BASE_DIR OUT_DIR. Prints one JSON
line: for each run, the steps its metrics.jsonl holds, whether DONE was
written, and, restored from its last checkpoint, the step the trainer
resumes at, the train state's own step count and the counters.
"""

import json
import os
import shutil
import sys

from scalerl_jax import trainer as trainer_lib
from tests import helpers

NUM_STEPS = 40


def config(sync_at):
  c = helpers.rl_test_config("pipeline_rl", num_steps=NUM_STEPS)
  c.data.builtin_num_train = 4
  c.curriculum.retire_threshold = 0.01
  c.trainer.eval_every = 1000  # Step 0's validation only.
  if sync_at:
    c.mesh.layout, c.mesh.generator_devices = "disaggregated", 1
    c.buffer.sync_at_decode_step = sync_at
  return c


def main(base_dir, out_dir):
  out = {}
  for name, sync_at in (("colocated", 0), ("ahead", 16)):
    workdir = os.path.join(out_dir, name)
    shutil.copytree(base_dir, workdir)
    trainer_lib.train_and_evaluate(config(sync_at), workdir)
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
      steps = [json.loads(line)["step"] for line in f]
    trainer = trainer_lib.Trainer(config(sync_at), workdir)
    try:
      out[name] = {
          "metric_steps": steps,
          "done": os.path.exists(os.path.join(workdir, "DONE")),
          "restored_step": trainer.step,
          "state_step": int(trainer.state.step),
          "counters": trainer.counters,
          "curriculum": trainer.generation.curriculum.metrics(),
      }
    finally:
      trainer.close()
  print(json.dumps(out))


if __name__ == "__main__":
  main(*sys.argv[1:])
