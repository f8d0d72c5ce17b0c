"""The run's programs lowered from abstract inputs, by the trainer's and the
sampler's own code, with what the rest of the run holds beside each.

No weights and no device memory: `jobs/planner/aot.py` compiles what this
lowers.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from scalerl_jax import evaluation
from scalerl_jax import sharding
from scalerl_jax.metrics import compute
from scalerl_jax.models import model_config
from scalerl_jax.rl import batch as batch_lib
from scalerl_jax.rl import schedules
from scalerl_jax.rl import slot_runner
from scalerl_jax.rl import step_parts
from scalerl_jax.rl import train_step as train_step_lib
from scalerl_jax.sampling import slots as slots_lib
from scalerl_jax.sampling.sampler import Sampler
from scalerl_jax.sampling.settings import SamplingSettings


@dataclasses.dataclass
class Programs:
  """Each program as a thunk returning its `Lowered`, with its bytes beside."""

  lower: dict[str, Callable[[], Any]]
  beside: dict[str, int]
  # A decode step's least traffic: the regrouped weights and every slot's full
  # cache read once (all slots at the full budget).
  decode_floor: dict[str, int]
  # `Result.kernel_reads` of each decode program.
  kernel_reads: dict[str, int]
  # Attention FLOPs per chip of one run of each program (`metrics.compute`;
  # decode at the full cache), which Pallas kernels do out of the cost
  # analysis's sight (`roofline`).
  attention_flops: dict[str, int]
  # All FLOPs per chip of one run (`metrics.compute`, the LM head included):
  # the roofline's floor where the cost analysis counts a loop's body once.
  model_flops: dict[str, int]
  # Bytes per device of what the run keeps between programs: "params" (the
  # float32 master weights), "opt_state", "train_state" (both), "slots" (the
  # rollouts in flight), "weights" (the sampler's regrouped copy).
  held: dict[str, int]


def _train_program(
    config: ml_collections.ConfigDict,
    parts: step_parts.StepParts,
    mesh,
    rules,
    hbm_budget: Optional[float],
) -> tuple[Any, Callable[[], Any]]:
  """The abstract train state, and a thunk lowering the train step on it."""
  model, optimizer, params = parts.model, parts.optimizer, parts.params
  state_sh = train_step_lib.train_state_shardings(
      optimizer, params, parts.param_shardings, mesh
  )
  train_state = sharding.abstract(
      jax.eval_shape(
          functools.partial(train_step_lib.init_state, optimizer=optimizer),
          params,
      ),
      state_sh,
  )
  step, batch_sh = train_step_lib.jit_train_step(
      config, model, mesh, rules, optimizer, state_sh, hbm_budget
  )
  p, g = config.data.prompts_per_step, config.data.generations_per_prompt
  s = config.sampling.max_prompt_len + config.sampling.max_new_tokens
  batch = sharding.abstract(batch_lib.batch_shapes(p, g, s), batch_sh)

  def train():
    with sharding.activate(mesh, rules):
      return step.lower(train_state, batch)

  return train_state, train


def _sampler(
    config: ml_collections.ConfigDict,
    mesh,
    rules,
    hbm_budget: Optional[float],
) -> Sampler:
  """The run's sampler, with stand-in token ids, under `hbm_budget`."""
  # Token ids only shape constants baked into the programs; the phrase's
  # length is a stand-in (one id per word) that no buffer depends on.
  phrase = (3,) * len(config.sampling.interruption.phrase.split())
  return Sampler.from_config(
      config,
      mesh,
      rules,
      eos_ids=(1,),
      pad_id=0,
      think_close_id=2,
      phrase_ids=phrase,
  ).with_hbm_budget(hbm_budget)


def _slot_shapes(
    config: ml_collections.ConfigDict, sampler: Sampler, mesh, rules
) -> tuple[Any, Any]:
  """The abstract slot states of the trainer's rollouts and of validation."""
  # The metadata the trainer's slots hold (the slot runner's), and none in
  # validation's (`evaluation` calls `Sampler.generate`).
  slots = sampler.state_shape(
      schedules.num_slots(config), meta_width=slot_runner.META_WIDTH
  )
  val_slots = sampler.state_shape(
      evaluation.num_slots(config, sharding.batch_divisor(mesh, rules)),
      meta_width=slots_lib.DEFAULT_META_WIDTH,
  )
  return slots, val_slots


def _prefill(
    sampler: Sampler, weights: Any, mesh, rules, width: int, state: Any
) -> Callable[[], Any]:
  """A thunk lowering the prefill ("start") of every slot of `state`."""
  n = state.seq_len.shape[0]
  rows = sharding.named_sharding(mesh, rules, ("act_batch",))
  rows_len = sharding.named_sharding(mesh, rules, ("act_batch", None))
  return lambda: sampler.programs.lower(
      "start",
      state,
      weights,
      jax.ShapeDtypeStruct((n,), jnp.int32, sharding=rows),
      jax.ShapeDtypeStruct((n, width), jnp.int32, sharding=rows_len),
      jax.ShapeDtypeStruct((n,), jnp.int32, sharding=rows),
      jax.ShapeDtypeStruct(state.meta.shape, jnp.int32, sharding=rows_len),
      jax.random.key(0),
      in_order=True,
  )


