"""Training monitors: per-step checks that warn before a run goes wrong.

`Monitors.from_config(config)` builds the checks `config.monitor` enables (a
threshold of 0 turns one off; `staleness` is always on). The trainer feeds
`check(step, row)` every step's metrics row, step 0's validation included;
it logs and returns an `Alert` per check that fired, and `scalars(alerts)`
gives the row its `alert/<name>` entries (1 if fired at this step, else 0).
With `monitor.stop_on_alert` the trainer saves and stops on the first alert
(`AlertStop`). Checks that remember earlier steps carry that through
checkpoints (`state_dict`), so a resumed run alerts as an uninterrupted one.

Design (the checks and the metrics they read): docs/design/monitors.md.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any, Optional

from absl import logging
import ml_collections

from scalerl_jax import registry

Row = dict[str, float]


@dataclasses.dataclass(frozen=True)
class Alert:
  """One check that fired at one step."""

  name: str  # The check's registry name; the metric is alert/<name>.
  step: int
  message: str  # Names the metric, its value and the config field crossed.


class AlertStop(RuntimeError):
  """Raised by the trainer when `monitor.stop_on_alert` and a check fired."""


class _Check(abc.ABC):
  """A check: `__call__(row)` returns a message when it fires, else None."""

  # Attributes (JSON values) that remember earlier steps.
  _STATE: tuple[str, ...] = ()

  @abc.abstractmethod
  def __call__(self, row: Row) -> Optional[str]:
    """The alert message for this row's metrics, or None."""

  def state_dict(self) -> dict[str, Any]:
    return {name: getattr(self, name) for name in self._STATE}

  def load_state_dict(self, state: dict[str, Any]) -> None:
    for name in self._STATE:
      setattr(self, name, state[name])


# The check classes by name, in registration order (the order of the alerts
# and of the `alert/<name>` metrics); `from_config` gives None when disabled.
CHECKS: registry.Registry[type[_Check]] = registry.Registry(
    "monitor", sort=False
)


def _trained(row: Row) -> bool:
  """Whether the row is a train step whose loss saw at least one token."""
  return row.get("train/loss_tokens", 0.0) > 0


@CHECKS.register("entropy_collapse")
class _EntropyCollapse(_Check):
  _STATE = ("first",)

  def __init__(self, min_fraction: float):
    self.min_fraction = min_fraction
    self.first: Optional[float] = None  # Entropy of the first train step.

  @classmethod
  def from_config(cls, config):
    f = config.monitor.entropy_min_fraction
    return cls(f) if f > 0 else None

  def __call__(self, row):
    if "train/entropy" not in row:
      return None
    entropy = row["train/entropy"]
    if self.first is None:
      self.first = entropy
    if entropy < self.min_fraction * self.first:
      return (
          f"train/entropy {entropy:.4g} < monitor.entropy_min_fraction {self.min_fraction:g}"
          f" x its first value {self.first:.4g}: the policy is collapsing"
      )
    return None


class _AboveLimit(_Check):
  """Fires when a row's value of one of `keys` exceeds `monitor.<field>`."""

  keys: tuple[str, ...] = ()
  field = ""
  trained_only = True  # Skip steps whose loss saw no token.
  note = ""  # Appended to the message.

  def __init__(self, limit: float):
    self.limit = limit

  @classmethod
  def from_config(cls, config):
    limit = config.monitor[cls.field]
    return cls(limit) if limit > 0 else None

  def __call__(self, row):
    if self.trained_only and not _trained(row):
      return None
    for key in self.keys:
      value = row.get(key)
      if value is not None and value > self.limit:
        return f"{key} {value:.4g} > monitor.{self.field} {self.limit:g}{self.note}"
    return None


@CHECKS.register("truncation")
class _Truncation(_AboveLimit):
  keys, field, trained_only = (
      ("train/truncation_rate",),
      "truncation_rate_max",
      False,
  )
  note = " (completions hitting the length limit precede instability)"


@CHECKS.register("logp_mismatch")
class _LogpMismatch(_AboveLimit):
  keys, field = ("train/train_gen_logp_abs_diff",), "logp_diff_max"


@CHECKS.register("is_ratio")
class _ImportanceRatio(_AboveLimit):
  keys, field = ("train/ratio_max", "train/tis_ratio_max"), "ratio_max"


