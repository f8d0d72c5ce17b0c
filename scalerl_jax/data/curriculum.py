"""Per-prompt pass-rate history, No-Positive-Resampling, zero-variance counts.

A prompt whose historical pass rate reaches curriculum.retire_threshold is
retired for good (`is_retired`); `update` takes finished groups' scores.

Shape letters: the package key (scalerl_jax/__init__.py).
Design: docs/design/curriculum.md.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

_STATE_VERSION = 1
# Pass rates are compared with this slack so that float rounding of partial
# scores never decides a retirement that exact arithmetic would make.
_EPS = 1e-9


def zero_variance_mask(scores_PxG: np.ndarray) -> np.ndarray:
  """Boolean [P]: True where a group's G > 0 scores are all equal."""
  scores_PxG = np.asarray(scores_PxG)
  if scores_PxG.ndim != 2 or scores_PxG.shape[1] == 0:
    raise ValueError(
        f"scores must be [P, G] with G > 0, got shape {scores_PxG.shape}"
    )
  return np.all(scores_PxG == scores_PxG[:, :1], axis=1)


class Curriculum:
  """Pass-rate history of every prompt seen, and the set of retired prompts.

  A prompt retires at a pass rate >= `retire_threshold` (in (0, 1]); with
  `no_positive_resampling=False` none does, but the history is kept.
  """

  def __init__(
      self, retire_threshold: float = 0.9, no_positive_resampling: bool = True
  ):
    if not 0 < retire_threshold <= 1:
      raise ValueError(
          f"curriculum.retire_threshold: {retire_threshold} must be in (0, 1]"
      )
    self.retire_threshold = float(retire_threshold)
    self.no_positive_resampling = bool(no_positive_resampling)
    self._score_sum: dict[str, float] = {}
    self._count: dict[str, int] = {}
    self._retired: set[str] = set()
    self._groups = 0
    self._zero_variance_groups = 0
    self._all_correct_groups = 0
    self._all_wrong_groups = 0

  @classmethod
  def from_config(cls, curriculum_config: Any) -> Curriculum:
    """A fresh curriculum from `config.curriculum`."""
    return cls(
        curriculum_config.retire_threshold,
        curriculum_config.no_positive_resampling,
    )

  def update(
      self, prompt_ids: Sequence[str], scores_PxG: np.ndarray
  ) -> list[str]:
    """Adds finished groups; returns the ids this retires, in order.

    `prompt_ids` may repeat; `scores_PxG` are verifier scores in [0, 1].

    Raises:
      ValueError: shapes disagree, a non-string id, or a score outside [0, 1].
    """
    scores_PxG = np.asarray(scores_PxG, np.float64)
    if scores_PxG.ndim != 2 or scores_PxG.shape[0] != len(prompt_ids):
      raise ValueError(
          f"Curriculum.update: scores of shape {scores_PxG.shape} for {len(prompt_ids)} prompts; "
          "expected [P, G]"
      )
    if not np.all((scores_PxG >= 0) & (scores_PxG <= 1)):
      raise ValueError(
          "Curriculum.update: scores must be in [0, 1] (verifier scores, not "
          "rewards)"
      )
    if not all(isinstance(i, str) for i in prompt_ids):
      raise ValueError(
          "Curriculum.update: prompt ids must be strings (record['id'])"
      )
    if not len(prompt_ids):
      return []
    zero_var_P = zero_variance_mask(scores_PxG)
    self._groups += len(prompt_ids)
    self._zero_variance_groups += int(zero_var_P.sum())
    self._all_correct_groups += int(
        (zero_var_P & (scores_PxG[:, 0] == 1)).sum()
    )
    self._all_wrong_groups += int((zero_var_P & (scores_PxG[:, 0] == 0)).sum())
    newly_retired = []
    for prompt_id, scores_G in zip(prompt_ids, scores_PxG):
      self._score_sum[prompt_id] = self._score_sum.get(prompt_id, 0.0) + float(
          scores_G.sum()
      )
      self._count[prompt_id] = self._count.get(prompt_id, 0) + scores_G.size
      if (
          self.no_positive_resampling
          and prompt_id not in self._retired
          and self.pass_rate(prompt_id) >= self.retire_threshold - _EPS
      ):
        self._retired.add(prompt_id)
        newly_retired.append(prompt_id)
    return newly_retired

  def pass_rate(self, prompt_id: str) -> float:
    """Historical mean score of a prompt; NaN if it was never scored."""
    count = self._count.get(prompt_id, 0)
    return self._score_sum[prompt_id] / count if count else math.nan

  def num_samples(self, prompt_id: str) -> int:
    """How many completions of a prompt have been scored."""
    return self._count.get(prompt_id, 0)

  def is_retired(self, prompt_id: str) -> bool:
    """Whether No-Positive-Resampling has removed the prompt for good."""
    return prompt_id in self._retired

  def filter_records(
      self, records: Iterable[Mapping[str, Any]]
  ) -> list[Mapping[str, Any]]:
    """The records whose prompt (`record["id"]`) is not retired, in order."""
    return [r for r in records if r["id"] not in self._retired]

  def metrics(self) -> dict[str, float]:
    """Cumulative counters for the metric writers."""
    return {
        "prompts_seen": len(self._count),
        "prompts_retired": len(self._retired),
        "groups_seen": self._groups,
        "zero_variance_groups": self._zero_variance_groups,
        "zero_variance_fraction": self._zero_variance_groups
        / max(self._groups, 1),
        "all_correct_groups": self._all_correct_groups,
        "all_wrong_groups": self._all_wrong_groups,
    }

  def state_dict(self) -> dict[str, Any]:
    """Everything needed to restore this curriculum, as JSON-able data."""
    ids = sorted(self._count)
    return {
        "version": _STATE_VERSION,
        "retire_threshold": self.retire_threshold,
        "no_positive_resampling": self.no_positive_resampling,
        "prompt_ids": ids,
        "score_sums": [self._score_sum[i] for i in ids],
        "counts": [self._count[i] for i in ids],
        "retired": sorted(self._retired),
        "groups": self._groups,
        "zero_variance_groups": self._zero_variance_groups,
        "all_correct_groups": self._all_correct_groups,
        "all_wrong_groups": self._all_wrong_groups,
    }

  @classmethod
  def from_state_dict(cls, state: Mapping[str, Any]) -> Curriculum:
    """Restores a `state_dict`; ValueError if foreign or inconsistent."""
    expected = set(cls().state_dict())
    if set(state) != expected:
      raise ValueError(
          f"Curriculum state: keys {sorted(set(state))} differ from {sorted(expected)}"
      )
    if state["version"] != _STATE_VERSION:
      raise ValueError(
          f"Curriculum state: version {state['version']} is not {_STATE_VERSION}"
      )
    ids, sums, counts = (
        state["prompt_ids"],
        state["score_sums"],
        state["counts"],
    )
    if not len(ids) == len(sums) == len(counts):
      raise ValueError(
          f"Curriculum state: {len(ids)} prompt ids, {len(sums)} score sums, {len(counts)} "
          "counts"
      )
    unknown = set(state["retired"]) - set(ids)
    if unknown:
      raise ValueError(
          f"Curriculum state: retired prompts without history: {sorted(unknown)[:5]}"
      )
    curriculum = cls(state["retire_threshold"], state["no_positive_resampling"])
    curriculum._score_sum = {i: float(s) for i, s in zip(ids, sums)}
    curriculum._count = {i: int(c) for i, c in zip(ids, counts)}
    curriculum._retired = set(state["retired"])
    curriculum._groups = int(state["groups"])
    curriculum._zero_variance_groups = int(state["zero_variance_groups"])
    curriculum._all_correct_groups = int(state["all_correct_groups"])
    curriculum._all_wrong_groups = int(state["all_wrong_groups"])
    return curriculum
