"""The terminal progress line of a run (tqdm): step/total, rate, ETA, values.

Off a terminal the same text is written as plain lines: at the start, at
most every `every_s` seconds, and at the end. Design: docs/design/metrics.md.
"""

from __future__ import annotations

import sys
from typing import Any, Optional, TextIO

import numpy as np
import tqdm


class _Bar(tqdm.tqdm):
  # No monitor thread: it only adjusts `miniters`, which is fixed at 1 here,
  # and the trainer's process forks verifier workers.
  monitor_interval = 0


class _Lines:
  """A file for tqdm that turns each redraw into a line of its own."""

  def __init__(self, stream: TextIO):
    self._stream = stream

  def write(self, text: str) -> None:
    line = text.replace("\r", "").strip()
    if line:
      self._stream.write(line + "\n")

  def flush(self) -> None:
    self._stream.flush()


class Progress:
  """One line: step/total, steps/s since the start, ETA and live values."""

  def __init__(
      self,
      total_steps: int,
      start_step: int = 0,
      every_s: float = 30.0,
      stream: Optional[TextIO] = None,
  ):
    """Shows the line at `start_step`, where the rate starts counting.

    `every_s` spaces plain lines off a terminal; `stream` defaults to stderr.
    """
    stream = stream if stream is not None else sys.stderr
    tty = stream.isatty()
    self._plain = not tty
    self._live: dict[str, float] = {}  # Shown in the order first given.
    self._bar = _Bar(
        total=total_steps,
        initial=start_step,
        unit="step",
        file=stream if tty else _Lines(stream),
        dynamic_ncols=tty,
        ncols=None if tty else 0,
        mininterval=0.1 if tty else every_s,
        miniters=1,
        smoothing=0,
    )

  def update(self, step: int, **live: Any) -> None:
    """Shows `step` and the `live` scalars; None keeps the value shown."""
    self._live.update(
        {
            name: float(np.asarray(v))
            for name, v in live.items()
            if v is not None
        }
    )
    self._bar.set_postfix(self._live, refresh=False)
    self._bar.update(step - self._bar.n)

  def close(self) -> None:
    """Shows the last step's line unless it was the last written, and ends."""
    if self._plain and self._bar.last_print_n == self._bar.n:
      self._bar.leave = False
    self._bar.close()