@CHECKS.register("reward_stuck")
class _RewardStuck(_Check):
  _STATE = ("streaks",)

  def __init__(self, steps: int, incorrect: float, correct: float):
    self.steps = steps
    self.levels = {"failed": incorrect, "passed": correct}
    # Consecutive steps at each level.
    self.streaks = {k: 0 for k in self.levels}

  @classmethod
  def from_config(cls, config):
    steps = config.monitor.reward_stuck_steps
    return (
        cls(steps, config.rl.reward_incorrect, config.rl.reward_correct)
        if steps
        else None
    )

  def __call__(self, row):
    if "train/reward_mean" not in row:
      return None
    reward = row["train/reward_mean"]
    for kind, level in self.levels.items():
      # A mean of equal float32 rewards is exactly that reward.
      self.streaks[kind] = self.streaks[kind] + 1 if reward == level else 0
    for kind, streak in self.streaks.items():
      if streak >= self.steps:
        return (
            f"train/reward_mean {reward:g}: every completion {kind} for {streak} steps in a "
            f"row (monitor.reward_stuck_steps {self.steps}); no group carries a signal"
        )
    return None


@CHECKS.register("val_drop")
class _ValidationDrop(_Check):
  _STATE = ("best",)

  def __init__(self, max_drop: float):
    self.max_drop = max_drop
    self.best: Optional[float] = None  # Best validation mean@k so far.

  @classmethod
  def from_config(cls, config):
    drop = config.monitor.val_drop_max
    return cls(drop) if drop > 0 else None

  def __call__(self, row):
    if "val/mean_at_k" not in row:
      return None
    value = row["val/mean_at_k"]
    self.best = value if self.best is None else max(self.best, value)
    if value < self.best - self.max_drop:
      return (
          f"val/mean_at_k {value:.4g} fell more than monitor.val_drop_max "
          f"{self.max_drop:g} below its best {self.best:.4g}"
      )
    return None


@CHECKS.register("staleness")
class _StalenessFault(_Check):
  _STATE = ("evicted",)

  def __init__(self):
    # buffer/evicted_stale at the last step (a running count).
    self.evicted = 0.0

  @classmethod
  def from_config(cls, config):
    # staleness/over_k is counted against k where k lives (rl/schedules.py).
    del config
    return cls()

  def __call__(self, row):
    over = row.get("staleness/over_k", 0.0)
    evicted = row.get("buffer/evicted_stale", self.evicted)
    new_evictions, self.evicted = evicted - self.evicted, evicted
    if over > 0:
      return (
          f"staleness/over_k {over:g}: tokens trained with a lag above "
          f"k (buffer.max_off_policy; staleness/max "
          f"{row.get('staleness/max', float('nan')):g}); the off-policy bound is broken"
      )
    if new_evictions > 0:
      return (
          f"buffer/evicted_stale rose by {new_evictions:g}: groups staler than "
          "k (buffer.max_off_policy) were thrown away; the schedule "
          "let the generator run too far ahead"
      )
    return None


class Monitors:
  """The enabled checks of a run, fed one metrics row per step."""

  def __init__(self, checks: dict[str, _Check], stop_on_alert: bool):
    self.checks = checks
    self.stop_on_alert = stop_on_alert

  @classmethod
  def from_config(cls, config: ml_collections.ConfigDict) -> "Monitors":
    """The checks `config.monitor` enables (a threshold of 0 leaves one out)."""
    checks = {name: check.from_config(config) for name, check in CHECKS.items()}
    return cls(
        {k: v for k, v in checks.items() if v is not None},
        config.monitor.stop_on_alert,
    )

  def check(self, step: int, row: Row) -> list[Alert]:
    """Logs and returns, in registration order, the alerts that `row` raises."""
    alerts = []
    for name, check in self.checks.items():
      message = check(row)
      if message:
        alerts.append(Alert(name, step, message))
        logging.warning("step %d: monitor %s: %s", step, name, message)
    return alerts

  def scalars(self, alerts: list[Alert]) -> dict[str, float]:
    """`alert/<name>` of every enabled check: 1.0 if in `alerts`, else 0.0."""
    fired = {a.name for a in alerts}
    return {f"alert/{name}": float(name in fired) for name in self.checks}

  def state_dict(self) -> dict[str, dict[str, Any]]:
    """JSON-serialisable state of the checks that remember earlier steps."""
    return {name: check.state_dict() for name, check in self.checks.items()}

  def load_state_dict(self, state: dict[str, dict[str, Any]]) -> None:
    """Restores `state_dict` output; checks absent from it start fresh."""
    for name, check in self.checks.items():
      if state.get(name):
        check.load_state_dict(state[name])
