"""The trainer's weights on the generator's devices, and what moving them
cost: bytes and seconds per step (mesh.layout='disaggregated').

`WeightSync.get` moves a version's weights once (`Experiment.to_generator`:
`jax.device_put` into the generator's shardings, cast on the trainer's
devices first under mesh.transfer_dtype='bfloat16'): validation of version v
and step v's generation share the move. Each move's bytes are counted from
the shapes and shardings sent; its seconds, from dispatch until the arrays
are ready on the generator's devices, are read by a `busy.BusyClock` of its
own, so nothing waits for the transfer to measure it. Colocated, nothing
moves and nothing is counted. Design: docs/design/disaggregated.md.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any, Optional

from scalerl_jax.metrics import busy

# mesh.transfer_dtype: the dtype of the weights the sampler computes with
# sent as such (bfloat16 needs model.compute_dtype='bfloat16'); the norm
# scales and the FP32 head stay float32 (`decode.cast_for_prepare`).
TRANSFER_DTYPES = ("float32", "bfloat16")
# buffer.sync_mode: "fixed", swaps at buffer.sync_at_decode_step (one host
# thread, reproducible); "free", a generator thread that never waits for the
# trainer (rl/free_running.py).
SYNC_MODES = ("fixed", "free")

BYTES_KEY = "sync/bytes"
SECONDS_KEY = "time/sync_s"


class WeightSync:
  """Moves the trainer's weights to the generator, once a version."""

  def __init__(self, exp: Any):
    """`exp`: the `Experiment` (its `to_generator` and `transfer_bytes`)."""
    self._exp = exp
    self.moves = exp.generator_param_shardings is not None
    self._kept: Optional[tuple[int, Any]] = None
    self._bytes = 0
    self._lock = threading.Lock()
    self._clock = busy.BusyClock("sync")
    self._since = -math.inf  # The end of the last `scalars` window.

  def get(self, params: Any, version: int, keep: bool = False) -> Any:
    """`params` (policy `version`) on the generator's devices.

    `keep`: held for the next call at the same version (validation's move,
    then the step's generation), which takes it without a second move.
    """
    if not self.moves:
      return params
    with self._lock:
      kept, self._kept = self._kept, None
      if kept is not None and kept[0] == version:
        if keep:
          self._kept = kept
        return kept[1]
      moved = self._exp.to_generator(params)
      self._clock.watch(moved)
      self._bytes += self._exp.transfer_bytes(params)
      if keep:
        self._kept = (version, moved)
      return moved

  def scalars(self) -> dict[str, float]:
    """Bytes and seconds of the moves since the last call (none colocated).

    Seconds: the union of the moves' [dispatch, ready] intervals since the
    last call; a move still under way counts until now, and the rest of it
    in the next call.
    """
    if not self.moves:
      return {}
    now = time.perf_counter()
    with self._lock:
      moved, self._bytes = self._bytes, 0
    seconds = self._clock.window(self._since, now)
    self._since = now
    return {BYTES_KEY: float(moved), SECONDS_KEY: seconds}

  def close(self) -> None:
    self._kept = None
    self._clock.close()
