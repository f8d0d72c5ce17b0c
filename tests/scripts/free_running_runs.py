"""Runs of `helpers.rl_test_config` with buffer.sync_mode='free' on 2
simulated devices (one a role), for tests/free_running_test.py, which sets
XLA_FLAGS=--xla_force_host_platform_device_count=2 before JAX starts.

Usage: python -m tests.scripts.free_running_runs BASE_DIR OUT_DIR. Each run
copies BASE_DIR (the warm-started base) into OUT_DIR/<name> and trains there:
`free` (6 steps straight; decode calls with weights of an odd version are
slowed by 50 ms, so that the generator is the slower side at some steps
and the faster at others, as timing would have it on another machine),
`free_split` (3 steps, then resumed to 6),
`generator_fails` (the generator's 6th harvest raises), `trainer_fails`
(the train step of step 2 raises) and `move_split` (every decode call
slowed by 50 ms; each move of the weights puts the leaves one at a time,
200 ms apart halfway, and the move of version `MOVE_FAILS_AT` raises
halfway: tests/scripts/move_hooks.py).
Prints one JSON line: for each run, every token version of every group the
trainer took (as the step, the smallest and largest version, and how many
tokens had none), the generator's swaps, the error it ended with, and the
threads left alive after it; for `move_split`, which version's weights
each regroup and each decode call had (`move_hooks.WeightRecord`) and how
many decode calls each move saw dispatched while it was halfway.
"""

import json
import os
import shutil
import sys
import threading
import time

from scalerl_jax import experiment
from scalerl_jax import trainer as trainer_lib
from scalerl_jax.rl import free_running
from scalerl_jax.rl import slot_runner
from scalerl_jax.rl import weight_sync
from scalerl_jax.sampling import sampler as sampler_lib
from tests import helpers
from tests.scripts import move_hooks

_RECORD = {"batches": [], "swaps": []}
MOVE_FAILS_AT = 4  # The version whose move fails halfway in `move_split`.


def config(num_steps):
  """`helpers.rl_test_config`, disaggregated 1 + 1, free-running, in decode
  calls of 4 steps (swaps may come at 12 points of a completion)."""
  c = helpers.rl_test_config("pipeline_rl", num_steps=num_steps)
  c.mesh.layout, c.mesh.generator_devices = "disaggregated", 1
  c.buffer.sync_mode = "free"
  c.sampling.decode_steps_per_call = 4
  return c


def _recording_take(take):
  def recorded(self, version):
    groups = take(self, version)
    for g in groups:
      v = g.completions.version[g.completions.mask]
      _RECORD["batches"].append(
          {
              "step": version,
              "min": int(v.min()),
              "max": int(v.max()),
              "untagged": int((v < 0).sum()),
          }
      )
    return groups

  return recorded


def _recording_stop(stop):
  def recorded(self):
    stop(self)
    _RECORD["swaps"] += [list(s) for s in self.swaps]

  return recorded


def _slowed(dispatch, when=lambda version: version % 2):
  """`SlotRunner.dispatch`, 50 ms slower with weights of a version `when`
  holds for (by default, an odd one)."""

  def slowed(self, params, version, num_steps):
    if when(version):
      time.sleep(0.05)
    return dispatch(self, params, version, num_steps)

  return slowed


def _failing(method, at, message):
  """`method`, raising RuntimeError(message) on its `at`-th call."""
  calls = [0]

  def failing(*args, **kwargs):
    calls[0] += 1
    if calls[0] == at:
      raise RuntimeError(message)
    return method(*args, **kwargs)

  return failing


def _move_split(base_dir, out_dir):
  """The `move_split` run (every decode call 50 ms slower, so that the
  generator has work when moves come), with what its weights
  were at each decode call and the decode calls dispatched while a move was
  halfway; patches undone after."""
  patched = [
      (experiment.Experiment, "to_generator"),
      (weight_sync.WeightSync, "get"),
      (sampler_lib.Sampler, "prepare"),
      (slot_runner.SlotRunner, "dispatch"),
  ]
  originals = [getattr(cls, name) for cls, name in patched]
  slot_runner.SlotRunner.dispatch = _slowed(originals[-1], lambda _: True)
  record = move_hooks.WeightRecord()
  halfway = []  # Decode calls dispatched while each move was halfway.

  def delayed_or_failing(version, n):
    del n
    if version == MOVE_FAILS_AT:
      raise RuntimeError("injected failure halfway through a move")
    before = len(record.dispatches)
    time.sleep(0.2)
    halfway.append(len(record.dispatches) - before)

  move_hooks.split_move(delayed_or_failing)
  try:
    out = _run(_copy(base_dir, out_dir, "move_split"), [6])
  finally:
    for (cls, name), original in zip(patched, originals):
      setattr(cls, name, original)
  out["prepares"], out["dispatches"] = record.prepares, record.dispatches
  out["halfway"] = halfway
  return out


def _run(workdir, legs):
  """Trains `legs` (step counts) in `workdir`; what it recorded."""
  _RECORD["batches"], _RECORD["swaps"] = [], []
  out = {"error": None}
  try:
    for num_steps in legs:
      trainer_lib.train_and_evaluate(config(num_steps), workdir)
  except Exception as e:  # pylint: disable=broad-except
    out["error"] = {
        "type": type(e).__name__,
        "message": str(e),
        "notes": list(getattr(e, "__notes__", [])),
    }
  out.update(_RECORD)
  out["threads"] = sorted(
      t.name
      for t in threading.enumerate()
      if t.name.startswith(("free-generator", "busy-clock"))
  )
  out["done"] = os.path.exists(os.path.join(workdir, "DONE"))
  return out


def _copy(base_dir, out_dir, name):
  """OUT_DIR/<name>, a copy of BASE_DIR."""
  workdir = os.path.join(out_dir, name)
  shutil.copytree(base_dir, workdir)
  return workdir


def main(base_dir, out_dir):
  free_running.FreeGenerator.take = _recording_take(
      free_running.FreeGenerator.take
  )
  free_running.FreeGenerator.stop = _recording_stop(
      free_running.FreeGenerator.stop
  )
  out = {}
  dispatch = slot_runner.SlotRunner.dispatch
  slot_runner.SlotRunner.dispatch = _slowed(dispatch)
  out["free"] = _run(_copy(base_dir, out_dir, "free"), [6])
  slot_runner.SlotRunner.dispatch = dispatch
  out["free_split"] = _run(_copy(base_dir, out_dir, "free_split"), [3, 6])
  failures = {  # Run -> (class, method, failing call, message).
      "generator_fails": (slot_runner.SlotRunner, "harvest", 6, "harvest"),
      "trainer_fails": (trainer_lib.Trainer, "train", 3, "train step"),
  }
  for name, (cls, method, at, what) in failures.items():
    original = getattr(cls, method)
    setattr(cls, method, _failing(original, at, f"injected {what}"))
    out[name] = _run(_copy(base_dir, out_dir, name), [6])
    setattr(cls, method, original)
  out["move_split"] = _move_split(base_dir, out_dir)
  print(json.dumps(out))


if __name__ == "__main__":
  main(*sys.argv[1:])
