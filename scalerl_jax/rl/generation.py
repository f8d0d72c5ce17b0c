"""Generation: everything that turns prompts into the trainer's groups.

`Generation` owns the prompt pipeline, the curriculum that filters it, the
slot runner that keeps the sampler's slots busy (`rl/slot_runner.py`), the
buffer of finished groups (`rl/buffer.py`) and the off-policy schedule
(`rl/schedules.py`), which is the one home of k (`max_off_policy`). Per train
step the trainer calls `run` (generate as the schedule allows), then `take` (the
step's P groups), and checkpoints `state()`.

`run` is the generation loop, its order read top to bottom: dispatch a decode
call, harvest it, put the finished groups in the buffer, refill the slots and
dispatch the next call where the schedule already allows it
(`rewards.overlap`), collect the scores, update the curriculum. The overlap
changes no decision, only wall time. Design: docs/design/rl.md.
"""

from __future__ import annotations

import functools
from typing import Any, Optional

import jax
import ml_collections

from scalerl_jax import sharding
from scalerl_jax.data import mixture as mixture_lib
from scalerl_jax.data import pipeline as pipeline_lib
from scalerl_jax.data import tokenizer as tokenizer_lib
from scalerl_jax.metrics import busy
from scalerl_jax.rl import buffer as buffer_lib
from scalerl_jax.rl import role_watchdog
from scalerl_jax.rl import schedules
from scalerl_jax.rl import slot_runner as slot_runner_lib
from scalerl_jax.rl.buffer import Group
from scalerl_jax.sampling.sampler import Sampler


