"""Compiles a disaggregated run's programs for a slice split between its roles.

Under mesh.layout='disaggregated' (docs/design/disaggregated.md) the trainer
takes the first devices of the slice and the generator the rest
(`sharding.role_devices`), each role laying mesh.shape over its own.
`compile_roles_for_slice` compiles the train step on the trainer's mesh and
the sampler's programs (the regroup, prefill, decode and validation's) on the
generator's, each within the HBM that what its own devices hold beside it
leaves, as `aot.compile_for_slice` compiles a colocated run's; and counts the
weight sync between the roles, for which JAX compiles no program
(`weight_sync`). `roles_report` prints them.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

import ml_collections

from scalerl_jax import config as config_lib
from scalerl_jax import sharding
from scalerl_jax.jobs.planner import accelerators
from scalerl_jax.jobs.planner import aot
from scalerl_jax.jobs.planner import program_estimates
from scalerl_jax.jobs.planner import weight_sync as weight_sync_lib
from scalerl_jax.jobs.planner.aot_programs import build_programs
from scalerl_jax.rl import step_parts

ROLES = ("trainer", "generator")
# The trainer's programs; every other program of `aot_programs` is the
# generator's.
TRAINER_PROGRAMS = ("train_step",)


def role_of(program: str) -> str:
  """The role whose devices run `program`."""
  return ROLES[0] if program in TRAINER_PROGRAMS else ROLES[1]


@dataclasses.dataclass
class RolesCompile:
  """A disaggregated run's programs compiled for a slice, by role."""

  results: dict[str, list[aot.Result]]  # Role -> its programs, in order.
  meshes: dict[str, dict]  # Role -> its mesh shape.
  chip: accelerators.Accelerator
  sync: weight_sync_lib.WeightSync


def role_config(
    config: ml_collections.ConfigDict, role: str
) -> ml_collections.ConfigDict:
  """`config` as one role's programs see it: the colocated run's on the
  role's devices (the planner and `build_programs` lay one mesh). The
  generator's copy trains in one microbatch: only the train step reads it,
  and that is the trainer's, whose microbatches need not divide over the
  generator's devices."""
  c = config.copy_and_resolve_references()
  c.mesh.layout = sharding.LAYOUTS[0]
  c.buffer.sync_at_decode_step = 0
  if role == ROLES[1]:
    c.trainer.microbatches = 1
  return c


def disaggregated_beside(held: dict[str, int]) -> dict[str, int]:
  """Bytes per device each program's devices hold beside it (`held`: the
  generator's, `aot_programs.Programs.held`), as launch.train budgets them
  (trainer.py): the trainer's devices hold nothing of the generator's; the
  generator's hold the parameters moved to them through generation and
  validation, the rollout slots through validation and the regroup (whose
  argument the moved parameters are)."""
  return {
      "train_step": 0,
      "prepare": held["slots"],
      "prefill": held["params"],
      "decode": held["params"],
      "val_prefill": held["params"] + held["slots"],
      "val_decode": held["params"] + held["slots"],
  }


def compile_roles_for_slice(
    config: ml_collections.ConfigDict,
    topology: str,
    only: Optional[list[str]] = None,
    progress: Callable[[str], None] = lambda _: None,
    check_planner: bool = False,
) -> RolesCompile:
  """Compiles `config`'s programs (or those in `only`) for `topology` split
  between the roles as mesh.generator_devices says, and counts the sync.

  Raises CompileError (bad slice name, no libtpu) or ConfigError (the config
  is not disaggregated, or a role's mesh does not fit its devices).
  """
  if sharding.layout_of(config.mesh) != "disaggregated":
    raise config_lib.ConfigError(
        "mesh.layout: compile_roles_for_slice splits the slice between the "
        "roles of 'disaggregated', not "
        f"{sharding.layout_of(config.mesh)!r} (aot.compile_for_slice's)"
    )
  devices, chip = aot.devices_of(topology)
  platform = devices[0].platform
  config_lib.validate(config, num_devices=len(devices))
  rules = sharding.logical_rules(config.mesh)
  role_devices = dict(zip(ROLES, sharding.role_devices(config.mesh, devices)))
  meshes = {
      r: sharding.make_mesh(config.mesh, d) for r, d in role_devices.items()
  }
  results = {}
  for role, mesh in meshes.items():
    role_cfg = role_config(config, role)
    programs = build_programs(role_cfg, mesh, rules)
    estimates = program_estimates.program_estimates(
        role_cfg, mesh.size, platform, chip
    )
    beside = disaggregated_beside(programs.held)
    results[role] = []
    for name in programs.lower:
      if role_of(name) != role or (only and name not in only):
        continue
      progress(
          f"compiling {name} for the {role}'s {mesh.size} devices of {topology}"
      )
      results[role].append(
          aot.compile_program(
              name,
              programs,
              estimates[name],
              beside[name],
              chip,
              platform,
              progress,
              check_planner,
          )
      )
  trainer = step_parts.build(config, meshes["trainer"], rules)
  sync = weight_sync_lib.weight_sync(
      trainer.params,
      sharding.param_shardings(trainer.model, meshes["generator"], rules),
      chip,
  )
  return RolesCompile(
      results, {r: dict(m.shape) for r, m in meshes.items()}, chip, sync
  )
