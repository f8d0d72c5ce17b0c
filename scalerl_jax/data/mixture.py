"""A mixture of prompt sources (domains): config, records, curricula, metrics.

`config.data.mixture` maps a domain to `weight` (> 0), `source`, `verifier`
(overrides the records' unless ""), `retire_threshold`,
`no_positive_resampling` and data.* fields for its source; empty means the
single data.source. Records get ids `<domain>/<id>` and a `domain` field.
Design: docs/design/data.md, docs/design/curriculum.md.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

import ml_collections
import numpy as np

from scalerl_jax.data import curriculum as curriculum_lib

_OWN_FIELDS = (
    "weight",
    "source",
    "verifier",
    "retire_threshold",
    "no_positive_resampling",
)
SEP = "/"  # Between a domain's name and a record's own id.


def names(config: ml_collections.ConfigDict) -> list[str]:
  """The mixture's domains in config order; [] for a single-source run."""
  return list(config.data.get("mixture", None) or {})


def weights(config: ml_collections.ConfigDict) -> dict[str, float]:
  """Domain -> weight; ValueError for a weight <= 0 or a name with SEP."""
  out = {}
  for name in names(config):
    weight = config.data.mixture[name].get("weight", None)
    if not isinstance(weight, (int, float)) or weight <= 0:
      raise ValueError(
          f"data.mixture.{name}.weight: must be a number > 0, got {weight!r}"
      )
    if SEP in name:
      raise ValueError(
          f"data.mixture.{name}: a domain name may not hold {SEP!r}"
      )
    out[name] = float(weight)
  return out


def domain_config(
    config: ml_collections.ConfigDict, name: str
) -> ml_collections.ConfigDict:
  """The single-source config of domain `name`: data.* overridden by it.

  Raises:
    ValueError: a field that is neither the domain's own nor a data.* field,
      or no source.
  """
  fields = config.data.mixture[name]
  sub = ml_collections.ConfigDict(config.to_dict())
  sub.data.mixture = ml_collections.ConfigDict()
  for key, value in fields.items():
    if key in _OWN_FIELDS:
      continue
    if key not in sub.data:
      raise ValueError(
          f"data.mixture.{name}.{key}: not a data.* field or one of {_OWN_FIELDS}"
      )
    sub.data[key] = value
  if "source" not in fields:
    raise ValueError(f"data.mixture.{name}.source: must be set")
  sub.data.source = fields.source
  return sub


def tag(records: Iterable[dict], name: str, verifier: str = "") -> list[dict]:
  """Domain `name`'s records: prefixed ids, a domain field, its verifier."""
  out = []
  for record in records:
    record = dict(record, id=f"{name}{SEP}{record['id']}", domain=name)
    if verifier:
      record["verifier"] = verifier
    out.append(record)
  return out


def domain_of(record: Mapping[str, Any]) -> str:
  """A record's domain ("" outside a mixture)."""
  return record.get("domain", "")


def head_per_domain(records: Sequence[dict], num: int) -> list[dict]:
  """The first `num` records of each domain, domains in order of appearance."""
  taken: dict[str, list[dict]] = {}
  for record in records:
    bucket = taken.setdefault(domain_of(record), [])
    if len(bucket) < num:
      bucket.append(record)
  return [r for bucket in taken.values() for r in bucket]


def train_metrics(groups: Sequence[Any]) -> dict[str, float]:
  """train/<domain>/ count, reward_mean, zero_variance_frac, mean_length.

  Of scored groups (`buffer.Group`); {} when no group has a domain.
  """
  by_domain: dict[str, list[Any]] = {}
  for g in groups:
    if domain_of(g.record):
      by_domain.setdefault(domain_of(g.record), []).append(g)
  out = {}
  for name, gs in sorted(by_domain.items()):
    scores = np.stack([g.scores_G for g in gs])
    out.update(
        {
            f"train/{name}/count": float(len(gs)),
            f"train/{name}/reward_mean": float(scores.mean()),
            f"train/{name}/zero_variance_frac": float(
                curriculum_lib.zero_variance_mask(scores).mean()
            ),
            f"train/{name}/mean_length": float(
                np.concatenate(
                    [g.completions.completion_len for g in gs]
                ).mean()
            ),
        }
    )
  return out


class Curricula:
  """One `Curriculum` per domain, routed by id prefix, behind its interface.

  `metrics` sums the domains' counters and adds `curriculum/<domain>/...`.
  """

  def __init__(self, curricula: Mapping[str, curriculum_lib.Curriculum]):
    self._by_domain = dict(curricula)

  @classmethod
  def from_config(cls, config: ml_collections.ConfigDict) -> Curricula:
    base = config.curriculum
    out = {}
    for name in names(config):
      fields = config.data.mixture[name]
      out[name] = curriculum_lib.Curriculum(
          fields.get("retire_threshold", base.retire_threshold),
          fields.get("no_positive_resampling", base.no_positive_resampling),
      )
    return cls(out)

  def _of(self, prompt_id: str) -> curriculum_lib.Curriculum:
    name = prompt_id.split(SEP, 1)[0]
    if name not in self._by_domain:
      raise ValueError(
          f"prompt {prompt_id!r} belongs to no domain of data.mixture "
          f"({sorted(self._by_domain)})"
      )
    return self._by_domain[name]

  def update(
      self, prompt_ids: Sequence[str], scores_PxG: np.ndarray
  ) -> list[str]:
    retired = []
    for prompt_id, scores_G in zip(prompt_ids, np.asarray(scores_PxG)):
      retired += self._of(prompt_id).update([prompt_id], scores_G[None])
    return retired

  def is_retired(self, prompt_id: str) -> bool:
    return self._of(prompt_id).is_retired(prompt_id)

  def metrics(self) -> dict[str, float]:
    per = {name: c.metrics() for name, c in self._by_domain.items()}
    total = {
        k: sum(m[k] for m in per.values())
        for k in next(iter(per.values()))
        if k != "zero_variance_fraction"
    }
    total["zero_variance_fraction"] = total["zero_variance_groups"] / max(
        total["groups_seen"], 1
    )
    for name, m in per.items():
      total.update({f"curriculum/{name}/{k}": v for k, v in m.items()})
    return total

  def state_dict(self) -> dict[str, Any]:
    return {
        "domains": {name: c.state_dict() for name, c in self._by_domain.items()}
    }

  @classmethod
  def from_state_dict(cls, state: Mapping[str, Any]) -> Curricula:
    return cls(
        {
            name: curriculum_lib.Curriculum.from_state_dict(s)
            for name, s in state["domains"].items()
        }
    )


def make_curriculum(config: ml_collections.ConfigDict):
  """The run's curriculum: one per domain in a mixture, else the single one."""
  if names(config):
    return Curricula.from_config(config)
  return curriculum_lib.Curriculum.from_config(config.curriculum)


def restore_curriculum(state: Mapping[str, Any]):
  """The curriculum saved by `make_curriculum(...).state_dict()`."""
  if set(state) == {"domains"}:
    return Curricula.from_state_dict(state)
  return curriculum_lib.Curriculum.from_state_dict(state)