class Generation:
  """Prompts -> curriculum -> slots -> verifiers -> buffer, as scheduled."""

  def __init__(
      self,
      config: ml_collections.ConfigDict,
      sampler: Sampler,
      pool: Any,
      tok: tokenizer_lib.Tokenizer,
      records: Any,
      clock: Optional[busy.BusyClock] = None,
      watch: Optional[role_watchdog.StepWatch] = None,
  ):
    """`pool` scores completions (`RewardPool`); `records` are the prompts;
    `clock` times the generator's programs (`SlotRunner`)."""
    self.overlap = config.rewards.overlap
    self.prompts_per_step = config.data.prompts_per_step
    self.schedule = schedules.make(config)
    # One per domain in a mixture.
    self.curriculum = mixture_lib.make_curriculum(config)
    # Looked up at call time: a restore replaces the curriculum object.
    self.pipeline = pipeline_lib.make_pipeline(
        config,
        records,
        tok,
        is_retired=lambda prompt_id: self.curriculum.is_retired(prompt_id),
    )
    self.buffer = buffer_lib.RolloutBuffer()
    self.slot_runner = slot_runner_lib.SlotRunner(
        sampler=sampler,
        pool=pool,
        tok=tok,
        prompts=self.pipeline,
        num_slots=schedules.num_slots(config),
        generations=config.data.generations_per_prompt,
        reward_range=(config.rl.reward_incorrect, config.rl.reward_correct),
        rng=jax.random.key(config.seed + 1),
        clock=clock,
    )
    # The fixed mode's waits on the generator, bounded (the trainer's).
    self.watch = watch or role_watchdog.StepWatch(0.0, "")

  @staticmethod
  def slot_bytes(config: ml_collections.ConfigDict, sampler: Sampler) -> int:
    """Bytes per chip of the rollout slots a run of `config` keeps on
    `sampler`'s mesh, through training and validation too."""
    return sharding.per_device_bytes(
        sampler.state_shape(
            schedules.num_slots(config), meta_width=slot_runner_lib.META_WIDTH
        )
    )

  @property
  def flops(self) -> int:
    """FLOPs of every prompt prefilled and token decoded over the run."""
    return self.slot_runner.work["flops"]

  @property
  def max_off_policy(self) -> int:
    """k: no token trained on lags the trainer by more."""
    return self.schedule.max_off_policy

  def run(
      self,
      params: Any,
      version: int,
      weights_version: Optional[int] = None,
      decoded: int = 0,
      until: Optional[int] = None,
  ) -> int:
    """One train step's generation as the schedule allows, or its first part.

    Never ends before the buffer can hand out the next P groups (the
    schedule's contract) unless `until` stops it first. Finished groups enter
    the buffer as harvested; their scores update the curriculum once in.

    Args:
      params: the generator's weights (`Sampler.prepare`d).
      version: the policy version of the train step the groups are made for.
      weights_version: the version of `params`, each token's tag; `version`
        if None. Behind it only while the trainer computes the step's weights
        on devices of its own (`buffer.sync_at_decode_step`).
      decoded: decode steps this step's generation has run already.
      until: the decode step at which to stop, where the weights are swapped
        (between two calls, sequences kept in flight); None: none.

    Returns:
      Decode steps this step's generation has run, `decoded` included.
    """
    runner = self.slot_runner
    weights_version = version if weights_version is None else weights_version
    refill = functools.partial(
        self._refill, params, version, version - weights_version, until=until
    )
    with self.watch.on(
        role_watchdog.GENERATOR, f"starting groups for step {version}"
    ):
      steps = refill(decoded)
      ahead = None  # Steps of the call dispatched before the last scores.
      while steps:
        self.watch.waits_on(
            role_watchdog.GENERATOR,
            f"decoding its call of {steps} steps for step {version} with "
            f"weights of version {weights_version}",
        )
        if not ahead:  # Else that call is decoding already.
          runner.dispatch(params, weights_version, steps)
        decoded += steps
        groups, scoring = runner.harvest()
        for g in groups:
          self.buffer.add(g)
        # Decided and dispatched now, the next call decodes while the
        # verifiers score: the schedule reads counts, not scores. None where
        # it needs new prompts, whose filter reads the curriculum the scores
        # update: it is decided once they are in.
        ahead = refill(decoded, pull=False) if self.overlap else None
        if ahead:
          runner.dispatch(params, weights_version, ahead)
        runner.collect(groups, scoring)
        for g in groups:
          self.curriculum.update([g.record["id"]], g.scores_G[None])
        steps = ahead if ahead is not None else refill(decoded)
    return decoded

  def _refill(
      self,
      params: Any,
      version: int,
      weights_behind: int,
      decoded: int,
      pull: bool = True,
      until: Optional[int] = None,
  ) -> Optional[int]:
    """Starts what the schedule allows; the next call's steps (0: stop).

    None: the starts need new prompts and `pull` forbids reading the
    pipeline; nothing was started (`SlotRunner.fill`). The steps stop at
    `until`, where given; nothing starts there, with weights about to change.
    """
    if until is not None and decoded >= until:
      return 0
    backlog = self.slot_runner.in_flight + len(self.buffer)
    started = self.slot_runner.fill(
        params,
        self.schedule.max_starts(version, backlog, weights_behind),
        pull=pull,
    )
    if started is None:
      return None
    steps = self.schedule.decode_steps(
        decoded,
        self.buffer.num_ready(version, self.max_off_policy),
        self.slot_runner.in_flight,
    )
    return steps if until is None else min(steps, until - decoded)

  def take(self, version: int) -> list[Group]:
    """The P groups of the train step at `version`, in start order.

    Raises:
      RuntimeError: the buffer cannot supply them (a schedule fault).
    """
    p = self.prompts_per_step
    groups = self.buffer.take(p, version, self.max_off_policy)
    if groups is None:
      raise RuntimeError(
          f"step {version}: the buffer could not supply {p} fresh groups"
      )
    return groups

  def batch_metrics(self, groups: list[Group], version: int) -> dict:
    """The train batch's `train/` and `staleness/` scalars (per domain too)."""
    row = buffer_lib.batch_metrics(groups, version, self.max_off_policy)
    # train/<domain>/...; none for one source.
    row.update(mixture_lib.train_metrics(groups))
    return row

  def scalars(self) -> dict[str, float]:
    """The buffer's and the verifiers' running scalars."""
    return {
        "buffer/evicted_stale": float(self.buffer.num_evicted),
        "buffer/size": float(len(self.buffer)),
        "buffer/in_flight": float(self.slot_runner.in_flight),
        **{
            f"verify/{k}": float(v)
            for k, v in self.slot_runner.verify_stats.items()
        },
    }

  def curriculum_scalars(self) -> dict[str, float]:
    """The curriculum's running counters (per domain too in a mixture)."""
    return self.curriculum.metrics()

  def work_scalars(self) -> dict[str, float]:
    """Prompt tokens prefilled and tokens generated over the run."""
    return {
        f"counters/{k}": float(self.slot_runner.work[k])
        for k in ("prompt_tokens", "tokens_generated")
    }

  # Checkpoints: the slots go with the device state, the rest is host data.

  def state(self) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """(slot state pytree, host arrays, JSON metadata), each by part."""
    buf_arrays, buf_meta = self.buffer.state()
    slots, roll_arrays, roll_meta = self.slot_runner.state()
    # "rollouts": the slot runner's key since before its rename, so older
    # checkpoints restore.
    host = {"buffer": buf_arrays, "rollouts": roll_arrays}
    extra = {
        "pipeline": self.pipeline.get_state(),
        "curriculum": self.curriculum.state_dict(),
        "buffer": buf_meta,
        "rollouts": roll_meta,
    }
    return slots, host, extra

  def restore(
      self, slots: Any, host: dict[str, Any], extra: dict[str, Any]
  ) -> None:
    """Inverse of `state`: prompts, curriculum, buffer, then the slots."""
    self.pipeline.set_state(extra["pipeline"])
    self.curriculum = mixture_lib.restore_curriculum(extra["curriculum"])
    self.buffer.restore(host.get("buffer", {}), extra["buffer"])
    self.slot_runner.restore(slots, host.get("rollouts", {}), extra["rollouts"])
