"""`Sampler.prepare` on meshes of 8 simulated devices, resident weights.

Prints one JSON line per mesh shape: whether the regrouped weights equal
`decode.prepare` on one device bit for bit, and the element types of the
all-gathers in the program after XLA's SPMD partitioner (dumped there:
XLA:CPU widens bfloat16 collectives to float32 in a later pass). Used by
tests/decode_prepare_test.py, which sets
XLA_FLAGS=--xla_force_host_platform_device_count=8 before JAX starts.
"""

import glob
import json
import os
import re
import tempfile

import jax
import numpy as np

from scalerl_jax import sharding
from scalerl_jax.models import decode
from scalerl_jax.models.model_config import ModelConfig
from scalerl_jax.models.transformer import Transformer
from scalerl_jax.sampling.sampler import Sampler
from scalerl_jax.sampling.settings import SamplingSettings
from tests import helpers

# An all-gather in HLO text, captured by its element type.
_ALL_GATHER = r"= (\w+)\[[\d,]*\]\S* all-gather(?:-start)?\("


def _partitioned_hlo(lowered) -> str:
  """`lowered`'s program as the SPMD partitioner leaves it."""
  with tempfile.TemporaryDirectory() as path:
    lowered.compile(
        {"xla_dump_to": path, "xla_dump_hlo_pass_re": "spmd-partitioning"}
    )
    (name,) = glob.glob(os.path.join(path, "*after_spmd-partitioning*.txt"))
    with open(name) as f:
      return f.read()


def main():
  assert jax.device_count() == 8, jax.devices()
  # A program from the test session's compilation cache would dump nothing.
  jax.config.update("jax_enable_compilation_cache", False)
  config = helpers.tiny_config(compute_dtype="bfloat16", fp32_lm_head=True)
  config.sampling.weight_layout = "resident"
  cfg = ModelConfig.from_config(config.model)
  rules = sharding.logical_rules(config.mesh)
  params, _ = sharding.init_model_params(
      Transformer(cfg),
      jax.random.key(0),
      sharding.make_mesh(config.mesh, devices=jax.devices()[:1]),
      rules,
  )
  one_device = jax.jit(decode.prepare, static_argnums=0)(cfg, params)
  settings = SamplingSettings.from_config(config.sampling, eos_ids=(), pad_id=0)
  for shape in [(1, 8, 1), (2, 2, 2)]:
    config.mesh.shape = shape
    mesh = sharding.make_mesh(config.mesh, devices=jax.devices())
    placed, _ = sharding.init_model_params(
        Transformer(cfg), jax.random.key(0), mesh, rules
    )
    # Rebuilt with a budget, as the trainer and launch.compile build theirs.
    sampler = Sampler(cfg, settings, mesh, rules).with_hbm_budget(2**30)
    got = sampler.prepare(placed).weights
    hlo = _partitioned_hlo(sampler.programs.lower("prepare", placed))
    types = re.findall(_ALL_GATHER, hlo)
    row = {
        "shape": list(shape),
        "equal_to_one_device": all(
            np.array_equal(a, b)
            for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(one_device))
        ),
        "all_gathers": {t: types.count(t) for t in sorted(set(types))},
    }
    print(json.dumps(row))


if __name__ == "__main__":
  main()
