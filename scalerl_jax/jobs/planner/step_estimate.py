"""How often each compiled program runs in an RL step, and the step's time.

`step_counts` counts from the config and the schedule alone, in the steady
state of a run: every completion `completion_len` tokens long and every
rollout slot busy, so a step decodes P x G x completion_len tokens over
`schedules.num_slots` slots. A run of a program is what the compiler's cost
analysis counts as one (`roofline`): the decode programs are a loop over
decode steps and the train step a loop over microbatches, and the cost
analysis counts a loop's body once (measured: `trainer.microbatches` = 2
halved the train step's FLOPs), so they run once per decode step and per
microbatch. `estimate` multiplies the counts by each program's roofline.
"""

from __future__ import annotations

import dataclasses
import math

import ml_collections

from scalerl_jax import evaluation
from scalerl_jax.rl import schedules


@dataclasses.dataclass(frozen=True)
class StepCounts:
  """Runs of each program, as its cost analysis counts one run."""

  per_step: dict[str, float]  # Every RL step: rollouts and training.
  per_validation: dict[str, float]  # One validation.
  num_steps: int  # trainer.num_steps.
  eval_every: int  # trainer.eval_every.
  # Validations over the run: at step 0, every eval_every steps, the last.
  validations: int
  completion_len: int  # Tokens of every completion.
  num_slots: int  # Rollout slots, all busy.
  decode_calls: float  # Rollout sampler calls per step.

  def amortised(self) -> dict[str, float]:
    """Runs per RL step with validation spread over `eval_every` steps."""
    return _add(self.per_step, self.per_validation, 1 / self.eval_every)

  def whole_run(self) -> dict[str, float]:
    """Runs over the whole run: `num_steps` steps and every validation."""
    steps = {k: v * self.num_steps for k, v in self.per_step.items()}
    return _add(steps, self.per_validation, self.validations)


def _add(a: dict, b: dict, scale: float) -> dict:
  return {k: a.get(k, 0.0) + scale * b.get(k, 0.0) for k in {**a, **b}}


def step_counts(
    config: ml_collections.ConfigDict, completion_len: int = 0
) -> StepCounts:
  """Runs of each program per RL step of `config`, in the steady state.

  Args:
    config: the run's config.
    completion_len: tokens of every completion; 0 = sampling.max_new_tokens,
      every completion at the full budget.

  Returns:
    The counts, keyed by the programs' names in `aot_programs`.

  Raises:
    ValueError: `completion_len` outside [0, sampling.max_new_tokens].
  """
  budget = config.sampling.max_new_tokens
  if not 0 <= completion_len <= budget:
    raise ValueError(
        f"completion_len={completion_len}: must lie in [1, "
        f"sampling.max_new_tokens={budget}], or 0 for the full budget"
    )
  length = completion_len or budget
  rows = config.data.prompts_per_step * config.data.generations_per_prompt
  slots = schedules.num_slots(config)
  # Each busy slot decodes one token per step; a step consumes P groups, so
  # in the steady state it starts P x G rows and decodes all their tokens.
  decode_steps = rows * length / slots
  samples = config.trainer.eval_samples
  val_batches = math.ceil(
      config.trainer.eval_num_prompts
      / evaluation.prompts_per_batch(config, samples)
  )
  num_steps, every = config.trainer.num_steps, config.trainer.eval_every
  return StepCounts(
      per_step={
          # The optimizer update, outside the microbatch loop, is counted
          # with every microbatch: a small overcount.
          "train_step": config.trainer.microbatches,
          "prepare": 1,  # The weights regrouped once per generate phase.
          # The compiled prefill fills every slot; a step fills P x G rows.
          "prefill": rows / slots,
          "decode": decode_steps,
      },
      # Each batch fills every validation slot and decodes to the end.
      per_validation={
          "prepare": 1,
          "val_prefill": val_batches,
          "val_decode": val_batches * length,
      },
      num_steps=num_steps,
      eval_every=every,
      validations=1 + num_steps // every + (1 if num_steps % every else 0),
      completion_len=length,
      num_slots=slots,
      decode_calls=decode_steps / config.sampling.decode_steps_per_call,
  )


@dataclasses.dataclass(frozen=True)
class Estimate:
  """Seconds of an RL step and of a run, from each program's roofline."""

  per_step: dict[str, float]  # Seconds per RL step, by program (amortised).
  step_seconds: float  # Their sum.
  run_seconds: float  # The whole run.
  missing: tuple[str, ...]  # Programs a step runs with no roofline given.


def estimate(rooflines: dict[str, float], counts: StepCounts) -> Estimate:
  """`counts` x each program's roofline seconds (`rooflines`, by name).

  Programs with no roofline add nothing and are named in `missing`, so a
  partial sum is never taken for the whole.
  """
  runs = counts.amortised()
  per_step = {k: n * rooflines[k] for k, n in runs.items() if k in rooflines}
  whole = counts.whole_run()
  return Estimate(
      per_step=per_step,
      step_seconds=sum(per_step.values()),
      run_seconds=sum(
          n * rooflines[k] for k, n in whole.items() if k in rooflines
      ),
      missing=tuple(
          sorted(k for k, n in runs.items() if n and k not in rooflines)
      ),
  )
