"""buffer.sync_mode='free': the generator on a host thread of its own, never
waiting for the trainer (mesh.layout='disaggregated').

`FreeGenerator` drives `Generation`'s slot runner from its own thread: it
fills the slots, dispatches decode calls and harvests, scores and stores
groups without waiting for the trainer. The trainer (the main thread)
`take`s each step's P groups, waiting only while they are unfinished, and
`publish`es each new version's weights once its step is done; between two
decode calls the generator swaps in the newest published weights whose move
has arrived (sequences in flight continue on their KV cache; each token
keeps the version and log-prob it was sampled with) and records the swap.
Lag: a group is started only within `Schedule.max_starts(V, backlog,
V - w)`, V the version of the next batch the trainer takes and w the
generator's weights, so none lags more than k; held back with nothing in
flight, the generator waits for a take or new weights. `paused()` holds it
between two calls, nothing in flight or being scored, for validation and
checkpoints. A failure of the generator's thread stops the run with
`GeneratorError`, naming it; a role that stalls while the other waits on it
stops it too, named (`role_watchdog`, buffer.role_stall_timeout_s); `stop`
joins the thread. The trainer's host reads the generator's scalars from a
snapshot taken between calls. Design: docs/design/disaggregated.md
("Free-running generation", "Faults").
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Optional

from absl import logging
import jax
import ml_collections

from scalerl_jax.rl import role_watchdog
from scalerl_jax.rl import weight_sync
from scalerl_jax.rl.buffer import Group
from scalerl_jax.rl.generation import Generation
from scalerl_jax.sampling.sampler import Sampler

# How long `stop` waits for a thread found stalled before leaving it.
_JOIN_STALLED_S = 1.0


class GeneratorError(RuntimeError):
  """The generator's host thread failed; the run stops, naming it."""


