"""The reward pool's processes: a fork server and the workers it forks.

`WorkerProcesses` starts the fork server (zygote.py) and one worker per slot,
replaces a worker (killing it with its sandboxed process groups) or a dead
fork server, and stops them all. What each worker scores is `pool.py`'s.

Design: docs/design/rewards.md.
"""

from __future__ import annotations

import dataclasses
from multiprocessing import connection as mp_connection
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Optional

from absl import logging

import scalerl_jax
from scalerl_jax.rewards.sandbox import isolation
from scalerl_jax.rewards.workers import worker

# The fork server must answer, and a new worker report ready, within this.
START_TIMEOUT_S = 120.0
# How often a wait for the fork server checks that it is still alive.
_POLL_S = 0.2


def _failed_twice(status: Optional[int]) -> RuntimeError:
  """The error of a fork server that died a second time in one call."""
  return RuntimeError(
      f"The reward fork server failed twice while scoring one batch (exit status "
      f"{status}); something keeps killing the verifier processes (the out-of-memory "
      "killer? see rewards.worker_memory_mb)"
  )


@dataclasses.dataclass
class Slot:
  """One worker process and what it is doing."""

  pid: int
  conn: mp_connection.Connection
  started: float
  ready: bool = False
  # Index, in the current batch, of the completion it scores.
  task: Optional[int] = None
  sent: float = 0.0  # time.monotonic() when that completion was handed over.
  # pgid -> temp dir of the sandboxed process groups it reported.
  groups: dict[int, str] = dataclasses.field(default_factory=dict)


class WorkerProcesses:
  """The fork server and `num_workers` workers forked by it, one per slot.

  Raises:
    RuntimeError: a process could not start.
  """

  def __init__(self, settings: worker.WorkerSettings, num_workers: int):
    self._settings = settings
    self.slots: list[Slot] = []
    self.restarts = 0  # Workers replaced since the start.
    self._server_restarted = False  # The fork server was replaced this call.
    self._control: Optional[mp_connection.Connection] = None
    self._zygote: Optional[subprocess.Popen] = None
    self._dir = tempfile.mkdtemp(prefix="scalerl_rewards_")
    self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
      path = os.path.join(self._dir, "socket")
      self._server.bind(path)
      self._server.listen()
      self._server.settimeout(_POLL_S)
      # The package root goes first on the path, so that the fork server
      # imports this very scalerl_jax whatever the working directory.
      root = os.path.dirname(
          os.path.dirname(os.path.abspath(scalerl_jax.__file__))
      )
      env = dict(
          os.environ,
          PYTHONPATH=os.pathsep.join(
              p for p in (root, os.environ.get("PYTHONPATH", "")) if p
          ),
      )
      self._zygote_cmd = (
          [sys.executable, "-m", "scalerl_jax.rewards.workers.zygote", path],
          env,
      )
      self._start_server()
      for _ in range(num_workers):
        self.slots.append(self._start_worker())
    except BaseException:
      self.close()
      raise

  def begin_call(self) -> None:
    """Marks the start of a `score` call: the fork server may be replaced once
    in it."""
    self._server_restarted = False

  def _start_server(self) -> None:
    """Starts the fork server and waits until it has imported the verifiers."""
    command, env = self._zygote_cmd
    self._zygote = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL)
    self._control = self._accept()
    self._control.send(self._settings)
    self._reply("ready")

  def _restart_server(self) -> None:
    """Replaces a dead or hung fork server; raises the second time in a call."""
    status = self._zygote.poll()
    if status is None:
      self._zygote.kill()
      status = self._zygote.wait()
    if self._server_restarted:
      raise _failed_twice(status)
    logging.warning(
        "The reward fork server died (exit status %s); starting a new one",
        status,
    )
    self._server_restarted = True
    self._control.close()
    try:
      self._start_server()
    except (OSError, RuntimeError) as e:
      # The new one died too before it was ready: the second failure.
      raise _failed_twice(self._zygote.poll()) from e

  def _accept(self) -> mp_connection.Connection:
    """The next connection from the fork server or a worker it forked."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
      try:
        sock, _ = self._server.accept()
      except TimeoutError:
        status = self._zygote.poll()
        if status is not None:
          raise RuntimeError(
              f"The reward fork server exited with status {status}; its traceback is on "
              "stderr"
          ) from None
        if time.monotonic() > deadline:
          raise RuntimeError(
              f"The reward fork server did not connect within {START_TIMEOUT_S:.0f} s"
          ) from None
        continue
      sock.setblocking(True)
      return mp_connection.Connection(sock.detach())

  def _reply(self, kind: str) -> tuple:
    """Waits for the fork server's answer `(kind, ...)`."""
    if not self._control.poll(START_TIMEOUT_S):
      raise RuntimeError(
          f"The reward fork server did not answer within {START_TIMEOUT_S:.0f} s"
      )
    try:
      message = self._control.recv()
    except EOFError:
      raise RuntimeError(
          f"The reward fork server exited (status {self._zygote.wait()}); its traceback is on "
          "stderr"
      ) from None
    if message[0] != kind:
      raise RuntimeError(
          f"The reward fork server answered {message!r}, expected {kind!r}"
      )
    return message

  def _start_worker(self) -> Slot:
    self._control.send(("fork",))
    conn = self._accept()
    _, pid = self._reply("forked")
    return Slot(pid, conn, time.monotonic())

  def _cleanup(self, slot: Slot) -> None:
    """For a dead worker: kills the groups it left, removes their temp dirs."""
    for pgid, tmpdir in slot.groups.items():
      try:
        os.killpg(pgid, signal.SIGKILL)
      except (ProcessLookupError, PermissionError):
        pass  # Killed with its parent (PR_SET_PDEATHSIG) already.
      shutil.rmtree(tmpdir, ignore_errors=True)
    slot.conn.close()

  def replace(self, index: int) -> None:
    """Kills worker `index` if alive and forks a new one."""
    slot = self.slots[index]
    try:
      self._control.send(("kill", slot.pid))
      self._reply("killed")
    except (OSError, RuntimeError):
      self._restart_server()
    self._cleanup(slot)
    isolation.sweep_cgroups()
    while True:
      try:
        self.slots[index] = self._start_worker()
        break
      except (OSError, RuntimeError):
        # Raises once the server was already replaced in this call, so a
        # server killed while it forks the new worker ends in the same error.
        self._restart_server()
    self.restarts += 1

  def close(self) -> None:
    """Stops the fork server, its workers and what they left. Idempotent."""
    if self._control is not None:
      self._control.close()  # The fork server kills its workers and exits.
      self._control = None
    if self._zygote is not None:
      try:
        self._zygote.wait(timeout=START_TIMEOUT_S)
      except subprocess.TimeoutExpired:
        self._zygote.kill()  # Its workers die with it (PR_SET_PDEATHSIG).
        self._zygote.wait()
      self._zygote = None
    for slot in self.slots:
      self._cleanup(slot)
    self.slots = []
    # The workers' sandboxes die with them; their cgroups are left to remove.
    isolation.sweep_cgroups()
    self._server.close()
    shutil.rmtree(self._dir, ignore_errors=True)
