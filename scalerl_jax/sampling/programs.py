"""The sampler's device programs: the pure functions of slots.py and
decode_loop.py, and `decode.prepare`, jitted for one model, sampling settings
and mesh.

Each program's shardings, donation and HBM budget live here, beside its jit,
so the sampler (sampler.py) calls the same programs that the planner lowers
for a slice it does not run on (`Programs.lower`, jobs/planner/aot.py).

Design: docs/design/sampling.md.
"""

from __future__ import annotations

import functools
from typing import Any, Optional

import jax
from jax.sharding import Mesh

from scalerl_jax import sharding
from scalerl_jax.models import decode
from scalerl_jax.models.model_config import ModelConfig
from scalerl_jax.models.transformer import Transformer
from scalerl_jax.sampling import decode_loop
from scalerl_jax.sampling import slots
from scalerl_jax.sampling.settings import SamplingSettings


class Programs:
  """The jitted programs of one sampler, each traced under `rules`."""

  def __init__(
      self,
      model_cfg: ModelConfig,
      settings: SamplingSettings,
      mesh: Mesh,
      rules: sharding.Rules,
      train_rules: sharding.Rules,
      hbm_budget: Optional[float],
  ):
    """Jits the programs (each compiles on its first call).

    Args:
      model_cfg: the model (the trainer's).
      settings: sampling settings, already resolved for the mesh's platform.
      mesh: the mesh they run on.
      rules: the sampler's logical axis rules (`sharding.sampler_rules`).
      train_rules: the trainer's, whose parameter layout `prepare` reads.
      hbm_budget: bytes per chip that prefill and decode are held to where the
        compiler takes a limit (`sharding.hbm_budget_options`); None: none.
    """
    self.model_cfg = model_cfg
    self.mesh = mesh
    self.rules = rules
    self.train_rules = train_rules
    # The trainer's rules: the sampler's differ in the weights' names only.
    self.state_shardings = slots.state_shardings(
        mesh, train_rules, model_cfg.num_layers, settings.value_layout
    )
    state_sh = self.state_shardings
    small = slots.replicated(mesh)
    bind = functools.partial
    options = sharding.hbm_budget_options(
        sharding.platform_of(mesh), hbm_budget
    )
    self.empty = jax.jit(
        bind(slots.empty_state, model_cfg, settings),
        static_argnums=(0, 1),
        out_shardings=state_sh,
    )
    self.start = jax.jit(
        bind(slots.start, model_cfg, settings),
        donate_argnums=0,
        out_shardings=state_sh,
        static_argnames="in_order",
        compiler_options=options,
    )
    self.advance = jax.jit(
        bind(decode_loop.advance, model_cfg, settings),
        donate_argnums=0,
        out_shardings=state_sh,
        static_argnames="window",
        compiler_options=options,
    )
    self.take = jax.jit(
        slots.take, donate_argnums=0, out_shardings=(state_sh, small)
    )
    self.flags = jax.jit(
        lambda st: (st.active, st.done), out_shardings=(small, small)
    )
    self.longest = jax.jit(slots.longest_running, out_shardings=small)
    self.progress = jax.jit(
        lambda st: (st.prompt_len, st.seq_len, st.active & ~st.done),
        out_shardings=(small, small, small),
    )

  @functools.cached_property
  def prepare(self) -> Any:
    """`decode.prepare`, jitted, casting each weight where the trainer's
    layout keeps it (built on first use: the layout traces the model's
    init)."""
    return jax.jit(
        functools.partial(
            decode.prepare,
            self.model_cfg,
            param_shardings=sharding.param_shardings(
                Transformer(self.model_cfg), self.mesh, self.train_rules
            ),
        )
    )

  def lower(self, program: str, *args, **static) -> jax.stages.Lowered:
    """Lowers `program` ("prepare", "start" or "advance") as a call would.

    `args` may be abstract (sharded ShapeDtypeStructs, e.g.
    `Sampler.state_shape`); `start` takes the padded arguments of
    `slots.start`.
    """
    fn = {
        "prepare": self.prepare,
        "start": self.start,
        "advance": self.advance,
    }[program]
    with sharding.activate(self.mesh, self.rules):
      return fn.lower(*args, **static)
