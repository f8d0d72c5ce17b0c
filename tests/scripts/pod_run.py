"""One process of tests/pod_faults_test.py's resume test: a 2-process RL run.

  python -m tests.scripts.pod_run --workdir=W --process_id=0 \
      --coordinator=localhost:PORT --export=E

trains `make_config()` in `W` (resuming from its newest checkpoint), then
exports the final checkpoint to `E` (process 0 alone writes there).
"""

import argparse

from scalerl_jax.checkpoint import policy
from scalerl_jax import trainer as trainer_lib
from tests import helpers

NUM_STEPS = 4
PEER_TIMEOUT_S = 5.0


def make_config(process_id: int, coordinator: str):
  """helpers.rl_test_config over 2 processes of one device each (data = 2),
  checkpointed every step."""
  config = helpers.rl_test_config("pipeline_rl", num_steps=NUM_STEPS)
  config.trainer.checkpoint_every = 1
  m = config.mesh
  m.shape = (2, 1, 1)
  m.distributed, m.coordinator_address = True, coordinator
  m.num_processes, m.process_id = 2, process_id
  m.peer_timeout_s = PEER_TIMEOUT_S
  return config


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--workdir", required=True)
  parser.add_argument("--process_id", type=int, required=True)
  parser.add_argument("--coordinator", required=True)
  parser.add_argument("--export", required=True)
  args = parser.parse_args()
  trainer_lib.train_and_evaluate(
      make_config(args.process_id, args.coordinator), args.workdir
  )
  policy.export_checkpoint(
      args.workdir, args.export, process_id=args.process_id
  )


if __name__ == "__main__":
  main()
