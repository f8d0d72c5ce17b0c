"""Off-policy rollout buffer: finished groups, per-token policy versions, staleness bound k.

A `Group` is the G scored completions of one prompt, each token tagged with
the policy version that generated it (-1 for prompt, injected and pad tokens).
The buffer is a FIFO of groups. When the trainer at policy version v takes a
batch, groups whose oldest generated token is more than k versions old
(v - version > k) are evicted first and counted, so no consumed completion is
ever staler than `max_off_policy` (PAPER.md §5, PipelineRL-k). The two
schedules differ only in when weights reach the sampler; both consume through
this buffer (see `trainer.py`).

Shape letters: G generations per prompt, S sequence length (prompt +
completion, padded), P prompts per batch.
"""

from __future__ import annotations

import collections
import dataclasses
import json
from typing import Any, Optional, Sequence

import numpy as np


@dataclasses.dataclass
class Group:
  """The G completions of one prompt, scored (host numpy arrays)."""
  record: dict  # The prompt record (id, prompt, answer, source, verifier, ...).
  tokens_GxS: np.ndarray  # int32 [G, S]: prompt then completion, right-padded.
  mask_GxS: np.ndarray  # float32 [G, S]: 1 on sampled tokens (loss tokens).
  gen_logp_GxS: np.ndarray  # float32 [G, S]: generator log-prob of sampled tokens.
  version_GxS: np.ndarray  # int32 [G, S]: policy version per sampled token, else -1.
  rewards_G: np.ndarray  # float32 [G]
  prompt_lens_G: np.ndarray  # int32 [G]: prompt tokens.
  lengths_G: np.ndarray  # int32 [G]: completion tokens (sampled + injected).
  truncated_G: np.ndarray  # bool [G]: hit the length budget without EOS.

  _ARRAYS = ("tokens_GxS", "mask_GxS", "gen_logp_GxS", "version_GxS", "rewards_G",
             "prompt_lens_G", "lengths_G", "truncated_G")

  def oldest_version(self) -> int:
    """Smallest policy version of any sampled token (the group's staleness anchor)."""
    tagged = self.version_GxS[self.version_GxS >= 0]
    return int(tagged.min()) if tagged.size else 0

  def newest_version(self) -> int:
    tagged = self.version_GxS[self.version_GxS >= 0]
    return int(tagged.max()) if tagged.size else 0


class RolloutBuffer:
  """FIFO of finished groups with the staleness bound k.

  Args:
    max_off_policy: k; a group whose oldest token is more than k versions
      behind the trainer is never consumed.
  """

  def __init__(self, max_off_policy: int):
    if max_off_policy < 1:
      raise ValueError(f"buffer.max_off_policy: {max_off_policy} must be >= 1")
    self.max_off_policy = max_off_policy
    self._groups: collections.deque[Group] = collections.deque()
    self.num_evicted = 0  # Groups dropped for staleness, over the whole run.

  def __len__(self) -> int:
    return len(self._groups)

  def add(self, group: Group) -> None:
    self._groups.append(group)

  def evict_stale(self, version: int) -> int:
    """Drops groups that would be more than k versions stale at `version`."""
    fresh = [g for g in self._groups if version - g.oldest_version() <= self.max_off_policy]
    evicted = len(self._groups) - len(fresh)
    self._groups = collections.deque(fresh)
    self.num_evicted += evicted
    return evicted

  def num_ready(self, version: int) -> int:
    """Groups that may be consumed at `version`."""
    return sum(version - g.oldest_version() <= self.max_off_policy for g in self._groups)

  def take(self, num_groups: int, version: int) -> Optional[list[Group]]:
    """The oldest `num_groups` consumable groups, or None if there are fewer."""
    self.evict_stale(version)
    if len(self._groups) < num_groups:
      return None
    return [self._groups.popleft() for _ in range(num_groups)]

  def state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """(host arrays, JSON metadata) that `restore` turns back into this buffer."""
    arrays = {f"{i}/{name}": getattr(g, name) for i, g in enumerate(self._groups)
              for name in Group._ARRAYS}
    meta = {"records": [json.dumps(g.record) for g in self._groups],
            "num_evicted": self.num_evicted}
    return arrays, meta

  def restore(self, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> None:
    """Refills the buffer from `state()` output."""
    self._groups = collections.deque(
        Group(record=json.loads(record),
              **{name: np.asarray(arrays[f"{i}/{name}"]) for name in Group._ARRAYS})
        for i, record in enumerate(meta["records"]))
    self.num_evicted = int(meta["num_evicted"])


def staleness_histogram(groups: Sequence[Group], version: int, max_off_policy: int) -> np.ndarray:
  """Counts of sampled tokens by staleness 0..k (version - token version)."""
  counts = np.zeros(max_off_policy + 1, np.int64)
  for g in groups:
    tagged = g.version_GxS[g.mask_GxS > 0]
    np.add.at(counts, np.clip(version - tagged, 0, max_off_policy), 1)
  return counts


def collate(groups: Sequence[Group], length_multiple: int = 32) -> dict[str, np.ndarray]:
  """Stacks P groups into the train step's prompt-major batch.

  Trailing padding that no row uses is cut, to a multiple of
  `length_multiple` (so the train step compiles for a few lengths only).
  """
  full = groups[0].tokens_GxS.shape[1]
  used = max(int((g.prompt_lens_G + g.lengths_G).max()) for g in groups)
  s = min(full, -(-used // length_multiple) * length_multiple)
  return {
      "tokens_BxS": np.concatenate([g.tokens_GxS[:, :s] for g in groups]).astype(np.int32),
      "mask_BxS": np.concatenate([g.mask_GxS[:, :s] for g in groups]).astype(np.float32),
      "gen_logp_BxS": np.concatenate([g.gen_logp_GxS[:, :s] for g in groups]).astype(np.float32),
      "rewards_PxG": np.stack([g.rewards_G for g in groups]).astype(np.float32),
  }
