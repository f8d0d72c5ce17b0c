"""SIGKILL at arbitrary moments, inside checkpoint writes too:
resume stays bit-identical.

A reference run trains uninterrupted in one process. A second run in another
workdir is killed with SIGKILL five times and restarted after each kill; both
checkpoint every step. Its final train state (params, optimizer, sampler
slots) and its metric stream, wall-clock fields aside, must equal the
reference's bit for bit, and no restart may be refused by the lock the killed
process held.

The kill moments (`_kill_plan`) are drawn from a seeded generator:
  * after step 0's validation line, before the first checkpoint (once left
    step 0 twice in metrics.jsonl);
  * the moment the n-th checkpoint write of a life creates orbax's temporary
    directory, n drawn from {1, 2};
  * a delay drawn from [0, 1] s after a life's first new metrics line.
Runs are subprocesses of this module (`python -m tests.sigkill_resume_test
<workdir>`), started and killed by tests/lives.py. They share the test
session's persistent compilation cache (tests/conftest.py, which caches
every program), so only the reference run compiles, and only what no
earlier test compiled.
"""

import os
import random
import sys
import time

import pytest

from scalerl_jax import trainer as trainer_lib
from scalerl_jax import workdir as workdir_lib
from tests import helpers
from tests import lives

# Minutes on 2 cores: README's test command leaves it out, CI runs it.
pytestmark = pytest.mark.slow(seconds=110)

_NUM_STEPS = 8


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


def _life(workdir):
  return ["tests.sigkill_resume_test", workdir]


def test_sigkill_anywhere_resumes_bit_identically(tmp_path):
  start = time.monotonic()
  log_path = str(tmp_path / "runs.log")
  reference, killed = str(tmp_path / "reference"), str(tmp_path / "killed")
  # Both start from the session's warm-started base (tokenizer and policy).
  helpers.copy_rl_base(reference)
  helpers.copy_rl_base(killed)
  lives.finish(_life(reference), log_path)
  reference_s = time.monotonic() - start

  cut_writes = 0
  for kind, parameter in _kill_plan():
    cut, pid = lives.kill_once(_life(killed), killed, log_path, kind, parameter)
    cut_writes += cut
    # The dead process's pid is still in the lock file, but its lock is gone.
    with open(os.path.join(killed, workdir_lib.LOCK_FILE)) as f:
      assert f.read() == str(pid)
    workdir_lib.lock_workdir(killed).close()
  lives.finish(_life(killed), log_path)

  assert (
      cut_writes >= 2
  ), "fewer than two kills landed inside a checkpoint write"
  lives.assert_same_final_state(reference, killed, _NUM_STEPS)
  stream = helpers.metrics_without_times(killed)
  assert [r["step"] for r in stream] == list(range(_NUM_STEPS + 1))
  assert stream == helpers.metrics_without_times(reference)
  print(
      f"sigkill: 5 kills ({cut_writes} inside a checkpoint write), reference run "
      f"{reference_s:.1f} s, whole test {time.monotonic() - start:.1f} s"
  )


if __name__ == "__main__":
  trainer_lib.train_and_evaluate(_config(), sys.argv[1])