def _decode(sampler: Sampler, weights: Any, state: Any) -> Callable[[], Any]:
  """A thunk lowering one decode step ("advance") over `state`'s slots."""
  return lambda: sampler.programs.lower(
      "advance", state, weights, np.int32(0), np.int32(1), window=0
  )


def _run_shapes(
    config: ml_collections.ConfigDict,
    sampler: Sampler,
    num_slots: int,
    val_rows: int,
) -> dict[str, tuple[int, int, int, int]]:
  """Each program's (rows, tokens, cached positions, passes) of one run."""
  # Each program's rows, tokens and cached positions per run, and 3 for the
  # train step (forward and backward, as `compute.train_flops`). A decode
  # step at the full cache; one microbatch of the train step, which is what
  # its cost analysis counts (`step_estimate`).
  p, g = config.data.prompts_per_step, config.data.generations_per_prompt
  s = config.sampling.max_prompt_len + config.sampling.max_new_tokens
  width = config.sampling.max_prompt_len
  full = sampler.settings.cache_len - 1
  return {
      "train_step": (p * g // config.trainer.microbatches, s, 0, 3),
      "prefill": (num_slots, width, 0, 1),
      "decode": (num_slots, 1, full, 1),
      "val_prefill": (val_rows, width, 0, 1),
      "val_decode": (val_rows, 1, full, 1),
  }


def _flops(
    shapes: dict[str, tuple[int, int, int, int]],
    model_cfg: model_config.ModelConfig,
    chips: int,
    count: Callable[..., int],
) -> dict[str, int]:
  """`count`(model, tokens, past) over each program's rows, per chip."""
  return {"prepare": 0} | {
      name: k * rows * count(model_cfg, tokens, past) // chips
      for name, (rows, tokens, past, k) in shapes.items()
  }


def _held(train_state: Any, slots: Any, weights: Any) -> dict[str, int]:
  """Per-device bytes the run keeps between programs (`Programs.held`)."""
  return {
      "params": sharding.per_device_bytes(train_state.params),
      "train_state": sharding.per_device_bytes(train_state),
      "slots": sharding.per_device_bytes(slots),
      "weights": sharding.per_device_bytes(weights),
      "opt_state": sharding.per_device_bytes(train_state.opt_state),
  }


def _beside(held: dict[str, int]) -> dict[str, int]:
  """Bytes the rest of the run holds while each program runs."""
  # While a program runs, the rest of the run holds: the train state during
  # generation (its params are the prepare's argument), and the rollout
  # slots during training and validation (slots survive between phases).
  return {
      "train_step": held["slots"],
      "prepare": held["slots"] + held["opt_state"],
      "prefill": held["train_state"],
      "decode": held["train_state"],
      "val_prefill": held["train_state"] + held["slots"],
      "val_decode": held["train_state"] + held["slots"],
  }


def _decode_floor(
    weights: int, states: dict[str, Any], settings: SamplingSettings
) -> dict[str, int]:
  """Each decode program's least traffic: `weights` and the filled cache."""
  # The floor reads the cache's filled positions (`cache_len`), not the
  # padding past them (`cache_positions`, kv_cache.cache_align).
  return {
      name: weights
      + sharding.per_device_bytes(state.cache)
      * settings.cache_len
      // settings.cache_positions
      for name, state in states.items()
  }


def build_programs(
    config: ml_collections.ConfigDict,
    mesh,
    rules,
    hbm_budget: Optional[float] = None,
) -> Programs:
  """The run's programs on `mesh`, built by the trainer's and sampler's code
  (the train step's pieces by `step_parts.build`, as the benchmarks').

  `hbm_budget` is passed to `train_step.jit_train_step` and
  `Sampler.with_hbm_budget`, as the trainer does (there, per program).
  """
  parts = step_parts.build(config, mesh, rules)
  train_state, train = _train_program(config, parts, mesh, rules, hbm_budget)
  sampler = _sampler(config, mesh, rules, hbm_budget)
  weights = sampler.prepared_shape(parts.params)
  slots, val_slots = _slot_shapes(config, sampler, mesh, rules)
  prefill = functools.partial(
      _prefill, sampler, weights, mesh, rules, config.sampling.max_prompt_len
  )
  decode = functools.partial(_decode, sampler, weights)
  shapes = _run_shapes(
      config, sampler, schedules.num_slots(config), val_slots.seq_len.shape[0]
  )
  flops = functools.partial(_flops, shapes, parts.model.cfg, mesh.size)
  held = _held(train_state, slots, weights)
  decodes = {"decode": slots, "val_decode": val_slots}
  return Programs(
      lower={
          "train_step": train,
          "prepare": lambda: sampler.programs.lower("prepare", parts.params),
          "prefill": prefill(slots),
          "decode": decode(slots),
          "val_prefill": prefill(val_slots),
          "val_decode": decode(val_slots),
      },
      beside=_beside(held),
      decode_floor=_decode_floor(held["weights"], decodes, sampler.settings),
      kernel_reads={
          name: sharding.per_device_bytes(state.cache)
          for name, state in decodes.items()
          if sampler.settings.decode_attention == "pallas"
      },
      attention_flops=flops(compute.attention_flops),
      model_flops=flops(compute.forward_flops),
      held=held,
  )
