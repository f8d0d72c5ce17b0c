"""Reading a run's `metrics.jsonl` (metrics/writer.py writes it): its lines,
and one row per step.

A step can be logged twice: a run resumed from a checkpoint cuts the lines
past it (`MetricWriter.truncate_after`), but a file copied mid-write, or
written by older code, may still hold both. The later line wins, as the
resumed run's.
"""

from __future__ import annotations

import json
import os
from typing import Iterator, Union

from scalerl_jax import workdir as workdir_lib

INCOMPLETE = (
    "an incomplete last line (still being written, or cut off by a kill)"
)


def path_of(workdir: str) -> str:
  """`<workdir>/metrics.jsonl`."""
  return os.path.join(workdir, workdir_lib.METRICS_FILE)


def lines(workdir: str) -> Iterator[tuple[str, Union[dict, str]]]:
  """Each non-blank line as (where, "path:lineno"; its row), or (where, why
  it is unusable) for a line that is not a JSON object.

  The file is read to its end once, then split: a run may be writing it (a
  half-run fit reads a live run). Iterating the open file would yield a line
  the writer has half written as one line and its rest, read next, as
  another; read at once, only the last piece can be cut, and it is named
  `INCOMPLETE` if it does not parse.
  """
  path = path_of(workdir)
  with open(path) as f:
    text = f.read()
  pieces = text.split("\n")
  for lineno, line in enumerate(pieces, 1):
    if not line.strip():
      continue
    where = f"{path}:{lineno}"
    try:
      row = json.loads(line)
    except json.JSONDecodeError as e:
      cut = lineno == len(pieces)  # No newline after it.
      yield where, INCOMPLETE if cut else f"not valid JSON ({e.msg})"
      continue
    yield where, row if isinstance(row, dict) else "not a JSON object"


def by_step(workdir: str) -> list[dict]:
  """One row per integer step, each step's last line, ordered by step;
  unusable lines left out."""
  last = {}
  for _, row in lines(workdir):
    if isinstance(row, dict) and is_step(row.get("step")):
      last[row["step"]] = row
  return [last[s] for s in sorted(last)]


def is_step(step) -> bool:
  """Whether `step` is a row's step: an int, not a bool."""
  return isinstance(step, int) and not isinstance(step, bool)
