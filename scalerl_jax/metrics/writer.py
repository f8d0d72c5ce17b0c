"""Metric writers: a run's `metrics.jsonl` and TensorBoard event files.

Each line of `metrics.jsonl` is one JSON object: an int "step" and scalar
metrics; the same scalars go to TensorBoard under `tb/`. Only process 0
writes. Design: docs/design/metrics.md.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import tempfile
import time
from typing import Any, Mapping, Optional, TextIO

from absl import logging
import jax
import numpy as np

from scalerl_jax import workdir as workdir_lib


def _import_tensorboardx():
  """tensorboardX, imported without importing torch.

  Where torch is installed (the hf extras install it), tensorboardX's writer
  imports it at import only to accept torch tensors, about half of every run
  process's start (docs/testing.md). This writer logs Python numbers, so
  torch is hidden for that one import (`import torch` raises ImportError,
  which tensorboardX expects) and is importable again after it. Where
  something imported torch already, nothing is hidden.
  """
  if "torch" in sys.modules:
    return importlib.import_module("tensorboardX")
  sys.modules["torch"] = None  # type: ignore[assignment]
  try:
    return importlib.import_module("tensorboardX")
  finally:
    del sys.modules["torch"]


tensorboardX = _import_tensorboardx()


def _plain(value: Any) -> int | float:
  """A Python int or float from a Python/numpy/JAX scalar."""
  array = np.asarray(value)
  if array.shape != ():
    raise ValueError(f"metric value of shape {array.shape} is not a scalar")
  if np.issubdtype(array.dtype, np.integer):
    return int(array)
  return float(array)


class MetricWriter:
  """Appends scalar metrics to `<workdir>/metrics.jsonl` and TensorBoard files.

  Each `write` is flushed before it returns, so a killed run keeps every line
  written. Non-primary processes write nothing.
  """

  def __init__(self, workdir: str, is_primary: Optional[bool] = None):
    """Creates `workdir` (on the primary); files open on the first write.

    `is_primary` None means `jax.process_index() == 0`, decided here (not at
    import) so that it follows `jax.distributed.initialize`.
    """
    self.workdir = workdir
    self.is_primary = (
        jax.process_index() == 0 if is_primary is None else is_primary
    )
    self.path = os.path.join(workdir, workdir_lib.METRICS_FILE)
    self._jsonl: Optional[TextIO] = None
    self._tb: Optional[tensorboardX.SummaryWriter] = None
    self._purge_step: Optional[int] = None
    if self.is_primary:
      os.makedirs(workdir, exist_ok=True)

  def write(self, step: int, scalars: Mapping[str, Any]) -> None:
    """Writes `{"step": step, **scalars}` (Python, numpy or JAX scalars)."""
    if not self.is_primary:
      return
    if "step" in scalars:
      raise ValueError("metric name 'step' is reserved for the step number")
    values = {name: _plain(v) for name, v in scalars.items()}
    if self._jsonl is None:
      self._jsonl = open(self.path, "a")
    self._jsonl.write(json.dumps({"step": int(step), **values}) + "\n")
    self._jsonl.flush()
    if self._tb is None:
      # A unique suffix: tensorboardX names files by the second, and a writer
      # reopened within that second would overwrite the previous file.
      self._tb = tensorboardX.SummaryWriter(
          os.path.join(self.workdir, workdir_lib.TB_DIR),
          purge_step=self._purge_step,
          filename_suffix=f".{time.time_ns()}",
      )
    for name, value in values.items():
      self._tb.add_scalar(name, value, int(step))
    self._tb.flush()

  def truncate_after(self, step: int) -> None:
    """Drops every line after `step`, for a run resuming from that step.

    The file is rewritten atomically; a last line cut off by a kill is dropped
    with a warning. TensorBoard's next event file purges the steps after it.
    """
    if not self.is_primary:
      return
    self.close()
    self._purge_step = step + 1
    if not os.path.exists(self.path):
      return
    kept, dropped = [], 0
    with open(self.path) as f:
      lines = f.read().splitlines()
    for lineno, line in enumerate(lines, 1):
      if not line.strip():
        continue
      try:
        row_step = json.loads(line)["step"]
      except (json.JSONDecodeError, TypeError, KeyError) as e:
        if lineno == len(lines):
          logging.warning(
              "%s:%d: dropping an incomplete last line (%s)",
              self.path,
              lineno,
              e,
          )
          continue
        raise ValueError(
            f"{self.path}:{lineno}: not a metrics line ({e!r}); fix or remove it "
            "before resuming"
        ) from e
      if row_step <= step:
        kept.append(line + "\n")
      else:
        dropped += 1
    fd, tmp = tempfile.mkstemp(
        dir=self.workdir, prefix=workdir_lib.METRICS_FILE + ".", suffix=".tmp"
    )
    try:
      with os.fdopen(fd, "w") as f:
        f.writelines(kept)
        f.flush()
        os.fsync(f.fileno())
      os.replace(tmp, self.path)
    except BaseException:
      os.unlink(tmp)
      raise
    if dropped:
      logging.info(
          "%s: dropped %d lines after step %d (resuming)",
          self.path,
          dropped,
          step,
      )

  def close(self) -> None:
    """Closes the files; a later `write` reopens them."""
    if self._jsonl is not None:
      self._jsonl.close()
      self._jsonl = None
    if self._tb is not None:
      self._tb.close()
      self._tb = None

  def __enter__(self) -> "MetricWriter":
    return self

  def __exit__(self, *exc) -> None:
    self.close()
