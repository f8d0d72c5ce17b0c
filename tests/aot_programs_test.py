"""scalerl_jax.jobs.planner.aot_programs: the run's programs as the run builds
them (compiled for TPU slices in tests/aot_test.py)."""

import jax
import pytest

from configs import scalerl
from scalerl_jax import sharding
from scalerl_jax.jobs.planner import aot_programs
from scalerl_jax.rl import slot_runner
from scalerl_jax.sampling import slots


@pytest.fixture(scope="module")
def lowered_meta_shapes():
  """Each sampler program's slot metadata, lowered on this machine's CPU with
  the slot runner's metadata width set to 3 and the sampler's default to 2
  (both are 1), so that neither passes for the other or for a literal."""
  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(slot_runner, "META_WIDTH", 3)
    patch.setattr(slots, "DEFAULT_META_WIDTH", 2)
    config = scalerl.get_config("tiny_cpu")
    mesh = sharding.make_mesh(config.mesh, jax.devices()[:1])
    programs = aot_programs.build_programs(
        config, mesh, sharding.logical_rules(config.mesh)
    )
    return {
        name: programs.lower[name]().args_info[0][0].meta.shape
        for name in ("prefill", "decode", "val_prefill", "val_decode")
    }


def test_the_rollout_slots_hold_the_slot_runners_metadata(lowered_meta_shapes):
  # The trainer's slots are the slot runner's (its META_WIDTH); a width
  # written apart would lower programs of another shape than the run's.
  assert lowered_meta_shapes["prefill"][1] == 3
  assert lowered_meta_shapes["decode"][1] == 3


def test_validation_slots_hold_the_samplers_default_metadata(
    lowered_meta_shapes,
):
  # Validation calls `Sampler.generate` without metadata: the default width.
  assert lowered_meta_shapes["val_prefill"][1] == 2
  assert lowered_meta_shapes["val_decode"][1] == 2
