"""Rollout buffer: finished groups handed out in start order, token versions.

A `Group` holds one prompt's G scored completions, every token tagged with
the policy version that generated it (-1 elsewhere). The buffer hands groups
out strictly in start order, waiting for one in flight rather than passing
it, which lets a schedule bound lag by counting groups; a group staler than
k is a scheduling fault, evicted and counted, never trained on.

Shape letters: the package key (scalerl_jax/__init__.py).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Optional, Sequence

import numpy as np

from scalerl_jax.sampling import completions as completions_lib
from scalerl_jax.sampling.completions import Completions


@dataclasses.dataclass
class Group:
  """The G completions of one prompt, scored (host numpy arrays)."""

  record: dict  # The prompt record (id, prompt, answer, source, verifier, ...).
  # Start order: groups are numbered 0, 1, ... as the sampler starts them.
  index: int
  # The G completions, as harvested (G rows; `Completions` names the fields).
  completions: Completions
  # float32 [G]: verifier scores in [0, 1] (the curriculum's pass rates).
  scores_G: np.ndarray
  # float32 [G]: the scores mapped to [reward_incorrect, reward_correct].
  rewards_G: np.ndarray

  def oldest_version(self) -> int:
    """Smallest policy version of any sampled token (its staleness anchor)."""
    version = self.completions.version
    tagged = version[version >= 0]
    return int(tagged.min()) if tagged.size else 0

  def arrays(self, prefix: str = "") -> dict[str, np.ndarray]:
    """Its arrays, each named `prefix` + name, as `from_arrays` reads them."""
    return {
        **completions_lib.to_arrays(self.completions, prefix),
        prefix + "scores_G": self.scores_G,
        prefix + "rewards_G": self.rewards_G,
    }

  @classmethod
  def from_arrays(
      cls,
      record: dict,
      index: int,
      arrays: dict[str, np.ndarray],
      prefix: str = "",
  ) -> "Group":
    return cls(
        record=record,
        index=index,
        completions=completions_lib.from_arrays(arrays, prefix),
        scores_G=np.asarray(arrays[prefix + "scores_G"]),
        rewards_G=np.asarray(arrays[prefix + "rewards_G"]),
    )


class RolloutBuffer:
  """Finished groups, consumed in start order; none staler than k.

  k (`max_off_policy`) is passed by the caller: its one home is the
  schedule (`rl/schedules.Schedule`).
  """

  def __init__(self):
    self._groups: dict[int, Group] = {}  # Start index -> finished group.
    self._next = 0  # Start index of the next group to consume.
    # Groups found staler than k (a fault), over the whole run.
    self.num_evicted = 0

  def __len__(self) -> int:
    return len(self._groups)

  def add(self, group: Group) -> None:
    if group.index < self._next or group.index in self._groups:
      raise ValueError(f"group {group.index} was already added")
    self._groups[group.index] = group

  def num_ready(self, version: int, max_off_policy: int) -> int:
    """Groups `take` could hand out at `version` (up to the first in flight)."""
    count, index = 0, self._next
    while index in self._groups:
      count += not _stale(self._groups[index], version, max_off_policy)
      index += 1
    return count

  def take(
      self, num_groups: int, version: int, max_off_policy: int
  ) -> Optional[list[Group]]:
    """The next `num_groups` groups in start order; None if some are in flight.

    Stale groups met on the way are evicted and counted.
    """
    if self.num_ready(version, max_off_policy) < num_groups:
      return None
    taken = []
    while len(taken) < num_groups:
      group = self._groups.pop(self._next)
      self._next += 1
      if _stale(group, version, max_off_policy):
        self.num_evicted += 1
      else:
        taken.append(group)
    return taken

  def state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """(host arrays, JSON metadata) that `restore` reads back."""
    groups = list(self._groups.values())
    arrays = {}
    for i, g in enumerate(groups):
      arrays.update(g.arrays(f"{i}/"))
    meta = {
        "records": [json.dumps(g.record) for g in groups],
        "indices": [g.index for g in groups],
        "next": self._next,
        "num_evicted": self.num_evicted,
    }
    return arrays, meta

  def restore(
      self, arrays: dict[str, np.ndarray], meta: dict[str, Any]
  ) -> None:
    """Refills the buffer from `state()` output."""
    self._groups = {
        index: Group.from_arrays(json.loads(record), index, arrays, f"{i}/")
        for i, (record, index) in enumerate(
            zip(meta["records"], meta["indices"])
        )
    }
    self._next = int(meta["next"])
    self.num_evicted = int(meta["num_evicted"])


def _stale(group: Group, version: int, max_off_policy: int) -> bool:
  return version - group.oldest_version() > max_off_policy


def staleness_histogram(groups: Sequence[Group], version: int) -> np.ndarray:
  """Counts of sampled tokens by their true lag (version - token version)."""
  lags = [version - g.completions.version[g.completions.mask] for g in groups]
  lags = np.concatenate(lags) if lags else np.zeros(0, np.int64)
  if lags.size and lags.min() < 0:
    raise ValueError(
        f"a token of version {version - lags.min()} is newer than the trainer's "
        f"version {version}"
    )
  return np.bincount(lags, minlength=1)


def staleness_metrics(
    groups: Sequence[Group], version: int, max_off_policy: int
) -> dict[str, float]:
  """`staleness/` lags of a batch's tokens trained at `version`, unclipped.

  hist_0..k count tokens by lag; lags over k (a scheduling fault) are counted
  in over_k, not folded into hist_k; max is the true largest lag;
  mixed_version_frac is the share of completions with several versions.
  """
  hist = staleness_histogram(groups, version)
  lags = np.arange(hist.size)
  tokens = max(int(hist.sum()), 1)
  mixed = np.mean(
      [
          np.unique(v[v >= 0]).size > 1
          for g in groups
          for v in g.completions.version
      ]
  )
  counts = np.zeros(max_off_policy + 1, np.int64)
  counts[: min(hist.size, max_off_policy + 1)] = hist[: max_off_policy + 1]
  return {
      "staleness/mean": float((lags * hist).sum() / tokens),
      "staleness/max": float(lags[hist > 0].max()) if hist.any() else 0.0,
      "staleness/over_k": float(hist[max_off_policy + 1 :].sum()),
      "staleness/mixed_version_frac": float(mixed),
      **{f"staleness/hist_{i}": float(c) for i, c in enumerate(counts)},
  }


def batch_metrics(
    groups: Sequence[Group], version: int, max_off_policy: int
) -> dict[str, float]:
  """The `train/` rewards, lengths, truncations and staleness of a batch."""
  rewards = np.stack([g.rewards_G for g in groups])
  lengths = np.concatenate([g.completions.completion_len for g in groups])
  truncated = np.concatenate([g.completions.truncated for g in groups])
  interrupted = np.concatenate([g.completions.interrupted for g in groups])
  return {
      "train/reward_mean": float(rewards.mean()),
      "train/mean_length": float(lengths.mean()),
      "train/max_length": float(lengths.max()),
      "train/truncation_rate": float(truncated.mean()),
      "train/interruption_rate": float(interrupted.mean()),
      **staleness_metrics(groups, version, max_off_policy),
  }
