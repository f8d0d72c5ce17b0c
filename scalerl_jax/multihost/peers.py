"""The peer watchdog of a multi-controller run: a lost process stops the rest.

A TPU pod run is one process per host, and a host that is preempted, killed
or stalled leaves the others waiting in a collective or a checkpoint barrier.
Every process that joined JAX's runtime
(`runtime.maybe_initialize_distributed`) runs a `Watchdog`: a thread writes
a counter to the coordination service's key-value store (held by process 0)
every quarter of `mesh.peer_timeout_s` and reads the others'. When a
process's counter has not moved for `mesh.peer_timeout_s`, or the
coordination service has not answered for that long (process 0 is lost),
every process still running prints which process was lost and exits with
`LOST_PEER_EXIT`, whatever its main thread is waiting in. Nothing is cleaned
up on the way out: a checkpoint cut short stays an orbax temporary directory
without an integrity manifest, which no restore reads
(docs/design/checkpoints.md), and the reward processes die with their
parent. Restarting every process on the same workdir resumes the run.

JAX's own heartbeat (`jax.distributed.initialize`'s
`heartbeat_timeout_seconds`, set to `JAX_HEARTBEAT_FACTOR` times the timeout)
stays as the backstop; when process 0 dies outright, the others' JAX clients
see its socket close and abort first, with JAX's message that the leader task
died. A process that ends normally writes `EXITED`, and the others stop
watching it. What a pod user sees and does: docs/reliability.md.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
from typing import NoReturn, Optional

import jax

# The coordination service's client, as orbax and multihost_utils reach it.
from jax._src import distributed

# Exit status of a process that lost a peer or a role (EX_TEMPFAIL: restart
# it).
LOST_PEER_EXIT = 75
# JAX may declare a silent task dead well before its heartbeat timeout has
# passed since the silence began (at 2x it sometimes beat the watchdog, whose
# message says more); at 4x the watchdog, which fires within 1.4x, speaks
# first.
JAX_HEARTBEAT_FACTOR = 4
EXITED = "exited"
_PREFIX = "scalerl_peers/"
_BEATS_PER_TIMEOUT = 4


class Watchdog:
  """Watches the other processes of this run; see the module docstring."""

  def __init__(self, timeout_s: float):
    self.timeout_s = float(timeout_s)
    self._me, self._count = jax.process_index(), jax.process_count()
    self._client = distributed.global_state.client
    self._interval = self.timeout_s / _BEATS_PER_TIMEOUT
    self._lock = threading.Lock()
    start = time.monotonic()
    self._answered = start  # When the coordination service last answered.
    # Process -> (its last counter, when this process first read it).
    self._seen: dict[int, tuple[Optional[str], float]] = {
        p: (None, start) for p in range(self._count) if p != self._me
    }
    self._exiting = threading.Event()  # This process ends normally.
    for target, name in ((self._beat, "beat"), (self._watch, "watch")):
      threading.Thread(
          target=target, name=f"peer_watchdog_{name}", daemon=True
      ).start()
    # atexit runs its handlers last in, first out: this one before JAX's
    # shutdown, whose barrier waits for every process.
    atexit.register(self.exiting)

  def exiting(self) -> None:
    """At interpreter exit: stops beating; keeps watching the others.

    After a normal end it tells the others so; after an uncaught exception it
    does not, and they count this process lost once its silence exceeds the
    timeout, as they would had it crashed.
    """
    self._exiting.set()
    if getattr(sys, "last_value", None) is not None:
      return
    try:
      self._client.key_value_set(
          f"{_PREFIX}{self._me}", EXITED, allow_overwrite=True
      )
    except Exception:  # pylint: disable=broad-except
      pass  # No service to tell: the others' runtime went with it.

  def _beat(self) -> None:
    """Writes this process's counter and reads the others', forever."""
    beats = 0
    while True:
      try:
        if not self._exiting.is_set():
          beats += 1
          self._client.key_value_set(
              f"{_PREFIX}{self._me}", str(beats), allow_overwrite=True
          )
        values = self._client.key_value_dir_get(_PREFIX)
      except Exception:  # pylint: disable=broad-except
        # Unanswered: `_watch` counts the silence. After JAX's shutdown there
        # is no client left to ask.
        if distributed.global_state.client is None:
          return
      else:
        self._record(values)
      time.sleep(self._interval)

  def _record(self, values: list[tuple[str, str]]) -> None:
    now = time.monotonic()
    with self._lock:
      self._answered = now
      for key, value in values:
        peer = int(key.rsplit("/", 1)[1])
        if peer not in self._seen:
          continue
        if value == EXITED:
          del self._seen[peer]
        elif self._seen[peer][0] != value:
          self._seen[peer] = (value, now)

  def _watch(self) -> None:
    """Exits the process once a peer or the service is silent too long."""
    while True:
      time.sleep(self._interval / 2)
      now = time.monotonic()
      with self._lock:
        silent = {p: now - t for p, (_, t) in self._seen.items()}
        service = now - self._answered
      if service > self.timeout_s:
        self._lost(
            0,
            service,
            "the coordination service it holds has not answered",
        )
      for peer, age in sorted(silent.items()):
        if age > self.timeout_s:
          self._lost(peer, age, "no heartbeat from it")

  def _lost(self, peer: int, age: float, how: str) -> None:
    message = (
        f"scalerl_jax: process {peer} of {self._count} is lost: {how} for "
        f"{age:.1f} s (mesh.peer_timeout_s={self.timeout_s:g}); it was "
        "killed, preempted or is stalled, or it failed (see its log). "
        f"Process {self._me} exits with status {LOST_PEER_EXIT} instead of "
        "waiting for it. Restart every process on the same workdir: the run "
        "resumes from the newest complete checkpoint.\n"
    )
    exit_lost(message)


def exit_lost(message: str) -> NoReturn:
  """Writes `message` to stderr and ends this process at once with
  `LOST_PEER_EXIT`, whatever its other threads wait in (a lost process,
  or a stalled role: rl/role_watchdog.py)."""
  # Not through logging, whose lock the stuck main thread may hold.
  os.write(2, message.encode())
  os._exit(LOST_PEER_EXIT)  # pylint: disable=protected-access


_watchdog: Optional[Watchdog] = None


def start(timeout_s: float) -> Optional[Watchdog]:
  """Starts this process's watchdog once JAX's runtime is up; idempotent.

  Nothing to watch (None) in a run of one process.
  """
  global _watchdog
  if _watchdog is None and jax.process_count() > 1:
    _watchdog = Watchdog(timeout_s)
  return _watchdog
