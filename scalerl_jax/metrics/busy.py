"""When a role's devices held work: busy and idle seconds per step.

A `BusyClock` is told about a role's programs as they are dispatched
(`watch`: the program's outputs, or small ones dispatched right after it)
and records [dispatch, ready] for each. The ready time is observed by a host
thread of the clock's own, waiting on the outputs in dispatch order, so the
caller never blocks to measure: what JAX overlapped stays overlapped. One
clock a device set: a role's programs finish in the order they were
dispatched, so waiting in that order reads each ready time when it happens.
Only outputs no later call donates may be watched (a donated array is
deleted). `window(start, end)` is the union of the intervals within
[start, end], overlaps counted once; a program still running counts until
`end`, so reading a window never waits for one. Design:
docs/design/disaggregated.md ("Each role's busy and idle time").
"""

from __future__ import annotations

import math
import queue
import threading
import time
from typing import Any, Optional

import jax

# The clock's keys in metrics.jsonl: time/<role>_busy_s, _idle_s, _idle_frac.
ROLES = ("generator", "trainer")
# How long `window` waits for the clock's thread to record programs already
# ready (it is behind by a wake-up at most).
_RECORD_WAIT_S = 1.0


class BusyClock:
  """[dispatch, ready] intervals of one role's programs, and their union."""

  def __init__(self, role: str):
    self.role = role
    self._queue: queue.SimpleQueue = queue.SimpleQueue()
    self._lock = threading.Condition()
    # Watched, not yet seen ready: id -> (t0, tree).
    self._pending: dict[int, tuple[float, Any]] = {}
    self._next_id = 0
    self._intervals: list[tuple[float, float]] = []
    self._thread: Optional[threading.Thread] = None

  def watch(self, tree: Any, t0: Optional[float] = None) -> None:
    """Records [t0 (default: now), the time `tree`'s arrays are ready]."""
    t0 = time.perf_counter() if t0 is None else t0
    with self._lock:
      if self._thread is None:
        self._thread = threading.Thread(
            target=self._wait, name=f"busy-clock-{self.role}", daemon=True
        )
        self._thread.start()
      key, self._next_id = self._next_id, self._next_id + 1
      self._pending[key] = (t0, tree)
    self._queue.put(key)

  def span(self, t0: float, t1: float) -> None:
    """Records [t0, t1], timed by the caller (a program it waited for)."""
    with self._lock:
      self._intervals.append((t0, t1))

  def _wait(self) -> None:
    while True:
      key = self._queue.get()
      if key is None:
        return
      with self._lock:
        tree = self._pending[key][1]
      try:
        jax.block_until_ready(tree)
      except Exception:  # pylint: disable=broad-except
        pass  # The program failed: its caller reads the error, not the clock.
      ready = time.perf_counter()
      del tree  # Held no longer than measured.
      with self._lock:
        t0, _ = self._pending.pop(key)
        self._intervals.append((t0, ready))
        self._lock.notify_all()

  def window(self, start: float = -math.inf, end: float = math.inf) -> float:
    """Busy seconds within [start, end] (default: every interval recorded).

    Never waits for a program still running: one dispatched before `end`
    and not ready counts as busy until `end` (and from the next window's
    start on, once ready). It waits only for the clock's thread to record
    programs already ready. Intervals ending by `end` are dropped; the rest
    stay for the next window.
    """
    with self._lock:
      self._lock.wait_for(
          lambda: not any(
              t0 < end and _ready(tree) for t0, tree in self._pending.values()
          ),
          timeout=_RECORD_WAIT_S,
      )
      running = [(t0, end) for t0, _ in self._pending.values() if t0 < end]
      spans = sorted(self._intervals + running)
      self._intervals = [(a, b) for a, b in self._intervals if b > end]
    busy, reach = 0.0, start
    for a, b in spans:
      a, b = max(a, reach), min(b, end)
      if b > a:
        busy += b - a
        reach = b
    return busy

  def close(self) -> None:
    """Stops the clock's thread (once it has seen what it watches ready)."""
    with self._lock:
      thread, self._thread = self._thread, None
    if thread is not None:
      self._queue.put(None)
      thread.join()


def _ready(tree: Any) -> bool:
  return all(x.is_ready() for x in jax.tree.leaves(tree))


def scalars(busy: dict[str, float], wall: float) -> dict[str, float]:
  """time/<role>_busy_s, _idle_s and _idle_frac of a step `wall` seconds
  long, from each role's busy seconds in it."""
  row = {}
  for role, seconds in busy.items():
    row[f"time/{role}_busy_s"] = seconds
    row[f"time/{role}_idle_s"] = max(wall - seconds, 0.0)
    row[f"time/{role}_idle_frac"] = max(wall - seconds, 0.0) / max(wall, 1e-9)
  return row
