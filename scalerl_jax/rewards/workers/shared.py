"""Scoring in a multi-controller run: each completion verified once, shared.

Process i verifies the i-th contiguous share of the completions in its own
`RewardPool`; scores and counts are all-gathered, so every process takes the
same decisions. Design: docs/design/rewards.md.
"""

from __future__ import annotations

from concurrent import futures
from typing import Any, Mapping, Optional, Sequence

import jax
from jax.experimental import multihost_utils
import numpy as np

from scalerl_jax.rewards.workers.pool import RewardPool

# Stats summed over the processes' shares; slowest_s and wall_s: the maximum.
_SUMMED = (
    "num_completions",
    "num_timeouts",
    "num_errors",
    "num_crashes",
    "num_invalid",
    "num_worker_restarts",
)
_MAXED = ("slowest_s", "wall_s")


class SharedRewardPool:
  """`RewardPool.score` split over the processes, the result shared.

  Every process must call `score`, or `submit` and its handle's `result`,
  with the same arguments in the same order: they are collectives.
  """

  def __init__(self, pool: RewardPool):
    self.pool = pool

  def score(
      self, completions: Sequence[Any], records: Sequence[Mapping[str, Any]]
  ) -> tuple[np.ndarray, dict[str, float]]:
    """`RewardPool.score` of all completions; the same on every process.

    Raises:
      ValueError, RuntimeError: on every process, when any share raised.
    """
    return self.submit(completions, records).result()

  def submit(
      self, completions: Sequence[Any], records: Sequence[Mapping[str, Any]]
  ) -> SharedScoring:
    """Starts verifying this process's share; returns at once.

    Raises:
      ValueError: the lengths differ.
    """
    if len(completions) != len(records):
      raise ValueError(
          f"score: {len(completions)} completions but {len(records)} records"
      )
    n, me = len(completions), jax.process_index()
    if not n:  # The same on every process: nothing to gather.
      return SharedScoring(0, 0, self.pool.submit(completions, records))
    share = -(-n // jax.process_count())
    lo, hi = min(me * share, n), min((me + 1) * share, n)
    return SharedScoring(
        n,
        share,
        self.pool.submit(completions[lo:hi], records[lo:hi])
        if hi > lo
        else None,
    )

  def close(self) -> None:
    """Closes this process's pool."""
    self.pool.close()

  def __enter__(self) -> SharedRewardPool:
    return self

  def __exit__(self, *exc_info) -> None:
    self.close()


class SharedScoring:
  """This process's share of a `SharedRewardPool.submit` call, being verified.

  `n` completions in all, `share` per process; `mine` is None when empty.
  """

  def __init__(self, n: int, share: int, mine: Optional[futures.Future]):
    self._n, self._share, self._mine = n, share, mine
    self._result: Optional[tuple[np.ndarray, dict[str, float]]] = None

  def result(self) -> tuple[np.ndarray, dict[str, float]]:
    """Waits for this share, then all-gathers them; raises as `score` does."""
    if self._result is None:
      self._result = self._gather() if self._n else self._mine.result()
    return self._result

  def _gather(self) -> tuple[np.ndarray, dict[str, float]]:
    scores = np.zeros(self._share, np.float32)
    # Summed counts, the maxima, mean_s x timed verifications, their count,
    # and whether this share failed.
    info = np.zeros(len(_SUMMED) + len(_MAXED) + 3, np.float64)
    error = None
    try:
      if self._mine is not None:
        mine, stats = self._mine.result()
        scores[: len(mine)] = mine
        timed = stats["num_completions"] - stats["num_invalid"]
        info[:-1] = (
            [stats[k] for k in _SUMMED]
            + [stats[k] for k in _MAXED]
            + [stats["mean_s"] * timed, timed]
        )
    except (ValueError, RuntimeError) as e:
      error, info[-1] = e, 1.0
    all_scores, all_info = multihost_utils.process_allgather((scores, info))
    if error is not None:
      raise error
    failed = np.flatnonzero(all_info[:, -1])
    if failed.size:
      raise RuntimeError(
          f"score: verifying failed on processes {failed.tolist()}; "
          "their logs name the cause"
      )
    total = all_info.sum(axis=0)
    stats = {k: int(total[i]) for i, k in enumerate(_SUMMED)}
    stats.update(
        {
            k: float(all_info[:, len(_SUMMED) + i].max())
            for i, k in enumerate(_MAXED)
        }
    )
    timed = total[-2]
    stats["mean_s"] = float(total[-3] / timed) if timed else 0.0
    return all_scores.reshape(-1)[: self._n], stats
