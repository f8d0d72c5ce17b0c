"""Lives of a run: processes started one after another on one workdir, each
SIGKILLed at a planned moment or let finish (tests/sigkill_resume_test.py,
tests/disaggregated_faults_test.py).

A life is `python -m <module> <args>` run from the repository with JAX on
CPU, its output appended to a log. `Trigger` decides, polled every
millisecond, when to kill it:
  * "after_step0_validation": step 0's metrics line is written and no
    checkpoint begun;
  * "checkpoint_write": the n-th checkpoint write of the life has created
    orbax's temporary directory;
  * "time": a delay (s) after the life's first new metrics line;
  * "file": a file of that name is in the workdir (a test hook's marker:
    the life has reached the moment and waits there).
"""

import os
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import orbax.checkpoint as ocp

from scalerl_jax.checkpoint import checkpointer as checkpoint_lib
from scalerl_jax.metrics import rows

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TMP_MARK = ".orbax-checkpoint-tmp"
LIFE_TIMEOUT_S = 900.0
_POLL_S = 0.001


def metric_steps(workdir):
  """The steps of the workdir's whole metrics lines, in order; a line being
  written is not one yet (metrics/rows.py reads a live file), any other
  unusable line fails."""
  if not os.path.exists(rows.path_of(workdir)):
    return []
  steps = []
  for where, row in rows.lines(workdir):
    if row == rows.INCOMPLETE:
      continue
    assert isinstance(row, dict), f"{where}: {row}"
    steps.append(row["step"])
  return steps


def _checkpoint_entries(workdir):
  directory = os.path.join(workdir, "checkpoints")
  return set(os.listdir(directory)) if os.path.isdir(directory) else set()


def tmp_dirs(workdir):
  """orbax's temporary directories: checkpoint writes begun, not sealed."""
  return {name for name in _checkpoint_entries(workdir) if TMP_MARK in name}


class Trigger:
  """Decides, polled every millisecond, when one life is to be killed."""

  def __init__(self, workdir, kind, parameter):
    self.workdir, self.kind, self.parameter = workdir, kind, parameter
    self.lines_at_start = len(metric_steps(workdir))
    self.tmp_at_start = tmp_dirs(workdir)
    self.writes_seen: set[str] = set()
    self.deadline = None

  def due(self):
    if self.kind == "after_step0_validation":
      return metric_steps(self.workdir) == [0] and not any(
          e.isdigit() or TMP_MARK in e
          for e in _checkpoint_entries(self.workdir)
      )
    if self.kind == "checkpoint_write":
      self.writes_seen |= tmp_dirs(self.workdir) - self.tmp_at_start
      return len(self.writes_seen) >= self.parameter
    if self.kind == "file":
      return os.path.exists(os.path.join(self.workdir, self.parameter))
    if self.deadline is None:
      if len(metric_steps(self.workdir)) > self.lines_at_start:
        self.deadline = time.monotonic() + self.parameter
      return False
    return time.monotonic() >= self.deadline


def start(argv, log, env=None):
  """`python -m <argv>`, its output to `log`; `env` added to the session's."""
  env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu", **(env or {}))
  return subprocess.Popen(
      [sys.executable, "-m", *argv],
      cwd=ROOT,
      env=env,
      stdout=log,
      stderr=subprocess.STDOUT,
  )


def tail(log_path):
  with open(log_path) as f:
    return f.read()[-3000:]


def finish(argv, log_path, env=None, status=0):
  """Runs a life to its end; fails unless it exits with `status`."""
  with open(log_path, "a") as log:
    process = start(argv, log, env)
    assert process.wait(timeout=LIFE_TIMEOUT_S) == status, tail(log_path)


def kill_once(argv, workdir, log_path, kind, parameter, env=None):
  """Starts a life, SIGKILLs it at the planned moment; (whether a
  checkpoint write was cut, the life's pid)."""
  with open(log_path, "a") as log:
    process = start(argv, log, env)
    trigger = Trigger(workdir, kind, parameter)
    deadline = time.monotonic() + LIFE_TIMEOUT_S
    while not trigger.due():
      assert (
          process.poll() is None
      ), f"the run ended before the kill ({kind}, {parameter}): {tail(log_path)}"
      assert (
          time.monotonic() < deadline
      ), f"no kill moment ({kind}, {parameter}) came"
      time.sleep(_POLL_S)
    process.send_signal(signal.SIGKILL)
    process.wait()
  # A write was cut if the kill left a temporary directory of this life behind.
  return bool(tmp_dirs(workdir) - trigger.tmp_at_start), process.pid


def final_state(workdir):
  """The latest checkpoint's step and its state item, read as saved, every
  array onto this process's first device (a disaggregated run saved its
  slots on a device this process may lack)."""
  directory = os.path.join(workdir, "checkpoints")
  # Verifies the files.
  step = checkpoint_lib.Checkpointer(directory).latest_step()
  path = os.path.join(directory, str(step), "state")
  checkpointer = ocp.StandardCheckpointer()
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  target = jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device),
      checkpointer.metadata(path).item_metadata,
  )
  return step, checkpointer.restore(path, target)


def leaves(tree):
  """(path, numpy array) per leaf; typed PRNG keys as their key data."""

  def host(v):
    return np.asarray(
        jax.random.key_data(v)
        if jax.dtypes.issubdtype(v.dtype, jax.dtypes.prng_key)
        else v
    )

  return [
      (jax.tree_util.keystr(p), host(v))
      for p, v in jax.tree_util.tree_flatten_with_path(tree)[0]
  ]


def assert_same_final_state(workdir_a, workdir_b, num_steps):
  """Both runs' latest checkpoints are of `num_steps` and equal bit for bit."""
  step_a, state_a = final_state(workdir_a)
  step_b, state_b = final_state(workdir_b)
  assert step_a == step_b == num_steps
  leaves_a, leaves_b = leaves(state_a), leaves(state_b)
  assert [p for p, _ in leaves_a] == [p for p, _ in leaves_b]
  for (path, a), (_, b) in zip(leaves_a, leaves_b):
    np.testing.assert_array_equal(a, b, err_msg=path)
