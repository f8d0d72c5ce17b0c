"""Off-policy schedules (ScaleRL paper §5): what to start, how long to decode.

A `Schedule` in `SCHEDULES` (`config.buffer.schedule`) decides from counts
alone: `max_starts` (groups the generator may start) and `decode_steps`
(steps of the next sampler call, 0 to end the step's generation).
`pipeline_rl` (PipelineRL-k) starts a prompt only while fewer than
(k + 1) x P groups are started and unconsumed, so no token lags more than k;
`ppo_off_policy` (PPO-off-policy-k) starts k x P prompts every k steps.
Design (the lag bound, the emulated concurrency): docs/design/rl.md.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import ClassVar

import ml_collections

from scalerl_jax import registry

SCHEDULES: registry.Registry[type["Schedule"]] = registry.Registry(
    "buffer.schedule"
)


@dataclasses.dataclass(frozen=True)
class Schedule(abc.ABC):
  """What the generator may do, from counts (no arrays, no state)."""

  # k: no trained token lags the trainer by more. Its one home: the rest of
  # the run reads it here (rl/generation.py).
  max_off_policy: int
  prompts_per_step: int  # P: groups the trainer takes per step.
  # Steps of one sampler call; weights change between calls only.
  decode_steps_per_call: int
  # D: the emulated generator's speed (see the module doc).
  decode_steps_per_train_step: int

  slot_batches: ClassVar[int]  # Default sampler slots, in batches of P x G.
  # Whether sequences in flight may continue with new weights (what
  # buffer.sync_at_decode_step and buffer.sync_mode='free' need); a schedule
  # that does not say is refused them.
  in_flight_updates: ClassVar[bool] = False

  def __post_init__(self):
    if self.max_off_policy < 1:
      raise ValueError(
          f"buffer.max_off_policy: {self.max_off_policy} must be >= 1"
      )

  @abc.abstractmethod
  def max_starts(
      self, version: int, backlog: int, weights_behind: int = 0
  ) -> int:
    """Groups (>= 0) the generator may start at policy `version`.

    `backlog`: groups started and not yet consumed; `weights_behind`: how
    many versions the generator's weights trail `version` (disaggregated,
    before the step's weights are swapped in: `buffer.sync_at_decode_step`).
    """

  @abc.abstractmethod
  def decode_steps(self, decoded: int, ready: int, in_flight: int) -> int:
    """Steps (>= 0) of the next sampler call; 0 ends this step's generation.

    `decoded`: steps run in this train step; `ready`: groups the buffer could
    hand out now; `in_flight`: groups started and not finished.
    """


@SCHEDULES.register("pipeline_rl")
class PipelineRL(Schedule):
  """PipelineRL-k: in-flight updates; k bounds lag by holding generation."""

  slot_batches = 2  # A second batch in flight while the first finishes.
  in_flight_updates = True

  def max_starts(
      self, version: int, backlog: int, weights_behind: int = 0
  ) -> int:
    # The bound depends on how far the generator is ahead, not on when. A
    # group started with weights j versions behind has j fewer versions of
    # room: its tokens may be that much older than `version`.
    del version
    room = self.max_off_policy + 1 - weights_behind
    return max(0, room * self.prompts_per_step - backlog)

  def decode_steps(self, decoded: int, ready: int, in_flight: int) -> int:
    if not in_flight:  # Held back with nothing running: the generator waits.
      return 0
    if decoded < self.decode_steps_per_train_step:
      return min(
          self.decode_steps_per_call, self.decode_steps_per_train_step - decoded
      )
    return self.decode_steps_per_call if ready < self.prompts_per_step else 0


@SCHEDULES.register("ppo_off_policy")
class PPOOffPolicy(Schedule):
  """PPO-off-policy-k: every k steps, k batches generated with one weights."""

  slot_batches = 1
  in_flight_updates = False

  def max_starts(
      self, version: int, backlog: int, weights_behind: int = 0
  ) -> int:
    # A set starts with its step's own weights only.
    if version % self.max_off_policy or weights_behind:
      return 0
    return max(0, self.max_off_policy * self.prompts_per_step - backlog)

  def decode_steps(self, decoded: int, ready: int, in_flight: int) -> int:
    # The whole set finishes with the weights it started with.
    del decoded, ready
    return self.decode_steps_per_call if in_flight else 0


def make(config: ml_collections.ConfigDict) -> Schedule:
  """The schedule `config.buffer.schedule`, bound to the config's counts."""
  return SCHEDULES.get(config.buffer.schedule)(
      max_off_policy=config.buffer.max_off_policy,
      prompts_per_step=config.data.prompts_per_step,
      decode_steps_per_call=config.sampling.decode_steps_per_call,
      decode_steps_per_train_step=config.buffer.decode_steps_per_train_step,
  )


def num_slots(config: ml_collections.ConfigDict) -> int:
  """Sampler slots: `sampling.num_slots`, or the schedule's default if 0."""
  p, g = config.data.prompts_per_step, config.data.generations_per_prompt
  return (
      config.sampling.num_slots
      or SCHEDULES.get(config.buffer.schedule).slot_batches * p * g
  )
