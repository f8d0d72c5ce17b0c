"""Forward logits on several meshes vs one device; run with 8 simulated devices.

Prints one JSON line per mesh shape. Used by tests/sharding_test.py, which sets
XLA_FLAGS=--xla_force_host_platform_device_count=8 before JAX starts.
"""

import json

import jax
import jax.numpy as jnp
import numpy as np

from scalerl_jax import sharding
from scalerl_jax.models import model_config
from scalerl_jax.models import transformer
from tests import helpers


def main():
  assert jax.device_count() == 8, jax.devices()
  config = helpers.tiny_config(
      num_heads=16,
      num_kv_heads=8,
      head_dim=8,
      qkv_bias=True,
      tie_embeddings=False,
  )
  cfg = model_config.ModelConfig.from_config(config.model)
  model = transformer.Transformer(cfg)
  rules = sharding.logical_rules(config.mesh)
  tokens = (
      np.random.RandomState(0)
      .randint(0, cfg.vocab_size, (8, 24))
      .astype(np.int32)
  )

  single = jax.devices()[:1]
  with config.unlocked():
    config.mesh.shape = (1, 1, 1)
  mesh1 = sharding.make_mesh(config.mesh, devices=single)
  params1, _ = sharding.init_model_params(
      model, jax.random.key(0), mesh1, rules
  )
  with sharding.activate(mesh1, rules):
    ref = np.asarray(jax.jit(model.apply)({"params": params1}, tokens)[0])

  for shape in [(8, 1, 1), (2, 2, 2), (1, 1, 8)]:
    config.mesh.shape = shape
    mesh = sharding.make_mesh(config.mesh)
    params, shardings = sharding.init_model_params(
        model, jax.random.key(0), mesh, rules
    )
    same_init = all(
        np.array_equal(a, b)
        for a, b in zip(
            jax.tree_util.tree_leaves(params),
            jax.tree_util.tree_leaves(params1),
        )
    )
    batch = sharding.place_global(
        tokens, sharding.batch_sharding(mesh, rules, tokens.ndim)
    )
    with sharding.activate(mesh, rules):
      logits = jax.jit(model.apply, out_shardings=None)(
          {"params": params}, batch
      )[0]
    q = params["layers"]["attn"]["q"]["kernel"]
    emb = params["embedding"]
    print(
        json.dumps(
            {
                "shape": shape,
                "max_abs_diff": float(np.abs(np.asarray(logits) - ref).max()),
                "same_init": same_init,
                "q_spec": [str(a) for a in q.sharding.spec],
                "q_shard_shape": list(q.addressable_shards[0].data.shape),
                "q_shape": list(q.shape),
                "embedding_shard_shape": list(
                    emb.addressable_shards[0].data.shape
                ),
                "batch_shard_rows": batch.addressable_shards[0].data.shape[0],
                "batch_divisor": sharding.batch_divisor(mesh, rules),
                "num_devices_holding_q": len(
                    {s.device for s in q.addressable_shards}
                ),
            }
        )
    )


if __name__ == "__main__":
  main()
