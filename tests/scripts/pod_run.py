"""One process of tests/pod_faults_test.py's resume test: a 2-process RL run.

  python -m tests.scripts.pod_run --workdir=W --process_id=0 \
      --coordinator=localhost:PORT --export=E [--kill_at_seal=N]

trains `make_config()` in `W` (resuming from its newest checkpoint), then
exports the final checkpoint to `E` (process 0 alone writes there). With
`--kill_at_seal=N`, process 0 SIGKILLs itself in its N-th checkpoint save,
the moment every process has written and the manifest is due: orbax's
temporary directory then holds the whole state, and nothing marks it whole.
"""

import argparse
import os
import signal

from scalerl_jax import trainer as trainer_lib
from scalerl_jax.checkpoint import integrity
from scalerl_jax.checkpoint import policy
from tests import helpers

NUM_STEPS = 6
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


def _kill_at_seal(n: int) -> None:
  """SIGKILLs this process when it is to write its `n`-th manifest."""
  write_manifest, seals = integrity.write_manifest, []

  def wrapped(step_dir):
    seals.append(step_dir)
    if len(seals) == n:
      os.kill(os.getpid(), signal.SIGKILL)
    write_manifest(step_dir)

  integrity.write_manifest = wrapped


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--workdir", required=True)
  parser.add_argument("--process_id", type=int, required=True)
  parser.add_argument("--coordinator", required=True)
  parser.add_argument("--export", required=True)
  parser.add_argument("--kill_at_seal", type=int, default=0)
  args = parser.parse_args()
  if args.kill_at_seal:
    _kill_at_seal(args.kill_at_seal)
  trainer_lib.train_and_evaluate(
      make_config(args.process_id, args.coordinator), args.workdir
  )
  policy.export_checkpoint(
      args.workdir, args.export, process_id=args.process_id
  )


if __name__ == "__main__":
  main()
