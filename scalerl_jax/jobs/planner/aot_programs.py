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
from scalerl_jax.rl import batch as batch_lib
from scalerl_jax.rl import schedules
from scalerl_jax.rl import slot_runner
from scalerl_jax.rl import step_parts
from scalerl_jax.rl import train_step as train_step_lib
from scalerl_jax.sampling import slots as slots_lib
from scalerl_jax.sampling.sampler import Sampler


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
  model, optimizer, params = parts.model, parts.optimizer, parts.params
  model_cfg = model.cfg
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

  # Token ids only shape constants baked into the programs; the phrase's
  # length is a stand-in (one id per word) that no buffer depends on.
  phrase = (3,) * len(config.sampling.interruption.phrase.split())
  sampler = Sampler.from_config(
      config,
      mesh,
      rules,
      eos_ids=(1,),
      pad_id=0,
      think_close_id=2,
      phrase_ids=phrase,
  ).with_hbm_budget(hbm_budget)
  weights = sampler.prepared_shape(params)
  num_slots = schedules.num_slots(config)
  # The metadata the trainer's slots hold (the slot runner's), and none in
  # validation's (`evaluation` calls `Sampler.generate`).
  slots = sampler.state_shape(num_slots, meta_width=slot_runner.META_WIDTH)
  val_slots = sampler.state_shape(
      evaluation.num_slots(config, sharding.batch_divisor(mesh, rules)),
      meta_width=slots_lib.DEFAULT_META_WIDTH,
  )
  width = config.sampling.max_prompt_len

  def prefill(state):
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

  def decode(state):
    return lambda: sampler.programs.lower(
        "advance", state, weights, np.int32(0), np.int32(1), window=0
    )

  def train():
    with sharding.activate(mesh, rules):
      return step.lower(train_state, batch)

  # Each program's rows, tokens and cached positions per run, and 3 for the
  # train step (forward and backward, as `compute.train_flops`). A decode
  # step at the full cache; one microbatch of the train step, which is what
  # its cost analysis counts (`step_estimate`).
  full = sampler.settings.cache_len - 1
  val_rows = val_slots.seq_len.shape[0]
  shapes = {
      "train_step": (p * g // config.trainer.microbatches, s, 0, 3),
      "prefill": (num_slots, width, 0, 1),
      "decode": (num_slots, 1, full, 1),
      "val_prefill": (val_rows, width, 0, 1),
      "val_decode": (val_rows, 1, full, 1),
  }

  def flops(count: Callable[..., int]) -> dict[str, int]:
    """`count`(model, tokens, past) over each program's rows, per chip."""
    return {"prepare": 0} | {
        name: k * rows * count(model_cfg, tokens, past) // mesh.size
        for name, (rows, tokens, past, k) in shapes.items()
    }

  held = {
      "params": sharding.per_device_bytes(train_state.params),
      "train_state": sharding.per_device_bytes(train_state),
      "slots": sharding.per_device_bytes(slots),
      "weights": sharding.per_device_bytes(weights),
      "opt_state": sharding.per_device_bytes(train_state.opt_state),
  }
  return Programs(
      lower={
          "train_step": train,
          "prepare": lambda: sampler.programs.lower("prepare", params),
          "prefill": prefill(slots),
          "decode": decode(slots),
          "val_prefill": prefill(val_slots),
          "val_decode": decode(val_slots),
      },
      # While a program runs, the rest of the run holds: the train state during
      # generation (its params are the prepare's argument), and the rollout
      # slots during training and validation (slots survive between phases).
      beside={
          "train_step": held["slots"],
          "prepare": held["slots"] + held["opt_state"],
          "prefill": held["train_state"],
          "decode": held["train_state"],
          "val_prefill": held["train_state"] + held["slots"],
          "val_decode": held["train_state"] + held["slots"],
      },
      # The floor reads the cache's filled positions (`cache_len`), not the
      # padding past them (`cache_positions`, kv_cache.cache_align).
      decode_floor={
          name: held["weights"]
          + sharding.per_device_bytes(state.cache)
          * sampler.settings.cache_len
          // sampler.settings.cache_positions
          for name, state in (("decode", slots), ("val_decode", val_slots))
      },
      kernel_reads={
          name: sharding.per_device_bytes(state.cache)
          for name, state in (("decode", slots), ("val_decode", val_slots))
          if sampler.settings.decode_attention == "pallas"
      },
      attention_flops=flops(compute.attention_flops),
      model_flops=flops(compute.forward_flops),
      held=held,
  )
