"""Faults around a run: every verifier process killed, a full disk,
an unwritable workdir.

Each must end in recovery or a clear error, never a hang (every wait here has
a deadline) and never a damaged checkpoint.
"""

import concurrent.futures
import contextlib
import os
import resource
import signal
import threading
import time

import jax.numpy as jnp
import numpy as np
import psutil
import pytest

from configs import scalerl
from scalerl_jax import rewards
from scalerl_jax import trainer as trainer_lib
from scalerl_jax import workdir as workdir_lib
from scalerl_jax.checkpoint import checkpointer
from scalerl_jax.rewards import code_sandbox
from tests import helpers

# Far above any step here, even on a loaded machine: a hang.
_DEADLINE_S = 300.0
_NOBODY = 65534
_SLEEPER = "```python\nimport time\ntime.sleep(600)\n```"
# A second, different program: the pool runs a repeated program for the same
# record once per call, so two busy workers need two distinct sleepers.
_SLEEPER_2 = "```python\nimport time\ntime.sleep(601)\n```"
_CODE_RECORD = {"id": "c", "verifier": "code", "answer": "assert f() is None"}
# One long-lived thread for the calls that may restart the fork server: Linux
# kills it (PR_SET_PDEATHSIG) when the thread that started it exits.
_RUNNER = concurrent.futures.ThreadPoolExecutor(max_workers=1)


def _in_thread(fn, *args):
  """fn(*args) on `_RUNNER`; fails the test if it runs past
  the deadline (a hang)."""
  return _RUNNER.submit(fn, *args).result(timeout=_DEADLINE_S)


def _is_fork_server(process):
  """Whether `process` is a live reward fork server. Under
  SCALERL_CHECK_LEFTOVERS=1 the test process is the subreaper of what it
  starts, so the servers it killed linger as its zombies until it reaps
  them."""
  try:
    return process.status() != psutil.STATUS_ZOMBIE and (
        "scalerl_jax.rewards.workers.zygote" in " ".join(process.cmdline())
    )
  except (psutil.NoSuchProcess, psutil.ZombieProcess):
    return False


def _reward_processes():
  """This process's fork server of the reward pool and
  every worker it forked."""
  servers = [p for p in psutil.Process().children() if _is_fork_server(p)]
  return servers + [w for s in servers for w in s.children()]


def _idle_descendants(rewards_config):
  """Processes below an idle worker: its standing sandbox under the fork
  server (bubblewrap and the server), none otherwise."""
  fork_server = code_sandbox.uses_fork_server(
      rewards_config.code_isolation, rewards_config.code_fork_server
  )
  return 2 if fork_server else 0


def _busy(worker, idle):
  """Whether `worker` runs a program (a sandboxed child below it)."""
  try:
    return len(worker.children(recursive=True)) > idle
  except psutil.NoSuchProcess:
    return False


def _kill_all(processes):
  for process in processes:
    process.send_signal(signal.SIGKILL)
  psutil.wait_procs(processes, timeout=10)


@pytest.mark.needs_bwrap
def test_killing_every_reward_process_mid_batch_restarts_the_pool():
  config = scalerl.get_config()
  with config.unlocked():
    config.rewards.num_workers, config.rewards.timeout_s = 2, 60.0
  record = {"id": "m", "answer": "7", "verifier": "math"}
  completions = [_SLEEPER, _SLEEPER_2] + [r"\boxed{7}", r"\boxed{8}"] * 3
  records = [_CODE_RECORD] * 2 + [record] * 6
  with rewards.RewardPool(config.rewards) as pool:
    before = _reward_processes()
    assert len(before) == 3  # The fork server and two workers.

    # Each sleeper runs below its worker: a fresh sandbox, or a fork of the
    # worker's standing sandbox.
    idle = _idle_descendants(config.rewards)

    def kill_once_both_workers_are_busy():
      while sum(1 for w in before[1:] if _busy(w, idle)) < 2:
        time.sleep(0.01)
      _kill_all(before)

    killer = threading.Thread(
        target=kill_once_both_workers_are_busy, daemon=True
    )
    killer.start()
    scores, stats = _in_thread(pool.score, completions, records)
    killer.join(_DEADLINE_S)
    # The two verifications in flight died with their workers and score 0 (as
    # crashes: nothing waited for the 60 s timeout); the rest ran on a new
    # fork server.
    assert stats["num_crashes"] == 2 and stats["num_timeouts"] == 0
    np.testing.assert_array_equal(scores, [0, 0] + [1, 0] * 3)
    after = _reward_processes()
    assert len(after) == 3 and not {p.pid for p in after} & {
        p.pid for p in before
    }
    scores, stats = _in_thread(pool.score, [r"\boxed{7}"] * 2, [record] * 2)
    np.testing.assert_array_equal(scores, [1, 1])


