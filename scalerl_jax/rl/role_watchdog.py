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

Both roles live in one process, so a role killed is the process killed:
nothing survives to decode with half-moved weights, and a restart resumes
from the newest complete checkpoint. Validation and checkpoints (the
generator paused by the trainer) are not watched, nor is the fixed mode's one
host thread. Design: docs/design/disaggregated.md ("Faults").
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Optional

from etils import epath

from scalerl_jax.checkpoint import integrity
from scalerl_jax.multihost import peers

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
    return (
        f"{role}: {_NO_PROGRESS[role]} in {age:.1f} s "
        f"(buffer.role_stall_timeout_s={self.timeout_s:g}), {doing}. It is "
        f"hung or stalled (see its log); {then} instead of waiting. "
        "Restart on the same workdir: the run resumes from "
        f"{resume_point(self._checkpoints)}."
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
