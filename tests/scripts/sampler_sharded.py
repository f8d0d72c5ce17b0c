"""Sampler output on several meshes vs one device; run with 8 simulated devices.

Prints one JSON line per mesh shape, `sampling.weight_layout` and
`sampling.decode_attention`; its "shape" is the mesh shape, followed by the
layout where it is not "sharded" and the kernel where it is not "plain".
Used by tests/sampler_sharded_test.py, which sets
XLA_FLAGS=--xla_force_host_platform_device_count=8 before JAX starts.
"""

import dataclasses
import json
import re

import jax
import numpy as np

from scalerl_jax import sharding
from scalerl_jax.models.model_config import ModelConfig
from scalerl_jax.models.transformer import Transformer
from scalerl_jax.sampling.sampler import Sampler
from scalerl_jax.sampling.settings import SamplingSettings
from tests import helpers

LENS = np.array([1, 5, 16, 9, 3, 12, 7, 14])
# A collective in compiled HLO text, captured by kind.
_COLLECTIVE = (
    r"= \S+ (all-reduce|all-gather|all-to-all|collective-permute|reduce-scatter)"
    r"(?:-start)?\("
)
TEMPERATURE = {"greedy": 0.0, "sampled": 1.0}


def _outputs(config, devices, prompts, modes):
  """Completions of `prompts` on a mesh over `devices`,
  per mode (greedy / sampled)."""
  mesh = sharding.make_mesh(config.mesh, devices=devices)
  rules = sharding.logical_rules(config.mesh)
  cfg = ModelConfig.from_config(config.model)
  params, _ = sharding.init_model_params(
      Transformer(cfg), jax.random.key(0), mesh, rules
  )
  base = SamplingSettings.from_config(config.sampling, eos_ids=(), pad_id=0)
  results = {}
  for name in modes:
    sampler = Sampler(
        cfg,
        dataclasses.replace(base, temperature=TEMPERATURE[name]),
        mesh,
        rules,
    )
    results[name] = sampler.generate(params, prompts, LENS, jax.random.key(1))
  state = sampler.init_state(len(LENS))
  results["cache_shard_shape"] = list(
      state.cache["k"][0].addressable_shards[0].data.shape
  )
  # The collectives of the decode loop (whole cache and the first window).
  weights = sampler.prepare(params).weights
  results["qkv_shape"] = list(weights["layers"][0]["qkv"].shape)
  results["qkv_shard_shape"] = list(
      weights["layers"][0]["qkv"].addressable_shards[0].data.shape
  )
  results["advance_collectives"] = {}
  for window in (0, 64):
    hlo = (
        sampler.programs.lower(
            "advance", state, weights, np.int32(0), np.int32(1), window=window
        )
        .compile()
        .as_text()
    )
    ops = re.findall(_COLLECTIVE, hlo)
    results["advance_collectives"][window] = {
        op: ops.count(op) for op in sorted(set(ops))
    }
  # The prefill of every slot in order (generate's),
  # and of slots in another order.
  results["start_collectives"] = {}
  n = len(LENS)
  for name, slot_ids in (
      ("in_order", np.arange(n)),
      ("reversed", np.arange(n)[::-1]),
  ):
    args = (
        weights,
        slot_ids.astype(np.int32),
        prompts.astype(np.int32),
        LENS.astype(np.int32),
        np.zeros((n, 1), np.int32),
        jax.random.key(1),
    )
    hlo = (
        sampler.programs.lower(
            "start", sampler.init_state(n), *args, in_order=name == "in_order"
        )
        .compile()
        .as_text()
    )
    results["start_collectives"][name] = len(re.findall(_COLLECTIVE, hlo))
  return results


def main():
  assert jax.device_count() == 8, jax.devices()
  config = helpers.tiny_config()
  config.sampling.max_prompt_len = 16
  # Cache 128: generate also runs in windows 64, 96.
  config.sampling.max_new_tokens = 112
  prompts = np.random.RandomState(0).randint(
      1, config.model.vocab_size, (len(LENS), 16)
  )
  config.mesh.shape = (1, 1, 1)
  ref = _outputs(config, jax.devices()[:1], prompts, ("greedy", "sampled"))
  # Sampling is compared where the vocabulary (and so its CDF) is split.
  for shape, layout, kernel, modes in [
      ((1, 8, 1), "sharded", "plain", ("greedy",)),
      ((2, 2, 2), "sharded", "plain", ("greedy", "sampled")),
      ((8, 1, 1), "sharded", "plain", ("greedy",)),
      ((1, 8, 1), "resident", "plain", ("greedy",)),
      ((2, 2, 2), "resident", "plain", ("greedy", "sampled")),
      ((2, 2, 2), "resident", "pallas", ("greedy", "sampled")),
  ]:
    config.mesh.shape = shape
    config.sampling.weight_layout = layout
    config.sampling.decode_attention = kernel
    got = _outputs(config, jax.devices(), prompts, modes)
    row = {
        "shape": list(shape)
        + ([layout] if layout != "sharded" else [])
        + ([kernel] if kernel != "plain" else []),
        **{
            k: got[k]
            for k in (
                "cache_shard_shape",
                "qkv_shape",
                "qkv_shard_shape",
                "advance_collectives",
                "start_collectives",
            )
        },
    }
    for name in modes:
      row[f"{name}_tokens_equal"] = bool(
          np.array_equal(got[name].tokens, ref[name].tokens)
      )
      row[f"{name}_mask_equal"] = bool(
          np.array_equal(got[name].mask, ref[name].mask)
      )
      row[f"{name}_logp_max_diff"] = float(
          np.abs(got[name].gen_logp - ref[name].gen_logp).max()
      )
    print(json.dumps(row))


if __name__ == "__main__":
  main()
