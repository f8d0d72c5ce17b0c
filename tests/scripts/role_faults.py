"""One life of a disaggregated run (one device a role) with a fault, for
tests/disaggregated_faults_test.py, which sets
XLA_FLAGS=--xla_force_host_platform_device_count=2 before JAX starts.

Usage: python -m tests.scripts.role_faults MODE WORKDIR [FAULT]. MODE is
`fixed` (`disaggregated_runs.config`: swapped in at decode step 16, so each
move comes with sequences in flight) or `free` (`free_running_runs.config`);
both checkpoint every step. buffer.role_stall_timeout_s is `STALL_TIMEOUT_S`
in the free mode, and in the fixed mode where FAULT is a stall (elsewhere
the default, which the test's SIGKILL comes well before). FAULT, one of:
  * `moving_at=V` / `moving_nth=N`: the move of version V / the life's N-th
    move puts half the leaves (tests/scripts/move_hooks.py), writes
    `MOVING` in the workdir and waits there, for the test to SIGKILL it;
  * `generator_stalls`: once the trainer has taken `STALL_AFTER_TAKES`
    batches, the generator's next decode call never returns (fixed mode:
    the next step's first call decoding ahead);
  * `trainer_stalls`: the trainer's `STALL_AFTER_TAKES`-th train step never
    returns.
A stall blocks its thread for good, as a hung device call would; the run's
watchdog (rl/role_watchdog.py) is what ends the life. Logs at INFO (the
checkpoint a life resumes from), and, as the life ends, the threads of
ours still alive: `threads left: [...]`.
"""

import json
import os
import sys
import threading

from absl import logging

from scalerl_jax import trainer as trainer_lib
from scalerl_jax.rl import free_running
from scalerl_jax.rl import generation
from scalerl_jax.rl import slot_runner
from tests.scripts import disaggregated_runs
from tests.scripts import free_running_runs
from tests.scripts import move_hooks

MOVING = "MOVING"
STALL_TIMEOUT_S = 20.0
STALL_AFTER_TAKES = 2
NUM_STEPS = {"fixed": 6, "free": 7}


STALLS = ("generator_stalls", "trainer_stalls")


def config(mode, fault="none"):
  num_steps = NUM_STEPS[mode]
  if mode == "fixed":
    c = disaggregated_runs.config(num_steps, sync_at=16)
  else:
    c = free_running_runs.config(num_steps)
  if mode == "free" or fault in STALLS:
    c.buffer.role_stall_timeout_s = STALL_TIMEOUT_S
  c.trainer.checkpoint_every = 1
  return c


def _stall_forever():
  threading.Event().wait()


def _mark_moving(workdir, version=None, nth=None):
  """`at_half` of `move_hooks.split_move`: at the move asked for, writes
  the marker and waits for the kill."""

  def at_half(moving, n):
    if moving == version or n == nth:
      open(os.path.join(workdir, MOVING), "w").close()
      _stall_forever()

  return at_half


def _stall_after_takes(cls, method, when):
  """`cls.method`, stalling for good where `when(takes)` holds, takes being
  the batches the trainer has taken so far."""
  original = getattr(cls, method)

  def stalling(*args, **kwargs):
    if when(_TAKES[0]):
      _stall_forever()
    return original(*args, **kwargs)

  setattr(cls, method, stalling)


_TAKES = [0]


def _count_takes(mode):
  """Counts the trainer's takes: from the free generator (whose take is
  `Generation.take` inside) or, fixed, from `Generation`."""
  cls = free_running.FreeGenerator if mode == "free" else generation.Generation
  take = cls.take

  def counted(self, version):
    groups = take(self, version)
    _TAKES[0] += 1
    return groups

  cls.take = counted


def main(mode, workdir, fault="none"):
  kind, _, value = fault.partition("=")
  if kind == "moving_at":
    move_hooks.split_move(_mark_moving(workdir, version=int(value)))
  elif kind == "moving_nth":
    move_hooks.split_move(_mark_moving(workdir, nth=int(value)))
  elif kind in STALLS:
    _count_takes(mode)
    if kind == "generator_stalls":
      _stall_after_takes(
          slot_runner.SlotRunner,
          "dispatch",
          lambda takes: takes >= STALL_AFTER_TAKES,
      )
    else:
      _stall_after_takes(
          trainer_lib.Trainer,
          "train",
          lambda takes: takes == STALL_AFTER_TAKES,
      )
  logging.set_verbosity(logging.INFO)
  try:
    trainer_lib.train_and_evaluate(config(mode, fault), workdir)
  finally:
    ours = ("free-generator", "busy-clock", "step-watch")
    left = [t.name for t in threading.enumerate() if t.name.startswith(ours)]
    print(f"threads left: {json.dumps(sorted(left))}", flush=True)


if __name__ == "__main__":
  main(*sys.argv[1:])
