"""`RewardPool`: verifiers in killable worker processes with a per-call timeout.

Each verification runs in a worker forked by the pool's fork server
(processes.py) and gets rewards.timeout_s; an overrunning worker is
SIGKILLed with its sandboxed process groups and replaced. Timed-out, crashed
and failed verifications score 0 and are counted. Calls run one at a time.

Shape letters: the package key (scalerl_jax/__init__.py), and C completions
of one `score` call. Design: docs/design/rewards.md.
"""

from __future__ import annotations

import collections
from concurrent import futures
import dataclasses
from multiprocessing import connection as mp_connection
import threading
import time
from typing import Any, Mapping, Sequence

from absl import logging
import numpy as np

from scalerl_jax.rewards import registry
from scalerl_jax.rewards.sandbox import isolation
from scalerl_jax.rewards.workers import worker
from scalerl_jax.rewards.workers.processes import START_TIMEOUT_S
from scalerl_jax.rewards.workers.processes import WorkerProcesses


@dataclasses.dataclass
class _Batch:
  """Results and counters of one `score` call."""

  scores_C: np.ndarray
  seconds_C: np.ndarray
  timeouts: int = 0
  errors: int = 0
  crashes: int = 0
  first_error: str = ""


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
    self._lock = threading.Lock()  # One call at a time, from whichever thread.
    # `submit`'s thread lives as long as the pool: a fork server dies with the
    # thread that started it (PR_SET_PDEATHSIG).
    self._thread = futures.ThreadPoolExecutor(
        max_workers=1, thread_name_prefix="reward_pool"
    )
    self._workers = WorkerProcesses(self._settings, rewards_config.num_workers)

  @property
  def timeout_s(self) -> float:
    """Wall-clock limit of one verification."""
    return self._timeout_s

  def _receive(self, index: int, batch: _Batch, now: float) -> None:
    """Handles the messages waiting from worker `index`; replaces it if dead."""
    slot = self._workers.slots[index]
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
      self._workers.replace(index)

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
      if not self._workers.slots:
        raise RuntimeError("score: this RewardPool is closed")
      return self._score(completions, records)

  def submit(
      self, completions: Sequence[Any], records: Sequence[Mapping[str, Any]]
  ) -> futures.Future:
    """A future of `score`, run in the pool's own thread; returns at once.

    Raises:
      RuntimeError: the pool is closed.
    """
    if not self._workers.slots:
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
    self._workers.begin_call()
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
    while pending or any(slot.task is not None for slot in self._workers.slots):
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
        "num_worker_restarts": self._workers.restarts,
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
    for index, slot in enumerate(self._workers.slots):
      if not (pending and slot.ready and slot.task is None):
        continue
      i, completion = pending.popleft()
      try:
        slot.conn.send((i, completion, records[i], specs[i]))
      except (BrokenPipeError, OSError):
        # The worker died idle: not this input's fault.
        pending.appendleft((i, completion))
        self._workers.replace(index)
        continue
      slot.task, slot.sent = i, time.monotonic()

  def _wait(self, batch: _Batch) -> None:
    """Waits for messages or the nearest deadline, then enforces deadlines."""
    deadlines = []
    for slot in self._workers.slots:
      if slot.task is not None:
        deadlines.append(slot.sent + self._timeout_s)
      elif not slot.ready:
        deadlines.append(slot.started + START_TIMEOUT_S)
    waiting = [
        slot.conn
        for slot in self._workers.slots
        if slot.task is not None or not slot.ready
    ]
    if waiting:
      mp_connection.wait(
          waiting, timeout=max(0.0, min(deadlines) - time.monotonic())
      )
    now = time.monotonic()
    for index in range(len(self._workers.slots)):
      self._receive(index, batch, now)
      slot = self._workers.slots[index]
      if slot.task is not None and now >= slot.sent + self._timeout_s:
        batch.timeouts += 1
        batch.seconds_C[slot.task] = now - slot.sent
        self._workers.replace(index)
      elif not slot.ready and now >= slot.started + START_TIMEOUT_S:
        raise RuntimeError(
            f"A reward worker did not start within {START_TIMEOUT_S:.0f} s"
        )

  def close(self) -> None:
    """Stops the fork server, its workers and what they left. Idempotent.

    A running submitted call finishes first; those not started are cancelled.
    """
    self._thread.shutdown(wait=True, cancel_futures=True)
    self._workers.close()

  def __enter__(self) -> RewardPool:
    return self

  def __exit__(self, *exc_info) -> None:
    self.close()