class FreeGenerator:
  """The generator, free-running on a host thread; the trainer's side of it
  has `Generation`'s names for the batches and the scalars."""

  @classmethod
  def for_config(cls, config, *args) -> Optional["FreeGenerator"]:
    """One under buffer.sync_mode='free' (its thread started by the first
    step), else None; `args` as `__init__`'s."""
    free = config.buffer.sync_mode == weight_sync.SYNC_MODES[1]
    return cls(config, *args) if free else None

  def __init__(
      self,
      config: ml_collections.ConfigDict,
      generation: Generation,
      sampler: Sampler,
      checkpoints: str,
  ):
    """`checkpoints`: the run's checkpoint directory, named when a role
    stalls."""
    self._gen = generation
    self._sampler = sampler
    self._clock = generation.slot_runner.clock
    self._overlap = config.rewards.overlap
    self._steps = config.sampling.decode_steps_per_call
    self._cond = threading.Condition()
    self._thread: Optional[threading.Thread] = None
    # Generator thread's: the weights in use and their version.
    self._params: Any = None
    self._version = 0
    self._published: Optional[tuple[int, Any]] = None  # Newest, not swapped.
    self._taken = 0  # V: the version of the next batch the trainer takes.
    self._scoring = 0  # Groups harvested and not yet in the buffer.
    self._pause = self._paused = self._stop = False
    self._error: Optional[BaseException] = None
    self._watch = role_watchdog.RoleWatch(
        config.buffer.role_stall_timeout_s, checkpoints
    )
    self._doing = "starting"  # For the message naming it stalled.
    self._decoded = 0  # Decode steps dispatched by the thread.
    self._decoded_at_take: dict[int, int] = {}
    self._snapshot: dict[str, Any] = {}
    # (version, decode steps dispatched before it, decode steps since its
    # batch was taken, groups in flight across it): every swap, in order.
    self.swaps: list[tuple[int, int, int, int]] = []
    self._reported = (0, 0)  # (swaps, decode steps) at the last line.

  @property
  def started(self) -> bool:
    return self._thread is not None

  # The trainer's side.

  def start(self, moved: Any, version: int) -> None:
    """Starts the thread with `moved` (on the generator's devices) as
    `version`'s weights, the trainer about to take batch `version`."""
    self._params = self._sampler.prepare(moved)
    self._version = self._taken = version
    self._take_snapshot()
    self._watch.progressed(role_watchdog.GENERATOR)
    self._watch.progressed(role_watchdog.TRAINER, "started the generator")
    self._thread = threading.Thread(
        target=self._run, name="free-generator", daemon=True
    )
    self._thread.start()

  def wait_for_batch(self, version: int) -> None:
    """Waits until the buffer holds batch `version`'s P groups finished.

    Raises:
      GeneratorError: the generator's thread failed.
      RoleStalled: it made no progress for buffer.role_stall_timeout_s.
      StopIteration: it stopped because every training prompt is retired.
    """
    k, p = self._gen.max_off_policy, self._gen.prompts_per_step
    ready = lambda: self._gen.buffer.num_ready(version, k) >= p
    with self._cond:
      self._wait_on_generator(lambda: self._error is not None or ready())
      if not ready():
        self._raise()

  def take(self, version: int) -> list[Group]:
    """Batch `version`'s P groups (`wait_for_batch` first)."""
    self.wait_for_batch(version)
    with self._cond:
      groups = self._gen.take(version)
      self._taken = version + 1
      self._decoded_at_take[version] = self._decoded
      self._trainer_progressed(f"took step {version}'s batch")
    return groups

  def publish(self, moved: Any, version: int) -> None:
    """`version`'s weights, moved to the generator's devices: swapped in
    between two decode calls once they have arrived."""
    with self._cond:
      self._published = (version, moved)
      self._trainer_progressed(f"published version {version}'s weights")

  @contextlib.contextmanager
  def paused(self):
    """Holds the generator between two calls, nothing in flight or being
    scored (its state may be read and checkpointed), for the block."""
    with self._cond:
      self._pause = True
      self._cond.notify_all()
      try:
        self._wait_on_generator(lambda: self._paused or not self._alive())
      except role_watchdog.RoleStalled:
        self._pause = False
        raise
      if self._error is not None and not isinstance(self._error, StopIteration):
        self._pause = False
        self._raise()
    try:
      yield
    finally:
      with self._cond:
        self._pause = False
        self._trainer_progressed("ended a validation or checkpoint")

  def stop(self) -> None:
    """Stops the thread and waits for it (it ends its current call)."""
    with self._cond:
      self._stop = True
      self._cond.notify_all()
    if self._thread is not None:
      # A healthy thread ends within a call; one found stalled may never.
      timeout = self._watch.timeout_s or None
      stalled = self._watch.generator_stalled
      self._thread.join(_JOIN_STALLED_S if stalled else timeout)
      if self._thread.is_alive():
        logging.error(
            "generator: its host thread did not stop (%s); it is left to "
            "end with the process",
            self._doing,
        )
      self._thread = None

  def step_scalars(self) -> dict[str, float]:
    """Since the last call: decode steps dispatched, swaps, and the decode
    steps after its batch's take at which the latest swap came; the
    weights' version now."""
    with self._cond:
      swaps, decoded = len(self.swaps), self._decoded
      row = {
          "generator/decode_steps": float(decoded - self._reported[1]),
          "generator/swaps": float(swaps - self._reported[0]),
          "generator/weights_version": float(self._version),
      }
      if swaps > self._reported[0]:
        row["generator/swap_decode_step"] = float(self.swaps[-1][2])
      self._reported = (swaps, decoded)
    return row

  # `Generation`'s scalars, as the generator's thread last saw them.

  @property
  def flops(self) -> int:
    with self._cond:
      return self._snapshot["flops"]

  def scalars(self) -> dict[str, float]:
    with self._cond:
      return dict(self._snapshot["scalars"])

  def curriculum_scalars(self) -> dict[str, float]:
    with self._cond:
      return dict(self._snapshot["curriculum"])

  def work_scalars(self) -> dict[str, float]:
    with self._cond:
      return dict(self._snapshot["work"])

  # The generator's thread.

  def _alive(self) -> bool:
    return self._thread is not None and self._thread.is_alive()

  def _raise(self) -> None:
    error = self._error
    if isinstance(error, StopIteration):
      raise StopIteration
    raise GeneratorError(
        f"generator: its host thread failed after {self._decoded} decode "
        f"steps, with weights of version {self._version}: "
        f"{type(error).__name__}: {error}"
    ) from error

  def _trainer_progressed(self, did: str) -> None:
    """Under the lock: the trainer did `did`, which the generator may wait
    for."""
    self._watch.progressed(role_watchdog.TRAINER, did)
    self._cond.notify_all()

  def _wait_on_generator(self, done) -> None:
    """Under the lock, in the trainer's thread: waits until `done()`; raises
    RoleStalled once the generator made no progress for the timeout."""
    self._watch.wait_on_generator(
        self._cond,
        done,
        lambda: f"with weights of version {self._version} and "
        f"{self._gen.slot_runner.in_flight} groups in flight, {self._doing}",
    )

  def _run(self) -> None:
    try:
      self._loop()
    except BaseException as e:  # pylint: disable=broad-except
      if not isinstance(e, StopIteration):
        logging.exception("generator: its host thread failed")
      with self._cond:
        self._error = e
        self._cond.notify_all()

  def _loop(self) -> None:
    runner = self._gen.slot_runner
    in_call = False  # A decode call dispatched and not harvested.
    while True:
      with self._cond:
        self._take_snapshot()
        self._cond.notify_all()
        starts = self._between_calls(in_call)
      if starts is None:
        return
      self._watch.progressed(role_watchdog.GENERATOR)
      if not in_call:
        self._doing = f"starting {starts} groups"
        runner.fill(self._params, starts)
        if not self._dispatch():
          continue
      groups, scoring = runner.harvest()
      in_call = False
      with self._cond:
        self._scoring = len(groups)
        # Decided now, the next call decodes while the verifiers score.
        ahead = self._overlap and not (self._pause or self._stop)
        starts = self._starts() if ahead else 0
      if ahead and runner.fill(self._params, starts, pull=False) is not None:
        in_call = self._dispatch()
      self._doing = f"waiting for the scores of {len(groups)} groups"
      runner.collect(groups, scoring)
      for g in groups:
        self._gen.curriculum.update([g.record["id"]], g.scores_G[None])
      with self._cond:
        for g in groups:
          self._gen.buffer.add(g)
        self._scoring = 0

  def _between_calls(self, in_call: bool) -> Optional[int]:
    """Under the lock, between two calls: pauses, stops (None), swaps in
    new weights; the groups to start now. Waits while held back by k with
    nothing in flight."""
    while True:
      if self._stop:
        return None
      if self._pause and not in_call:
        self._paused = True
        self._cond.notify_all()
        self._cond.wait()
        continue
      self._paused = False
      if in_call:
        return 0
      starts = self._starts()
      if starts or self._gen.slot_runner.in_flight:
        return starts
      if self._published is not None:
        # Nothing to do but swap: wait for the move, which notifies no one.
        version, moved = self._published
        self._doing = f"waiting for version {version}'s weights to arrive"
        self._cond.release()
        try:
          jax.block_until_ready(moved)
        finally:
          self._cond.acquire()
        continue
      self._doing = "held back by k with nothing to decode"
      self._cond.wait(self._watch.interval)
      self._watch.check_trainer(
          f"held back by k with weights of version {self._version}"
      )

  def _starts(self) -> int:
    """Under the lock: swaps in the newest weights if they have arrived; the
    groups `Schedule.max_starts` allows now."""
    if self._published is not None and _arrived(self._published[1]):
      (version, moved), self._published = self._published, None
      self._params = self._sampler.prepare(moved)
      if self._clock is not None:
        self._clock.watch(self._params.weights)
      since = self._decoded - self._decoded_at_take.get(
          version - 1, self._decoded
      )
      for v in [v for v in self._decoded_at_take if v < version]:
        del self._decoded_at_take[v]
      self.swaps.append(
          (version, self._decoded, since, self._gen.slot_runner.in_flight)
      )
      self._version = version
    backlog = (
        self._gen.slot_runner.in_flight + len(self._gen.buffer) + self._scoring
    )
    return self._gen.schedule.max_starts(
        self._taken, backlog, self._taken - self._version
    )

  def _dispatch(self) -> bool:
    """Dispatches a decode call if a sequence is in flight; whether it did."""
    if not self._gen.slot_runner.in_flight:
      return False
    self._doing = (
        f"decoding its call of {self._steps} steps from decode step "
        f"{self._decoded}"
    )
    self._gen.slot_runner.dispatch(self._params, self._version, self._steps)
    with self._cond:
      self._decoded += self._steps
    return True

  def _take_snapshot(self) -> None:
    self._snapshot = {
        "flops": self._gen.flops,
        "scalars": self._gen.scalars(),
        "curriculum": self._gen.curriculum_scalars(),
        "work": self._gen.work_scalars(),
    }


def paused(free: Optional[FreeGenerator]):
  """`free.paused()`; a context that does nothing where `free` is None."""
  return free.paused() if free is not None else contextlib.nullcontext()


def _arrived(tree: Any) -> bool:
  """Whether every array of `tree` is ready (its move has arrived)."""
  return all(x.is_ready() for x in jax.tree.leaves(tree))