@pytest.mark.needs_bwrap
def test_a_fork_server_that_keeps_dying_stops_scoring_with_a_clear_error():
  config = scalerl.get_config()
  with config.unlocked():
    config.rewards.num_workers, config.rewards.timeout_s = 1, 60.0
  with rewards.RewardPool(config.rewards) as pool:

    idle = _idle_descendants(config.rewards)

    def kill_every_server_once_busy():
      killed = set()
      while len(killed) < 2:
        for process in _reward_processes()[1:]:
          if process.pid not in killed and _busy(process, idle):
            killed.add(process.pid)
            _kill_all([psutil.Process(process.ppid()), process])
        time.sleep(0.01)

    killer = threading.Thread(target=kill_every_server_once_busy, daemon=True)
    killer.start()
    with pytest.raises(
        RuntimeError, match="fork server failed twice while scoring one batch"
    ):
      _in_thread(pool.score, [_SLEEPER, _SLEEPER_2], [_CODE_RECORD] * 2)
    killer.join(_DEADLINE_S)


@contextlib.contextmanager
def _file_size_limit(max_bytes):
  """Writes past `max_bytes` in any file fail (EFBIG), as on a full disk."""
  old_limit = resource.getrlimit(resource.RLIMIT_FSIZE)
  # Fail the write, not the process.
  old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
  resource.setrlimit(resource.RLIMIT_FSIZE, (max_bytes, old_limit[1]))
  try:
    yield
  finally:
    resource.setrlimit(resource.RLIMIT_FSIZE, old_limit)
    signal.signal(signal.SIGXFSZ, old_handler)


@contextlib.contextmanager
def _unwritable(directory):
  """`directory` read-only; as root, this process also drops to nobody
  (root ignores modes)."""
  os.chmod(directory, 0o555)
  as_root = os.geteuid() == 0
  if as_root:
    os.seteuid(_NOBODY)
  try:
    yield
  finally:
    if as_root:
      os.seteuid(0)
    os.chmod(directory, 0o755)


def test_a_full_disk_fails_the_save_with_a_clear_error_and_keeps_the_last_checkpoint(
    tmp_path,
):
  # 4 MB: past the 1 MB limit.
  state = {"w": jnp.arange(1 << 20, dtype=jnp.float32)}
  directory = str(tmp_path / "checkpoints")
  with checkpointer.Checkpointer(directory) as ckpt:
    ckpt.save(1, state, {"step": 1})
    ckpt.wait()
    with _file_size_limit(1 << 20):
      ckpt.save(2, {"w": state["w"] + 1}, {"step": 2})
      with pytest.raises(
          checkpointer.CheckpointWriteError,
          match=r"step 2 failed: .*File too large.*complete checkpoints \(\[1\]\)",
      ):
        ckpt.wait()
  with checkpointer.Checkpointer(directory) as reopened:
    assert reopened.latest_step() == 1  # Verified against its manifest.
    restored = reopened.restore(1, state)
  np.testing.assert_array_equal(restored.state["w"], state["w"])


@pytest.mark.slow(seconds=10)  # A whole run.
def test_a_run_survives_a_killed_reward_pool_and_stops_cleanly_on_an_unwritable_workdir(
    tmp_path,
):
  config = helpers.rl_test_config("pipeline_rl", num_steps=3)
  config.trainer.warm_start_steps = 0  # Rewards do not matter here.
  workdir = str(tmp_path / "run")
  trainer = trainer_lib.Trainer(config, workdir)
  try:
    trainer.run_step()
    trainer.save(force=True)
    trainer.checkpointer.wait()
    dead = _reward_processes()
    _kill_all(dead)
    _in_thread(trainer.run_step)
    # Validation scores every sample (a step may take groups scored before).
    assert 0 <= _in_thread(trainer.evaluate)["val/mean_at_k"] <= 1
    assert len(_reward_processes()) == 1 + config.rewards.num_workers
    assert not {p.pid for p in _reward_processes()} & {p.pid for p in dead}

    checkpoints = trainer.checkpointer.directory
    with _unwritable(checkpoints):
      with pytest.raises(
          checkpointer.CheckpointWriteError,
          match=r"step 2 failed: .*Permission denied.*complete checkpoints",
      ):
        trainer.save(force=True)
        trainer.checkpointer.wait()
  finally:
    trainer.close()
  assert checkpointer.Checkpointer(checkpoints).latest_step() == 1
  assert not workdir_lib.is_finished(workdir)
