"""What a train step is built from, for programs built apart from a run.

`build(config)` makes the model, mesh, optimizer, `StepSpec` and parameters
of `config`'s train step: random parameters from a key, or sharded shapes
without one (a program lowered for a slice it does not run on). The AOT
compile (jobs/planner/aot_programs.py) and the train-step benchmarks build
through it; a run takes its parameters from a checkpoint or the warm start
(experiment.py).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import flax.linen as nn
import jax
import ml_collections
import numpy as np
import optax

from scalerl_jax import optim
from scalerl_jax import sharding
from scalerl_jax.models import model_config
from scalerl_jax.models import transformer
from scalerl_jax.rl import train_step as train_step_lib


@dataclasses.dataclass(frozen=True)
class StepParts:
  """A train step's pieces on one mesh."""

  model: transformer.Transformer
  mesh: jax.sharding.Mesh
  rules: sharding.Rules
  optimizer: optax.GradientTransformation
  spec: train_step_lib.StepSpec
  params: Any  # Arrays, or sharded jax.ShapeDtypeStructs.
  param_shardings: Any


def build(
    config: ml_collections.ConfigDict,
    mesh: Optional[jax.sharding.Mesh] = None,
    rules: Optional[sharding.Rules] = None,
    rng: Optional[jax.Array] = None,
) -> StepParts:
  """The train step's pieces of `config`.

  Args:
    config: the run's config.
    mesh: where the step runs; None: `config.mesh` on this host's devices.
    rules: the logical axis rules; None: `config.mesh`'s.
    rng: initialises the parameters; None: their sharded shapes only.
  """
  model = transformer.Transformer(
      model_config.ModelConfig.from_config(config.model)
  )
  mesh = sharding.make_mesh(config.mesh) if mesh is None else mesh
  rules = sharding.logical_rules(config.mesh) if rules is None else rules
  optimizer = optim.make_optimizer(config.optim)
  if rng is None:
    param_sh = sharding.param_shardings(model, mesh, rules)
    tokens = np.zeros((1, 1), np.int32)
    params = sharding.abstract(
        nn.unbox(
            jax.eval_shape(
                lambda: model.init(jax.random.key(0), tokens)["params"]
            )
        ),
        param_sh,
    )
  else:
    params, param_sh = sharding.init_model_params(model, rng, mesh, rules)
  return StepParts(
      model=model,
      mesh=mesh,
      rules=rules,
      optimizer=optimizer,
      spec=train_step_lib.StepSpec.from_config(config, model, optimizer),
      params=params,
      param_shardings=param_sh,
  )
