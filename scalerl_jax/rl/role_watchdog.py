"""buffer.role_stall_timeout_s: a free-running role that stalls stops the run,
named (mesh.layout='disaggregated', buffer.sync_mode='free').

The generator's host thread and the trainer's wait on each other
(rl/free_running.py): the trainer for its batch, and for the generator to
pause between two calls; the generator, held back by k with nothing to
decode, for the trainer's next take or weights. A role that stalls without
raising (a device call that never returns, a deadlock, weights that never
arrive) would leave the other waiting without end. `RoleWatch` bounds those
waits: once the role waited on has made no progress for
`buffer.role_stall_timeout_s` (the generator: no decode call finished, nor a
wait of its own ended; the trainer: no batch taken, weights published or
pause ended), the run stops with a message naming the stalled role, what it
was doing and the checkpoint a restart resumes from:

  * the generator stalled: `RoleStalled` is raised in the trainer's thread,
    which closes the run; the generator's thread is joined only briefly (one
    stuck in a device call cannot be interrupted: it is left, a daemon, to
    end with the process).
  * the trainer stalled: nothing can raise in a thread stuck in a device
    call or in I/O, so the generator's thread writes the message and ends the
    process with status 75 (`peers.exit_lost`), as the peer watchdog ends a
    process that lost a peer.

The fixed mode (`buffer.sync_mode='fixed'`, disaggregated) has one host
thread, which drives both roles and waits on each in turn: the generator
(the weights' move, then every decode call, the calls decoding ahead of the
next step included) and the trainer (the train step). `StepWatch` names the
role it waits on and when it last progressed; a daemon thread ends the
process with status 75 once that wait outlasts the timeout, naming the role
and what it was doing, since nothing can raise in a thread stuck in a device
call.

Both roles live in one process, so a role killed is the process killed:
nothing survives to decode with half-moved weights, and a restart resumes
from the newest complete checkpoint. Validation and checkpoints (the
generator paused by the trainer) are not watched, in either mode.
Colocated runs are not watched: there the phases share one set of devices.
Design: docs/design/disaggregated.md ("Faults").
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Callable, Iterator, Optional

from etils import epath

from scalerl_jax import sharding
from scalerl_jax.checkpoint import integrity
from scalerl_jax.multihost import peers
from scalerl_jax.rl import weight_sync

GENERATOR, TRAINER = "generator", "trainer"
_NO_PROGRESS = {
    GENERATOR: "no decode call finished",
    TRAINER: "no train step finished",
}
# A bounded wait checks four times a timeout (the peer watchdog beats as
# often), so a stall is named between 1x and 1.25x the timeout.
_CHECKS_PER_TIMEOUT = 4


class RoleStalled(RuntimeError):
  """The generator made no progress for buffer.role_stall_timeout_s while
  the trainer waited on it; the run stops, naming it."""


class RoleWatch:
  """Each role's last progress; the trainer's wait on the generator and the
  generator's on the trainer, bounded."""

  def __init__(self, timeout_s: float, checkpoints: str):
    """`timeout_s`: buffer.role_stall_timeout_s (0: nothing is watched);
    `checkpoints`: the run's checkpoint directory, for the message."""
    self.timeout_s = float(timeout_s)
    self._checkpoints = checkpoints
    now = time.monotonic()
    self._last = {GENERATOR: now, TRAINER: now}
    self._trainer_did = "started"  # Its last progress, named if it stalls.
    self._trainer_waits = False
    self.generator_stalled = False

  @property
  def interval(self) -> Optional[float]:
    """A bounded wait's time between two checks; None (unbounded) if off."""
    return self.timeout_s / _CHECKS_PER_TIMEOUT if self.timeout_s else None

  def progressed(self, role: str, did: str = "") -> None:
    """`role` made progress (the trainer: `did`, where given)."""
    self._last[role] = time.monotonic()
    if did:
      self._trainer_did = did

  def overdue(self, role: str) -> Optional[float]:
    """Seconds since `role` last progressed, where past the timeout."""
    if not self.timeout_s:
      return None
    age = time.monotonic() - self._last[role]
    return age if age > self.timeout_s else None

  def wait_on_generator(
      self,
      cond: threading.Condition,
      done: Callable[[], bool],
      doing: Callable[[], str],
  ) -> None:
    """In the trainer's thread, `cond` held: waits until `done()`.

    Raises:
      RoleStalled: the generator made no progress for the timeout; the
        message says what it was `doing()`.
    """
    self._trainer_waits = True
    try:
      while not done():
        cond.wait(self.interval)
        age = self.overdue(GENERATOR)
        if age is not None and not done():
          self.generator_stalled = True
          raise RoleStalled(
              self._message(
                  GENERATOR, age, doing(), "the trainer stops the run"
              )
          )
    finally:
      self._trainer_waits = False
    self.progressed(TRAINER)

  def check_trainer(self, waiting: str) -> None:
    """In the generator's thread, `waiting` on the trainer (held back by
    k): ends the process once the trainer made no progress for the timeout,
    unless the trainer waits on the generator (and will name it)."""
    age = self.overdue(TRAINER)
    if age is None or self._trainer_waits:
      return
    message = self._message(
        TRAINER,
        age,
        f"since it {self._trainer_did}; the generator waits for it, {waiting}",
        f"the process exits with status {peers.LOST_PEER_EXIT}",
    )
    peers.exit_lost(f"scalerl_jax: {message}\n")

  def _message(self, role: str, age: float, doing: str, then: str) -> str:
    """`role` stalled for `age` s, `doing`; the run `then`."""
    return _message(role, age, self.timeout_s, doing, then, self._checkpoints)


