"""`RewardPool`: verifiers in killable worker processes with a per-call timeout.

Each verification runs in a worker forked by the pool's fork server
(zygote.py) and gets rewards.timeout_s; an overrunning worker is SIGKILLed
with its sandboxed process groups and replaced. Timed-out, crashed and
failed verifications score 0 and are counted. Calls run one at a time.

Shape letters: the package key (scalerl_jax/__init__.py), and C completions
of one `score` call. Design: docs/design/rewards.md.
"""

from __future__ import annotations

import collections
from concurrent import futures
import dataclasses
from multiprocessing import connection as mp_connection
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Mapping, Optional, Sequence

from absl import logging
import numpy as np

import scalerl_jax
from scalerl_jax.rewards import isolation
from scalerl_jax.rewards import registry
from scalerl_jax.rewards import worker

# The fork server must answer, and a new worker report ready, within this.
_START_TIMEOUT_S = 120.0
# How often a wait for the fork server checks that it is still alive.
_POLL_S = 0.2


@dataclasses.dataclass
class _Slot:
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


@dataclasses.dataclass
class _Batch:
  """Results and counters of one `score` call."""

  scores_C: np.ndarray
  seconds_C: np.ndarray
  timeouts: int = 0
  errors: int = 0
  crashes: int = 0
  first_error: str = ""
  server_restarted: bool = False  # The fork server was replaced in this call.


def _code_duplicates(
    texts: Sequence[Any],
    records: Sequence[Mapping[str, Any]],
    specs: Sequence[str],
    valid_C: np.ndarray,
) -> dict[int, int]:
  """Index -> its first copy's index, for code sent again for the same tests."""
  # A sandbox run is the costliest verification, and a group whose policy has
  # sharpened sends the same program many times: copies share one run.
  first: dict[tuple, int] = {}
  copy_of = {}
  for i, (text, record, spec) in enumerate(zip(texts, records, specs)):
    if not valid_C[i] or registry.kind_of(spec) != "code":
      continue
    key = (spec, text, record.get("answer"), record.get("metadata"))
    copy_of[i] = first.setdefault(key, i)
    if copy_of[i] == i:
      del copy_of[i]
  return copy_of


