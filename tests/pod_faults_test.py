"""Faults at pod scale: one process of a 2-process run killed or stalled.

A pod run is one process per host; the common fault is one host preempted
(SIGKILL) or stalled (SIGSTOP) while the others wait for it in a collective
or a checkpoint barrier. Two controllers on CPU, as in
tests/multi_controller_test.py, with a short `mesh.peer_timeout_s`:

  * detection: a loop of all-gathers (`tests/scripts/peer_loop.py`); each of
    the two processes killed, and each stopped. The survivor exits within the
    timeout and a slack, with status 75 and a message naming the lost
    process; when process 0, which holds JAX's coordination service, is
    killed outright, JAX's client aborts first, naming the leader task.
  * resume: an RL run (`tests/scripts/pod_run.py`) with a fault at seeded
    moments (`_fault_plan`): process 0 killed inside a checkpoint save (all
    written, nothing sealed), a process stopped and one killed at a random
    delay after a metrics line; both restarted after each fault.
    The survivor exits as above; every step directory left verifies against
    its integrity manifest (a cut write is only a temporary directory); the
    final life's export and every metrics.jsonl row, wall-clock fields aside,
    equal a straight 2-process run's bit for bit.
"""

import os
import random
import signal
import subprocess
import sys
import time

from etils import epath
import portpicker
import pytest

from scalerl_jax import workdir as workdir_lib
from scalerl_jax.checkpoint import integrity
from scalerl_jax.multihost import peers
from tests import helpers
from tests import session_env
from tests.scripts import pod_run

# Minutes on 2 cores: README's test command leaves it out, CI runs it.
pytestmark = pytest.mark.slow(seconds=165)

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_DETECT_TIMEOUT_S = 4.0
# Past the timeout: half a beat interval, the kernel's and a loaded 2-core
# machine's scheduling, and the exit itself.
_SLACK_S = 6.0
_LIFE_TIMEOUT_S = 600.0
_POLL_S = 0.01
_TMP_MARK = ".orbax-checkpoint-tmp"
_JAX_LEADER_DIED = "the leader task was preempted/died"


