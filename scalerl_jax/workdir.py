"""The files that mark a run's workdir: its lock and its finish marker.

One home for both names: the trainer takes the lock and writes the marker,
the sweep runner (sweep.py) skips points whose marker exists, and neither
imports the other.
"""

from __future__ import annotations

import fcntl
import os
from typing import IO

DONE_FILE = "DONE"  # Written when a run has finished all its steps.
LOCK_FILE = ".lock"  # Held by the process that trains in a workdir.


def lock_workdir(workdir: str) -> IO[str]:
  """Takes the workdir's lock, or raises if another process trains there.

  Returns:
    The open lock file; the lock lasts until it is closed or the process ends.

  Raises:
    RuntimeError: another process holds the lock (its pid is named).
  """
  os.makedirs(workdir, exist_ok=True)
  handle = open(os.path.join(workdir, LOCK_FILE), "a+")
  try:
    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except BlockingIOError:
    handle.seek(0)
    owner = handle.read().strip() or "unknown"
    handle.close()
    raise RuntimeError(
        f"{workdir}: another process (pid {owner}) is training in this workdir; "
        "two runs must not share one") from None
  handle.seek(0)
  handle.truncate()
  handle.write(str(os.getpid()))
  handle.flush()
  return handle