class RewardPool:
  """Scores completions against prompt records in worker processes.

  Raises:
    ValueError: an unknown rewards.verifier or kind in strip_thinking.
    RuntimeError: a process could not start, or code_isolation='bwrap' and
      bubblewrap does not run here.
  """

  def __init__(self, rewards_config: Any):
    # Code records are checked as they come (`_score`); the run checks what
    # its config names at start-up (isolation.config_scores_code).
    isolation.check(rewards_config.code_isolation, scores_code=False)
    self._mode = rewards_config.verifier
    if self._mode not in registry.MODES:
      raise ValueError(
          f"rewards.verifier: {self._mode!r} is not one of {registry.MODES}"
      )
    strip_thinking = tuple(rewards_config.strip_thinking)
    if not set(strip_thinking) <= set(registry.KINDS):
      raise ValueError(
          f"rewards.strip_thinking: {strip_thinking!r} is not a subset of {registry.KINDS}"
      )
    self._timeout_s = float(rewards_config.timeout_s)
    self._settings = worker.WorkerSettings(
        timeout_s=self._timeout_s,
        code_cpu_s=float(rewards_config.code_cpu_s),
        code_memory_mb=int(rewards_config.code_memory_mb),
        code_isolation=rewards_config.code_isolation,
        code_fork_server=bool(rewards_config.code_fork_server),
        memory_mb=int(rewards_config.worker_memory_mb),
        strip_thinking=strip_thinking,
    )
    self._restarts = 0
    self._lock = threading.Lock()  # One call at a time, from whichever thread.
    # `submit`'s thread lives as long as the pool: a fork server dies with the
    # thread that started it (PR_SET_PDEATHSIG).
    self._thread = futures.ThreadPoolExecutor(
        max_workers=1, thread_name_prefix="reward_pool"
    )
    self._slots: list[_Slot] = []
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
          [sys.executable, "-m", "scalerl_jax.rewards.zygote", path],
          env,
      )
      self._start_server()
      for _ in range(rewards_config.num_workers):
        self._slots.append(self._start_worker())
    except BaseException:
      self.close()
      raise

  @property
  def timeout_s(self) -> float:
    """Wall-clock limit of one verification."""
    return self._timeout_s

  def _start_server(self) -> None:
    """Starts the fork server and waits until it has imported the verifiers."""
    command, env = self._zygote_cmd
    self._zygote = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL)
    self._control = self._accept()
    self._control.send(self._settings)
    self._reply("ready")

  def _restart_server(self, batch: _Batch) -> None:
    """Replaces a dead or hung fork server; raises the second time in a call."""
    status = self._zygote.poll()
    if status is None:
      self._zygote.kill()
      status = self._zygote.wait()
    if batch.server_restarted:
      raise RuntimeError(
          f"The reward fork server failed twice while scoring one batch (exit status "
          f"{status}); something keeps killing the verifier processes (the out-of-memory "
          "killer? see rewards.worker_memory_mb)"
      )
    logging.warning(
        "The reward fork server died (exit status %s); starting a new one",
        status,
    )
    batch.server_restarted = True
    self._control.close()
    self._start_server()

  def _accept(self) -> mp_connection.Connection:
    """The next connection from the fork server or a worker it forked."""
    deadline = time.monotonic() + _START_TIMEOUT_S
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
              f"The reward fork server did not connect within {_START_TIMEOUT_S:.0f} s"
          ) from None
        continue
      sock.setblocking(True)
      return mp_connection.Connection(sock.detach())

  def _reply(self, kind: str) -> tuple:
    """Waits for the fork server's answer `(kind, ...)`."""
    if not self._control.poll(_START_TIMEOUT_S):
      raise RuntimeError(
          f"The reward fork server did not answer within {_START_TIMEOUT_S:.0f} s"
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

  def _start_worker(self) -> _Slot:
    self._control.send(("fork",))
    conn = self._accept()
    _, pid = self._reply("forked")
    return _Slot(pid, conn, time.monotonic())

  def _cleanup(self, slot: _Slot) -> None:
    """For a dead worker: kills the groups it left, removes their temp dirs."""
    for pgid, tmpdir in slot.groups.items():
      try:
        os.killpg(pgid, signal.SIGKILL)
      except (ProcessLookupError, PermissionError):
        pass  # Killed with its parent (PR_SET_PDEATHSIG) already.
      shutil.rmtree(tmpdir, ignore_errors=True)
    slot.conn.close()

  def _replace(self, index: int, batch: _Batch) -> None:
    """Kills worker `index` if alive and forks a new one."""
    slot = self._slots[index]
    try:
      self._control.send(("kill", slot.pid))
      self._reply("killed")
    except (OSError, RuntimeError):
      self._restart_server(batch)
    self._cleanup(slot)
    try:
      self._slots[index] = self._start_worker()
    except (OSError, RuntimeError):
      self._restart_server(batch)
      self._slots[index] = self._start_worker()
    self._restarts += 1

  def _receive(self, index: int, batch: _Batch, now: float) -> None:
    """Handles the messages waiting from worker `index`; replaces it if dead."""
    slot = self._slots[index]
    try:
      while slot.conn.poll():
        message = slot.conn.recv()
        kind = message[0]
        if kind == "ready":
          slot.ready = True
        elif kind == "spawned":
          slot.groups[message[1]] = message[2]
        elif kind == "reaped":
          slot.groups.pop(message[1], None)
        elif kind == "done":
          _, task, score, error = message
          batch.scores_C[task] = score
          batch.seconds_C[task] = now - slot.sent
          if error:
            batch.errors += 1
            batch.first_error = batch.first_error or error
          slot.task = None
    except (EOFError, OSError):
      if slot.task is not None:
        batch.crashes += 1
        batch.seconds_C[slot.task] = now - slot.sent
      elif not slot.ready:
        raise RuntimeError(
            "A reward worker died while starting; its traceback is on stderr"
        ) from None
      self._replace(index, batch)

  def score(
      self, completions: Sequence[Any], records: Sequence[Mapping[str, Any]]
  ) -> tuple[np.ndarray, dict[str, float]]:
    """Scores each completion (str, or UTF-8 bytes) against its record.

    Returns:
      float32 scores_C in [0, 1] (0 for a non-string), and stats:
      num_completions, num_timeouts, num_errors (the verifier raised),
      num_crashes, num_invalid, num_worker_restarts (since the start),
      slowest_s and mean_s (per verification), wall_s.

    Raises:
      ValueError: lengths differ, a malformed record or an unknown verifier.
      RuntimeError: closed, processes failed to start or failed twice, or a
        code record to score and bubblewrap does not run here (unless
        rewards.code_isolation='python').
    """
    if len(completions) != len(records):
      raise ValueError(
          f"score: {len(completions)} completions but {len(records)} records"
      )
    with self._lock:
      if not self._slots:
        raise RuntimeError("score: this RewardPool is closed")
      return self._score(completions, records)

  def submit(
      self, completions: Sequence[Any], records: Sequence[Mapping[str, Any]]
  ) -> futures.Future:
    """A future of `score`, run in the pool's own thread; returns at once.

    Raises:
      RuntimeError: the pool is closed.
    """
    if not self._slots:
      raise RuntimeError("submit: this RewardPool is closed")
    return self._thread.submit(self.score, completions, records)

  def _score(
      self, completions: Sequence[Any], records: Sequence[Mapping[str, Any]]
  ) -> tuple[np.ndarray, dict[str, float]]:
    """`score`, with the lock held."""
    specs = [registry.resolve_spec(record, self._mode) for record in records]
    if any(registry.kind_of(spec) == "code" for spec in specs):
      # Stops the run rather than scoring code outside bubblewrap.
      isolation.use_bwrap(self._settings.code_isolation)
    start = time.monotonic()
    batch = _Batch(
        np.zeros(len(completions), np.float32), np.zeros(len(completions))
    )
    valid_C = np.array([isinstance(c, (str, bytes)) for c in completions], bool)
    texts = [
        c.decode("utf-8", errors="replace") if isinstance(c, bytes) else c
        for c in completions
    ]
    copy_of = _code_duplicates(texts, records, specs, valid_C)
    pending = collections.deque(
        (i, texts[i])
        for i in range(len(texts))
        if valid_C[i] and i not in copy_of
    )
    while pending or any(slot.task is not None for slot in self._slots):
      self._dispatch(pending, records, specs, batch)
      self._wait(batch)
    for i, first in copy_of.items():
      batch.scores_C[i], batch.seconds_C[i] = (
          batch.scores_C[first],
          batch.seconds_C[first],
      )
    timed = batch.seconds_C[valid_C]
    stats = {
        "num_completions": len(completions),
        "num_timeouts": batch.timeouts,
        "num_errors": batch.errors,
        "num_crashes": batch.crashes,
        "num_invalid": int((~valid_C).sum()),
        "num_worker_restarts": self._restarts,
        "slowest_s": float(timed.max()) if timed.size else 0.0,
        "mean_s": float(timed.mean()) if timed.size else 0.0,
        "wall_s": time.monotonic() - start,
    }
    if batch.timeouts or batch.errors or batch.crashes:
      logging.warning(
          "Rewards: %d timeouts, %d errors, %d worker crashes among %d completions "
          "(all scored 0). First error: %s",
          batch.timeouts,
          batch.errors,
          batch.crashes,
          len(completions),
          batch.first_error or "-",
      )
    return batch.scores_C, stats

  def _dispatch(
      self,
      pending: collections.deque,
      records: Sequence[Mapping[str, Any]],
      specs: Sequence[str],
      batch: _Batch,
  ) -> None:
    """Hands pending completions to idle, ready workers."""
    for index, slot in enumerate(self._slots):
      if not (pending and slot.ready and slot.task is None):
        continue
      i, completion = pending.popleft()
      try:
        slot.conn.send((i, completion, records[i], specs[i]))
      except (BrokenPipeError, OSError):
        # The worker died idle: not this input's fault.
        pending.appendleft((i, completion))
        self._replace(index, batch)
        continue
      slot.task, slot.sent = i, time.monotonic()

  def _wait(self, batch: _Batch) -> None:
    """Waits for messages or the nearest deadline, then enforces deadlines."""
    deadlines = []
    for slot in self._slots:
      if slot.task is not None:
        deadlines.append(slot.sent + self._timeout_s)
      elif not slot.ready:
        deadlines.append(slot.started + _START_TIMEOUT_S)
    waiting = [
        slot.conn
        for slot in self._slots
        if slot.task is not None or not slot.ready
    ]
    if waiting:
      mp_connection.wait(
          waiting, timeout=max(0.0, min(deadlines) - time.monotonic())
      )
    now = time.monotonic()
    for index in range(len(self._slots)):
      self._receive(index, batch, now)
      slot = self._slots[index]
      if slot.task is not None and now >= slot.sent + self._timeout_s:
        batch.timeouts += 1
        batch.seconds_C[slot.task] = now - slot.sent
        self._replace(index, batch)
      elif not slot.ready and now >= slot.started + _START_TIMEOUT_S:
        raise RuntimeError(
            f"A reward worker did not start within {_START_TIMEOUT_S:.0f} s"
        )

  def close(self) -> None:
    """Stops the fork server, its workers and what they left. Idempotent.

    A running submitted call finishes first; those not started are cancelled.
    """
    self._thread.shutdown(wait=True, cancel_futures=True)
    if self._control is not None:
      self._control.close()  # The fork server kills its workers and exits.
      self._control = None
    if self._zygote is not None:
      try:
        self._zygote.wait(timeout=_START_TIMEOUT_S)
      except subprocess.TimeoutExpired:
        self._zygote.kill()  # Its workers die with it (PR_SET_PDEATHSIG).
        self._zygote.wait()
      self._zygote = None
    for slot in self._slots:
      self._cleanup(slot)
    self._slots = []
    self._server.close()
    shutil.rmtree(self._dir, ignore_errors=True)

  def __enter__(self) -> RewardPool:
    return self

  def __exit__(self, *exc_info) -> None:
    self.close()