class _Pair:
  """Two processes of one run, each in a session of its own."""

  def __init__(self, args_of, logs: list[str]):
    port = portpicker.pick_unused_port()
    env = dict(
        os.environ,
        JAX_PLATFORMS="cpu",
        PYTHONPATH=_ROOT,
        NPROC="32",
        XLA_FLAGS=session_env.xla_flags(
            "--xla_force_host_platform_device_count=1 "
            "--xla_cpu_collective_call_terminate_timeout_seconds=600 "
            "--xla_cpu_collective_timeout_seconds=600"
        ),
    )
    self.logs = logs
    self.procs = []
    for i, log in enumerate(logs):
      with open(log, "a") as f:
        self.procs.append(
            subprocess.Popen(
                [sys.executable, "-m", *args_of(i, f"localhost:{port}")],
                cwd=_ROOT,
                env=env,
                stdout=f,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )

  def tail(self, i: int, chars: int = 3000) -> str:
    with open(self.logs[i]) as f:
      return f.read()[-chars:]

  def wait_exit(self, i: int, timeout: float) -> int:
    try:
      return self.procs[i].wait(timeout=timeout)
    except subprocess.TimeoutExpired:
      pytest.fail(
          f"process {i} still running {timeout:.0f} s on:\n{self.tail(i)}"
      )

  def kill(self) -> None:
    """SIGKILLs both (stopped ones too) with their process groups; reaps."""
    for p in self.procs:
      try:
        os.killpg(p.pid, signal.SIGKILL)
      except ProcessLookupError:
        pass
      p.wait()


def _survivor_stops(pair: _Pair, victim: int, sig: int, start: float) -> float:
  """Asserts that the process `victim` did not stop, signalled with `sig` at
  `start`, exits as documented; its seconds from `start`."""
  survivor = 1 - victim
  code = pair.wait_exit(survivor, _DETECT_TIMEOUT_S + _SLACK_S + 30)
  seconds = time.monotonic() - start
  log = pair.tail(survivor, 20000)
  if (victim, sig, code) == (0, signal.SIGKILL, -signal.SIGABRT):
    assert _JAX_LEADER_DIED in log, log
  else:
    assert code == peers.LOST_PEER_EXIT, log
    assert f"process {victim} of 2 is lost" in log, log
  assert seconds <= _DETECT_TIMEOUT_S + _SLACK_S, (seconds, log)
  return seconds


def _peer_loop_args(timeout_s: float):
  return lambda i, coordinator: [
      "tests.scripts.peer_loop",
      f"--process_id={i}",
      "--num_processes=2",
      f"--coordinator={coordinator}",
      f"--peer_timeout_s={timeout_s}",
  ]


def _wait_for(pair: _Pair, text: str) -> None:
  deadline = time.monotonic() + 120
  while not all(text in pair.tail(i) for i in range(2)):
    assert all(p.poll() is None for p in pair.procs), (
        pair.tail(0),
        pair.tail(1),
    )
    assert time.monotonic() < deadline, f"no {text!r} in 120 s"
    time.sleep(0.1)


def test_a_killed_or_stalled_peer_stops_the_survivor_naming_it(tmp_path):
  cases = [
      (victim, sig)
      for victim in (0, 1)
      for sig in (signal.SIGKILL, signal.SIGSTOP)
  ]
  pairs = [
      _Pair(
          _peer_loop_args(_DETECT_TIMEOUT_S),
          [str(tmp_path / f"case{n}_p{i}.log") for i in range(2)],
      )
      for n in range(len(cases))
  ]
  try:
    for pair in pairs:
      _wait_for(pair, "ready")
    starts = []
    for (victim, sig), pair in zip(cases, pairs):
      starts.append(time.monotonic())
      os.kill(pair.procs[victim].pid, sig)
    for (victim, sig), pair, start in zip(cases, pairs, starts):
      seconds = _survivor_stops(pair, victim, sig, start)
      print(
          f"process {victim} {signal.Signals(sig).name}: the survivor exited"
          f" after {seconds:.1f} s (timeout {_DETECT_TIMEOUT_S:g} s)"
      )
  finally:
    for pair in pairs:
      pair.kill()


def _fault_plan(seed=0):
  """(trigger, parameter, victim process, signal) of each fault.

  `seal`: process 0 kills itself in its n-th checkpoint save, once every
  process has written (tests/scripts/pod_run.py); the survivor sees the
  leader die. `after_metrics`: the victim is signalled a delay after the
  life's first new metrics line.
  """
  rng = random.Random(seed)
  plan = [("seal", rng.choice([1, 2]), 0, signal.SIGKILL)]
  for sig in (signal.SIGSTOP, signal.SIGKILL):
    delay = round(rng.uniform(0.0, 1.0), 3)
    plan.append(("after_metrics", delay, rng.choice([0, 1]), sig))
  return plan


def _metric_lines(workdir: str) -> int:
  path = os.path.join(workdir, workdir_lib.METRICS_FILE)
  if not os.path.exists(path):
    return 0
  with open(path) as f:
    return sum(line.endswith("\n") for line in f)


def _entries(workdir: str) -> set[str]:
  directory = os.path.join(workdir, "checkpoints")
  return set(os.listdir(directory)) if os.path.isdir(directory) else set()


def _tmp_dirs(workdir: str) -> set[str]:
  return {e for e in _entries(workdir) if _TMP_MARK in e}


def _assert_only_whole_checkpoints(workdir: str) -> None:
  """Every step directory verifies; anything else is a temporary one."""
  for entry in _entries(workdir):
    path = epath.Path(workdir) / "checkpoints" / entry
    if entry.isdigit():
      assert integrity.find_damage(path) is None, (entry, os.listdir(path))
    else:
      assert _TMP_MARK in entry, entry


def _run_args(workdir: str, export: str, kill_at_seal: int = 0):
  return lambda i, coordinator: [
      "tests.scripts.pod_run",
      f"--workdir={workdir}",
      f"--process_id={i}",
      f"--coordinator={coordinator}",
      f"--export={export}",
      f"--kill_at_seal={kill_at_seal if i == 0 else 0}",
  ]


def _finish(workdir: str, export: str, logs: list[str]) -> None:
  pair = _Pair(_run_args(workdir, export), logs)
  try:
    for i in range(2):
      assert pair.wait_exit(i, _LIFE_TIMEOUT_S) == 0, pair.tail(i)
  finally:
    pair.kill()


def _fault(workdir: str, logs: list[str], fault) -> tuple[float, bool]:
  """One life cut by `fault`; (survivor's seconds, whether a write was cut)."""
  trigger, parameter, victim, sig = fault
  seal = parameter if trigger == "seal" else 0
  pair = _Pair(_run_args(workdir, workdir + "_unused_export", seal), logs)
  try:
    lines, tmp = _metric_lines(workdir), _tmp_dirs(workdir)
    deadline, fire_at = time.monotonic() + _LIFE_TIMEOUT_S, None
    while fire_at is None or time.monotonic() < fire_at:
      if trigger == "seal" and pair.procs[victim].poll() is not None:
        break
      assert all(
          p.poll() is None for p in pair.procs
      ), f"the run ended before the fault {fault}:\n{pair.tail(0)}"
      assert time.monotonic() < deadline, f"no moment for the fault {fault}"
      if not seal and fire_at is None and _metric_lines(workdir) > lines:
        fire_at = time.monotonic() + parameter
      time.sleep(_POLL_S)
    start = time.monotonic()
    if trigger == "seal":
      assert pair.procs[victim].returncode == -signal.SIGKILL
    else:
      os.kill(pair.procs[victim].pid, sig)
    seconds = _survivor_stops(pair, victim, sig, start)
  finally:
    pair.kill()
  return seconds, bool(_tmp_dirs(workdir) - tmp)


def test_killed_and_stalled_processes_resume_bit_identically(tmp_path):
  start = time.monotonic()
  reference, faulted = str(tmp_path / "reference"), str(tmp_path / "faulted")
  helpers.copy_rl_base(reference)
  helpers.copy_rl_base(faulted)
  logs = [str(tmp_path / f"p{i}.log") for i in range(2)]
  _finish(reference, reference + "_export", logs)
  reference_s = time.monotonic() - start
  detections, cut = [], 0
  for fault in _fault_plan():
    seconds, cut_write = _fault(faulted, logs, fault)
    detections.append(seconds)
    cut += cut_write
    _assert_only_whole_checkpoints(faulted)
  _finish(faulted, faulted + "_export", logs)
  assert cut >= 1, "no fault landed inside a checkpoint write"
  with open(
      os.path.join(reference + "_export", "model.safetensors"), "rb"
  ) as f:
    want = f.read()
  with open(os.path.join(faulted + "_export", "model.safetensors"), "rb") as f:
    assert f.read() == want
  rows = helpers.metrics_without_times(faulted)
  assert rows[-1]["step"] == pod_run.NUM_STEPS
  assert rows == helpers.metrics_without_times(reference)
  print(
      f"pod faults {_fault_plan()}: {cut} inside a checkpoint write; survivors"
      f" exited after {', '.join(f'{s:.1f}' for s in detections)} s; reference"
      f" run {reference_s:.0f} s, whole test {time.monotonic() - start:.0f} s"
  )