class StepWatch:
  """The fixed mode's one host thread: the role it waits on, since when,
  and a daemon thread that ends the process once that wait outlasts the
  timeout. Inactive (no thread, nothing watched) at timeout 0."""

  def __init__(self, timeout_s: float, checkpoints: str):
    """As `RoleWatch`."""
    self.timeout_s = float(timeout_s)
    self._checkpoints = checkpoints
    # (role, what it is doing, when the wait began or last progressed).
    self._waiting: Optional[tuple[str, str, float]] = None
    self._closed = threading.Event()
    self._thread = None
    if self.timeout_s:
      self._thread = threading.Thread(
          target=self._watch, name="step-watch", daemon=True
      )
      self._thread.start()

  @classmethod
  def for_config(cls, config, checkpoints: str) -> "StepWatch":
    """Active (at buffer.role_stall_timeout_s) in the fixed mode of the
    disaggregated layout; `checkpoints` as `RoleWatch`'s."""
    fixed = (
        sharding.layout_of(config.mesh) == sharding.LAYOUTS[1]
        and config.buffer.sync_mode == weight_sync.SYNC_MODES[0]
    )
    return cls(
        config.buffer.role_stall_timeout_s if fixed else 0.0, checkpoints
    )

  @property
  def waiting(self) -> Optional[tuple[str, str]]:
    """(role, doing) that the host thread waits on; None: neither."""
    return self._waiting and self._waiting[:2]

  def waits_on(self, role: str, doing: str) -> None:
    """The host thread now waits on `role`, `doing`; also its progress."""
    self._waiting = (role, doing, time.monotonic())

  @contextlib.contextmanager
  def on(self, role: str, doing: str) -> Iterator[None]:
    """Waits on `role` inside; after, on what it waited on before (its
    clock restarted: the decoding ahead of the next step inside the
    trainer's step), or on nothing (validation and checkpoints are not
    watched)."""
    before = self._waiting
    self.waits_on(role, doing)
    try:
      yield
    finally:
      self._waiting = before and (*before[:2], time.monotonic())

  def close(self) -> None:
    self._closed.set()

  def _watch(self) -> None:
    while not self._closed.wait(self.timeout_s / _CHECKS_PER_TIMEOUT):
      waiting = self._waiting
      if waiting is None:
        continue
      role, doing, since = waiting
      age = time.monotonic() - since
      if age > self.timeout_s and not self._closed.is_set():
        peers.exit_lost(
            "scalerl_jax: "
            + _message(
                role,
                age,
                self.timeout_s,
                f"{doing}; the one host thread waits on it",
                f"the process exits with status {peers.LOST_PEER_EXIT}",
                self._checkpoints,
            )
            + "\n"
        )


def _message(
    role: str,
    age: float,
    timeout_s: float,
    doing: str,
    then: str,
    checkpoints: str,
) -> str:
  """`role` stalled for `age` s, `doing`; the run `then`."""
  return (
      f"{role}: {_NO_PROGRESS[role]} in {age:.1f} s "
      f"(buffer.role_stall_timeout_s={timeout_s:g}), {doing}. It is "
      f"hung or stalled (see its log); {then} instead of waiting. "
      "Restart on the same workdir: the run resumes from "
      f"{resume_point(checkpoints)}."
  )


def resume_point(directory: str) -> str:
  """The checkpoint a restart resumes from, as the files stand: read
  without orbax, whose lock the stalled thread may hold."""
  try:
    steps = [
        int(p.name)
        for p in epath.Path(directory).iterdir()
        if p.name.isdigit() and (p / integrity.MANIFEST).exists()
    ]
  except OSError:
    steps = []
  if not steps:
    return f"its start (no complete checkpoint in {directory} yet)"
  return f"the newest complete checkpoint, step {max(steps)} in {directory}"
