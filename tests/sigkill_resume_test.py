"""SIGKILL at arbitrary moments, inside checkpoint writes too:
resume stays bit-identical.

A reference run trains uninterrupted in one process. A second run in another
workdir is killed with SIGKILL five times and restarted after each kill; both
checkpoint every step. Its final train state (params, optimizer, sampler
slots) and its metric stream, wall-clock fields aside, must equal the
reference's bit for bit, and no restart may be refused by the lock the killed
process held.

The kill moments (`_KILLS`) are drawn from a seeded generator:
  * after step 0's validation line, before the first checkpoint (once left
    step 0 twice in metrics.jsonl);
  * the moment the n-th checkpoint write of a life creates orbax's temporary
    directory, n drawn from {1, 2};
  * a delay drawn from [0, 1] s after a life's first new metrics line.
Runs are subprocesses of this module (`python -m tests.sigkill_resume_test
<workdir>`). They share the test session's persistent compilation cache
(tests/conftest.py, which caches every program), so only the reference run
compiles, and only what no earlier test compiled.
"""

import json
import os
import random
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from scalerl_jax import trainer as trainer_lib
from scalerl_jax import workdir as workdir_lib
from scalerl_jax.checkpoint import checkpointer as checkpoint_lib
from tests import helpers

# Minutes on 2 cores: README's test command leaves it out, CI runs it.
pytestmark = pytest.mark.slow(seconds=110)

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_NUM_STEPS = 8
_TMP_MARK = ".orbax-checkpoint-tmp"
_LIFE_TIMEOUT_S = 900.0
_POLL_S = 0.001


def _config():
  config = helpers.rl_test_config("pipeline_rl", num_steps=_NUM_STEPS)
  config.trainer.checkpoint_every = 1
  return config


def _kill_plan(seed=0):
  """The five kill moments: (kind, parameter)."""
  rng = random.Random(seed)
  plan = [("after_step0_validation", None)]
  for kind in ("checkpoint_write", "time", "checkpoint_write", "time"):
    plan.append(
        (
            kind,
            rng.choice([1, 2])
            if kind == "checkpoint_write"
            else round(rng.uniform(0.0, 1.0), 3),
        )
    )
  return plan


def _metric_steps(workdir):
  path = os.path.join(workdir, workdir_lib.METRICS_FILE)
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return [json.loads(line)["step"] for line in f if line.endswith("\n")]


def _checkpoint_entries(workdir):
  directory = os.path.join(workdir, "checkpoints")
  return set(os.listdir(directory)) if os.path.isdir(directory) else set()


def _tmp_dirs(workdir):
  return {name for name in _checkpoint_entries(workdir) if _TMP_MARK in name}


class _Trigger:
  """Decides, polled every millisecond, when one life is to be killed."""

  def __init__(self, workdir, kind, parameter):
    self.workdir, self.kind, self.parameter = workdir, kind, parameter
    self.lines_at_start = len(_metric_steps(workdir))
    self.tmp_at_start = _tmp_dirs(workdir)
    self.writes_seen: set[str] = set()
    self.deadline = None

  def due(self):
    if self.kind == "after_step0_validation":
      return _metric_steps(self.workdir) == [0] and not any(
          e.isdigit() or _TMP_MARK in e
          for e in _checkpoint_entries(self.workdir)
      )
    if self.kind == "checkpoint_write":
      self.writes_seen |= _tmp_dirs(self.workdir) - self.tmp_at_start
      return len(self.writes_seen) >= self.parameter
    if self.deadline is None:
      if len(_metric_steps(self.workdir)) > self.lines_at_start:
        self.deadline = time.monotonic() + self.parameter
      return False
    return time.monotonic() >= self.deadline


def _start(workdir, log):
  env = dict(os.environ, PYTHONPATH=_ROOT, JAX_PLATFORMS="cpu")
  return subprocess.Popen(
      [sys.executable, "-m", "tests.sigkill_resume_test", workdir],
      cwd=_ROOT,
      env=env,
      stdout=log,
      stderr=subprocess.STDOUT,
  )


def _tail(log_path):
  with open(log_path) as f:
    return f.read()[-3000:]


def _finish(workdir, log_path):
  with open(log_path, "a") as log:
    process = _start(workdir, log)
    assert process.wait(timeout=_LIFE_TIMEOUT_S) == 0, _tail(log_path)


def _kill_once(workdir, log_path, kind, parameter):
  """Starts a life, SIGKILLs it at the planned moment;
  whether a write was cut."""
  with open(log_path, "a") as log:
    process = _start(workdir, log)
    trigger = _Trigger(workdir, kind, parameter)
    deadline = time.monotonic() + _LIFE_TIMEOUT_S
    while not trigger.due():
      assert (
          process.poll() is None
      ), f"the run ended before the kill ({kind}, {parameter}): {_tail(log_path)}"
      assert (
          time.monotonic() < deadline
      ), f"no kill moment ({kind}, {parameter}) came"
      time.sleep(_POLL_S)
    process.send_signal(signal.SIGKILL)
    process.wait()
  # A write was cut if the kill left a temporary directory of this life behind.
  return bool(_tmp_dirs(workdir) - trigger.tmp_at_start), process.pid


def _final_state(workdir):
  """The latest checkpoint's step and its state item, read as saved."""
  directory = os.path.join(workdir, "checkpoints")
  # Verifies the files.
  step = checkpoint_lib.Checkpointer(directory).latest_step()
  return step, ocp.StandardCheckpointer().restore(
      os.path.join(directory, str(step), "state")
  )


def test_sigkill_anywhere_resumes_bit_identically(tmp_path):
  start = time.monotonic()
  log_path = str(tmp_path / "runs.log")
  reference, killed = str(tmp_path / "reference"), str(tmp_path / "killed")
  # Both start from the session's warm-started base (tokenizer and policy).
  helpers.copy_rl_base(reference)
  helpers.copy_rl_base(killed)
  _finish(reference, log_path)
  reference_s = time.monotonic() - start

  cut_writes = 0
  for kind, parameter in _kill_plan():
    cut, pid = _kill_once(killed, log_path, kind, parameter)
    cut_writes += cut
    # The dead process's pid is still in the lock file, but its lock is gone.
    with open(os.path.join(killed, workdir_lib.LOCK_FILE)) as f:
      assert f.read() == str(pid)
    workdir_lib.lock_workdir(killed).close()
  _finish(killed, log_path)

  assert (
      cut_writes >= 2
  ), "fewer than two kills landed inside a checkpoint write"
  step_a, state_a = _final_state(reference)
  step_b, state_b = _final_state(killed)
  assert step_a == step_b == _NUM_STEPS
  leaves_a, leaves_b = (_leaves(s) for s in (state_a, state_b))
  assert [p for p, _ in leaves_a] == [p for p, _ in leaves_b]
  for (path, a), (_, b) in zip(leaves_a, leaves_b):
    np.testing.assert_array_equal(a, b, err_msg=path)
  stream = helpers.metrics_without_times(killed)
  assert [r["step"] for r in stream] == list(range(_NUM_STEPS + 1))
  assert stream == helpers.metrics_without_times(reference)
  print(
      f"sigkill: 5 kills ({cut_writes} inside a checkpoint write), reference run "
      f"{reference_s:.1f} s, whole test {time.monotonic() - start:.1f} s"
  )


def _leaves(tree):
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


if __name__ == "__main__":
  trainer_lib.train_and_evaluate(_config(), sys.argv[1])
