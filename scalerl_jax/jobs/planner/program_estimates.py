"""A plan's per-device memory split by the programs a run compiles.

Named as in `aot`, whose compiled bytes are set against these.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import ml_collections

from scalerl_jax.jobs.planner.accelerators import Accelerator
from scalerl_jax.jobs.planner.plan import make_plan


@dataclasses.dataclass(frozen=True)
class Memory:
  """Per-device bytes of one compiled program (XLA's buffer assignment)."""

  arguments: int
  outputs: int
  aliased: int  # Outputs written into donated arguments.
  temporaries: int

  @property
  def peak(self) -> int:
    return self.arguments + self.outputs - self.aliased + self.temporaries


def program_estimates(
    config: ml_collections.ConfigDict,
    num_devices: int,
    platform: str = "tpu",
    chip: Optional[Accelerator] = None,
) -> dict[str, Memory]:
  """Per-device `Memory` of each program a run compiles, named as in `aot`.

  Args:
    config: the run's config.
    num_devices: devices of the mesh.
    platform: 'tpu', 'gpu' or 'cpu' (`make_plan`).
    chip: the accelerator compiled for, for what its compiler holds beyond
      the plan (`Accelerator.regroup_layer_copies`); None: nothing beyond.

  Returns:
    {program name: its `Memory`}.
  """
  p = make_plan(config, num_devices, platform)
  state = p.params + p.opt_state
  weights = p.decode_weights + p.prepared_rest
  # The regroup's staged layer weights, each as large as its output.
  staged = (chip.regroup_layer_copies if chip else 0) * p.decode_weights

  def sampler(slots: int, temps: int) -> Memory:
    return Memory(weights + slots, slots, slots, temps)

  return {
      "train_step": Memory(
          state + p.batch,
          state,
          state,
          p.grads + p.grad_accum + p.activations + p.params,
      ),
      "prepare": Memory(p.params, weights, 0, p.prepare_temps + staged),
      "prefill": sampler(p.slot_state, p.prefill_temps),
      "decode": sampler(p.slot_state, p.decode_temps + p.decode_gathered),
      "val_prefill": sampler(p.val_slot_state, p.val_prefill_temps),
      "val_decode": sampler(
          p.val_slot_state, p.val_decode_temps + p.decode_gathered
      ),
  }
