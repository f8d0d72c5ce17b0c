"""One process of tests/pod_faults_test.py's detection test: joins a run of
`--num_processes` through `runtime.maybe_initialize_distributed` (so with
its peer watchdog), prints `ready`, then all-gathers a counter with the
others until killed.

  python -m tests.scripts.peer_loop --process_id=0 --num_processes=2 \
      --coordinator=localhost:PORT --peer_timeout_s=4
"""

import argparse
import time

from jax.experimental import multihost_utils
import numpy as np

from configs import scalerl
from scalerl_jax.multihost import runtime


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--process_id", type=int, required=True)
  parser.add_argument("--num_processes", type=int, required=True)
  parser.add_argument("--coordinator", required=True)
  parser.add_argument("--peer_timeout_s", type=float, required=True)
  args = parser.parse_args()
  mesh = scalerl.get_config("variant=tiny_cpu").mesh
  mesh.distributed, mesh.coordinator_address = True, args.coordinator
  mesh.num_processes, mesh.process_id = args.num_processes, args.process_id
  mesh.peer_timeout_s = args.peer_timeout_s
  runtime.maybe_initialize_distributed(mesh)
  print("ready", flush=True)
  step = 0
  while True:
    multihost_utils.process_allgather(np.array([step]))
    step += 1
    time.sleep(0.05)


if __name__ == "__main__":
  main()
