"""Scoring in a multi-controller run: every completion verified once, the scores shared.

Every process of a multi-controller run holds the same completions (the
sampler's harvest is replicated) and must take the same decisions from their
scores: which groups are zero-variance, which prompts the curriculum retires,
what the buffer hands out, the validation numbers. Scoring every completion on
every host would repeat the work on each and, worse, let hosts disagree
wherever a verification is not deterministic (a timeout under load, a crashed
worker); the hosts' programs would then diverge and their collectives hang.

`SharedRewardPool` splits each `score` call instead: process i verifies the
i-th contiguous share of the completions in its own `RewardPool`, and the
scores and counts are all-gathered, so every process returns the same numbers.
A share that raises (a malformed record) makes every process raise after the
gather, instead of leaving the others waiting in it.

`submit` starts this process's share in its pool's thread and returns; the
gather waits for `result()`, which every process calls at the same point of
its (identical) host program, so the collectives line up as with `score`.
"""

from __future__ import annotations

from concurrent import futures
from typing import Any, Mapping, Optional, Sequence

import jax
from jax.experimental import multihost_utils
import numpy as np

from scalerl_jax.rewards.pool import RewardPool

# Stats summed over the processes' shares; slowest_s and wall_s take the maximum.
_SUMMED = ("num_completions", "num_timeouts", "num_errors", "num_crashes", "num_invalid",
           "num_worker_restarts")
_MAXED = ("slowest_s", "wall_s")


class SharedRewardPool:
  """`RewardPool.score` with the work split over the processes and the result shared.

  Every process must call `score`, or `submit` and its handle's `result`, with
  the same arguments, in the same order (as the trainer's identical host
  programs do).

  Args:
    pool: this process's reward pool; closed by `close`.
  """

  def __init__(self, pool: RewardPool):
    self.pool = pool

  def score(self, completions: Sequence[Any], records: Sequence[Mapping[str, Any]]
            ) -> tuple[np.ndarray, dict[str, float]]:
    """`RewardPool.score` of all completions; the same result on every process.

    Raises:
      ValueError, RuntimeError: as `RewardPool.score`, on every process when
        any process's share raised (the others name the failing processes).
    """
    return self.submit(completions, records).result()

  def submit(self, completions: Sequence[Any], records: Sequence[Mapping[str, Any]]
             ) -> SharedScoring:
    """Starts verifying this process's share in the pool's thread; returns at once.

    Every process must call `result()` of the handles it gets, in the order of
    the `submit` calls (it is a collective).

    Raises:
      ValueError: the lengths differ.
    """
    if len(completions) != len(records):
      raise ValueError(f"score: {len(completions)} completions but {len(records)} records")
    n, me = len(completions), jax.process_index()
    if not n:  # The same on every process: nothing to gather.
      return SharedScoring(0, 0, self.pool.submit(completions, records))
    share = -(-n // jax.process_count())
    lo, hi = min(me * share, n), min((me + 1) * share, n)
    return SharedScoring(
        n, share, self.pool.submit(completions[lo:hi], records[lo:hi]) if hi > lo else None)

  def close(self) -> None:
    """Closes this process's pool."""
    self.pool.close()

  def __enter__(self) -> SharedRewardPool:
    return self

  def __exit__(self, *exc_info) -> None:
    self.close()


class SharedScoring:
  """This process's share of a `SharedRewardPool.submit` call, being verified.

  Args:
    n: completions in the whole call.
    share: completions in each process's share (the last ones may hold fewer).
    mine: the future of this process's share (`RewardPool.submit`); None when
      its share is empty.
  """

  def __init__(self, n: int, share: int, mine: Optional[futures.Future]):
    self._n, self._share, self._mine = n, share, mine
    self._result: Optional[tuple[np.ndarray, dict[str, float]]] = None

  def result(self) -> tuple[np.ndarray, dict[str, float]]:
    """Waits for this process's share, then all-gathers every share (once: later calls return it).

    Raises:
      ValueError, RuntimeError: as `SharedRewardPool.score`.
    """
    if self._result is None:
      self._result = self._gather() if self._n else self._mine.result()
    return self._result

  def _gather(self) -> tuple[np.ndarray, dict[str, float]]:
    scores = np.zeros(self._share, np.float32)
    # Summed counts, then the maxima, then mean_s x timed verifications, their count, failed.
    info = np.zeros(len(_SUMMED) + len(_MAXED) + 3, np.float64)
    error = None
    try:
      if self._mine is not None:
        mine, stats = self._mine.result()
        scores[:len(mine)] = mine
        timed = stats["num_completions"] - stats["num_invalid"]
        info[:-1] = ([stats[k] for k in _SUMMED] + [stats[k] for k in _MAXED]
                     + [stats["mean_s"] * timed, timed])
    except (ValueError, RuntimeError) as e:
      error, info[-1] = e, 1.0
    all_scores, all_info = multihost_utils.process_allgather((scores, info))
    if error is not None:
      raise error
    failed = np.flatnonzero(all_info[:, -1])
    if failed.size:
      raise RuntimeError(f"score: verifying failed on processes {failed.tolist()}; "
                         "their logs name the cause")
    total = all_info.sum(axis=0)
    stats = {k: int(total[i]) for i, k in enumerate(_SUMMED)}
    stats.update({k: float(all_info[:, len(_SUMMED) + i].max()) for i, k in enumerate(_MAXED)})
    timed = total[-2]
    stats["mean_s"] = float(total[-3] / timed) if timed else 0.0
    return all_scores.reshape(-1)[:self._n], stats
