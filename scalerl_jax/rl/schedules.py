"""Off-policy schedules (PAPER.md §5): when the generator starts prompts, how long it decodes.

A schedule is a small object chosen by name (`config.buffer.schedule`) from
`SCHEDULES`; adding one is one new registered class. It answers two questions
from counts alone, and `trainer.Trainer.generate` runs the loop that asks them:

  * `max_starts(version, backlog)`: how many new prompts (groups of G) the
    generator may start now. The backlog is every group started and not yet
    consumed (in flight or finished in the buffer).
  * `decode_steps(decoded, ready, in_flight)`: how many decode steps the next
    sampler call runs, 0 to end the generate phase of this train step.

Lag. The trainer at version v trains on a batch of P groups and becomes v + 1;
a token's lag is v minus the version that generated it. The buffer hands out
groups strictly in the order they were started (`buffer.RolloutBuffer`), and a
group started earlier is never first decoded later, so a group that enters the
backlog at position i (0-based, counted before it) while the trainer is at v is
trained at version v + floor(i / P), and all of its tokens were generated at
version v or later: its lag is at most floor(i / P).

PipelineRL-k holds the generator back: it starts a prompt only while the
backlog is below (k + 1) x P, so i <= (k + 1) x P - 1 and no token lags more
than k. Nothing finished is thrown away; a group older than k in the buffer
would be a bug, which the buffer evicts and counts (`buffer/evicted_stale`)
and the `staleness` monitor warns about; lags are logged unclipped
(`staleness/max`, `staleness/over_k`), so a broken bound shows.
Weights reach the sampler after every step; sequences in flight continue on
their KV cache with the new weights, so a completion mixes versions. A group
started at backlog position >= k x P and decoded in the same step lags exactly
k: the bound is reached whenever the generator is fast enough to fill the
backlog.

PPO-off-policy-k starts k x P prompts every k steps, decodes all of them with
the weights of that step, and the trainer takes them over the next k steps
(lags 0 .. k - 1, one version per batch).

How one colocated step emulates PipelineRL's concurrency. In PipelineRL the
generators decode on their own devices while the trainer computes a step. Here
both share one mesh and alternate, so the generator's speed is a number: during
one train step it runs `buffer.decode_steps_per_train_step` (D) decode steps
with the current weights, in calls of at most `sampling.decode_steps_per_call`
steps (weights can change between calls, never within one). It runs fewer
when the hold-back leaves nothing in flight (it waits, as PipelineRL's
generators do), and more when the trainer's next batch is still unfinished
after D steps (the trainer waits for data). A D that produces more than P
groups per step lets the generator run ahead until the k bound holds it back;
what it made ahead is trained on later. Wall time is the sum of the two phases
here, where PipelineRL's devices overlap them, and the generator's D steps stand
for however long the real trainer step takes.

The paper's efficiency claim (PipelineRL: same A, higher B than PPO-off-policy,
§6) in this setting. B is measured against compute, GPU-hours in the paper,
where PipelineRL's gain is utilisation: its generators wait only for the k
bound, never for the longest sequence of a batch, and its trainer never waits
for a whole set, so a GPU-hour holds more useful work; the data is no worse
(every group trained once, no token older than k), so A stays. Here the
compute axes count every generated token once (`compute.py`) and both
schedules train on every group they generate, so on the FLOPs axis the two
differ only in learning dynamics (PPO's batches lag 0 .. k - 1 as wholes,
PipelineRL's completions mix versions up to k): a gap in B on that axis is a
learning effect, not the utilisation the paper measured. On device-seconds,
continuous batching keeps PipelineRL's slots full where each PPO set ends on a
tail of long sequences in nearly empty slots: that part of the gain is
measured. The other part, generation overlapping training on separate
devices, is not: per step it would count max(`time/generate_s`,
`time/train_s`) rather than their sum.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import ClassVar

import ml_collections

SCHEDULES: dict[str, type["Schedule"]] = {}


def register(name: str):
  """Class decorator: registers a `Schedule` under `name` (the config string)."""
  def wrap(cls: type["Schedule"]) -> type["Schedule"]:
    if name in SCHEDULES:
      raise ValueError(f"schedule {name!r} is registered twice")
    SCHEDULES[name] = cls
    return cls
  return wrap


@dataclasses.dataclass(frozen=True)
class Schedule(abc.ABC):
  """What the generator may do, as a function of counts (no arrays, no state)."""
  max_off_policy: int  # k.
  prompts_per_step: int  # P: groups the trainer takes per step.
  decode_steps_per_call: int  # Steps of one sampler call; weights change between calls only.
  decode_steps_per_train_step: int  # D: the emulated generator's speed (see the module doc).

  slot_batches: ClassVar[int]  # Default sampler slots, in batches of P x G.

  @abc.abstractmethod
  def max_starts(self, version: int, backlog: int) -> int:
    """Groups the generator may start now.

    Args:
      version: the trainer's policy version (steps done).
      backlog: groups started and not yet consumed.

    Returns:
      A count >= 0; the sampler starts at most this many (fewer when slots are busy).
    """

  @abc.abstractmethod
  def decode_steps(self, decoded: int, ready: int, in_flight: int) -> int:
    """Decode steps of the next sampler call; 0 ends this step's generation.

    Args:
      decoded: decode steps already run in this train step.
      ready: groups the buffer could hand the trainer now.
      in_flight: groups started and not finished.

    Returns:
      A count >= 0.
    """


@register("pipeline_rl")
class PipelineRL(Schedule):
  """PipelineRL-k: in-flight weight updates; k bounds lag by holding the generator back."""

  slot_batches = 2  # A second batch in flight while the first finishes.

  def max_starts(self, version: int, backlog: int) -> int:
    del version  # The bound depends on how far the generator is ahead, not on when.
    return max(0, (self.max_off_policy + 1) * self.prompts_per_step - backlog)

  def decode_steps(self, decoded: int, ready: int, in_flight: int) -> int:
    if not in_flight:  # Held back with nothing running: the generator waits.
      return 0
    if decoded < self.decode_steps_per_train_step:
      return min(self.decode_steps_per_call, self.decode_steps_per_train_step - decoded)
    return self.decode_steps_per_call if ready < self.prompts_per_step else 0


@register("ppo_off_policy")
class PPOOffPolicy(Schedule):
  """PPO-off-policy-k: every k steps, k batches generated with one set of weights."""

  slot_batches = 1

  def max_starts(self, version: int, backlog: int) -> int:
    if version % self.max_off_policy:
      return 0
    return max(0, self.max_off_policy * self.prompts_per_step - backlog)

  def decode_steps(self, decoded: int, ready: int, in_flight: int) -> int:
    del decoded, ready  # The whole set finishes with the weights it started with.
    return self.decode_steps_per_call if in_flight else 0


def make(config: ml_collections.ConfigDict) -> Schedule:
  """The schedule named by `config.buffer.schedule`, bound to the config's counts."""
  return SCHEDULES[config.buffer.schedule](
      max_off_policy=config.buffer.max_off_policy,
      prompts_per_step=config.data.prompts_per_step,
      decode_steps_per_call=config.sampling.decode_steps_per_call,
      decode_steps_per_train_step=config.buffer.decode_steps_per_train_step)


def num_slots(config: ml_collections.ConfigDict) -> int:
  """Sampler slots of a run: `sampling.num_slots`, or the schedule's default when 0."""
  p, g = config.data.prompts_per_step, config.data.generations_per_prompt
  return config.sampling.num_slots or SCHEDULES[config.buffer.schedule].slot_batches * p * g
