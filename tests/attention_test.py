"""Tests of scalerl_jax/models/attention.py and its blockwise and splash
kernels: every kernel against `plain`."""

import functools
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec
import numpy as np
import pytest

from configs import scalerl
from scalerl_jax import config as config_lib
from scalerl_jax import sharding
from scalerl_jax.jobs.planner import aot
from scalerl_jax.models import attention
from scalerl_jax.models import blockwise_attention
from scalerl_jax.models import decode
from scalerl_jax.models import kv_cache
from scalerl_jax.models import model_config
from scalerl_jax.models import splash_attention
from scalerl_jax.models import transformer
from tests import helpers

_F32 = jnp.float32


def _qkv(b, t, h, k, e, seed=0):
  keys = jax.random.split(jax.random.key(seed), 3)
  return (
      jax.random.normal(keys[0], (b, t, h, e)),
      jax.random.normal(keys[1], (b, t, k, e)),
      jax.random.normal(keys[2], (b, t, k, e)),
  )


def _padding(lengths, t):
  """Segment ids of right-padded rows: 1 on a row's tokens, 0 on its pads."""
  return (jnp.arange(t)[None, :] < jnp.asarray(lengths)[:, None]).astype(
      jnp.int32
  )


@functools.partial(jax.jit, static_argnums=0)
def _forward_and_grads(fn, q, k, v, seg):
  # A fixed random cotangent, so that every output entry reaches the gradients.
  w = jax.random.normal(jax.random.key(9), q.shape)
  loss = lambda q, k, v: jnp.sum(fn(q, k, v, seg, dtype=_F32) * w)
  return fn(q, k, v, seg, dtype=_F32), jax.grad(loss, argnums=(0, 1, 2))(
      q, k, v
  )


def _max_errors(fn, q, k, v, seg):
  out, grads = _forward_and_grads(fn, q, k, v, seg)
  ref_out, ref_grads = _forward_and_grads(
      transformer.plain_attention, q, k, v, seg
  )
  return [
      float(jnp.max(jnp.abs(a - b)))
      for a, b in zip((out,) + grads, (ref_out,) + ref_grads)
  ]


@pytest.mark.parametrize(
    "t,h,k,block,lengths",
    [
        (
            40,
            4,
            2,
            16,
            None,
        ),  # Grouped-query heads; 40 = 2.5 blocks (padded keys).
        (40, 4, 2, 16, (40, 23)),  # A padded row.
        (33, 3, 3, 64, (5, 33)),  # One block; multi-head, K = H.
        (48, 4, 1, 8, (48, 9)),  # One kv head; many blocks.
    ],
)
def test_blockwise_equals_plain_forward_and_gradients(t, h, k, block, lengths):
  q, kk, v = _qkv(2, t, h, k, 16)
  seg = None if lengths is None else _padding(lengths, t)
  fn = functools.partial(blockwise_attention.blockwise, block_size=block)
  assert max(_max_errors(fn, q, kk, v, seg)) < 1e-5


def test_blockwise_padding_changes_padded_rows_only():
  # The segment ids reach the kernel: pads see only pads, real tokens are
  # unaffected by them (causality already hides right padding).
  q, k, v = _qkv(1, 24, 2, 1, 8)
  seg = _padding((10,), 24)
  fn = functools.partial(
      blockwise_attention.blockwise, dtype=_F32, block_size=8
  )
  with_pads, without = fn(q, k, v, seg), fn(q, k, v, None)
  np.testing.assert_allclose(with_pads[:, :10], without[:, :10], atol=1e-6)
  assert float(jnp.max(jnp.abs(with_pads[:, 10:] - without[:, 10:]))) > 1e-2


@pytest.mark.parametrize(
    "t,h,k,lengths",
    [
        (128, 2, 2, None),
        (256, 2, 1, (256, 100)),  # MQA kernel; a padded row.
        (200, 4, 2, None),  # Grouped-query heads; T padded to the 256 tile.
    ],
)
def test_splash_interpret_equals_plain_forward_and_gradients(t, h, k, lengths):
  q, kk, v = _qkv(2, t, h, k, 64, seed=1)
  seg = None if lengths is None else _padding(lengths, t)
  fn = functools.partial(splash_attention.splash, interpret=True)
  assert max(_max_errors(fn, q, kk, v, seg)) < 1e-5


def test_splash_under_a_mesh_runs_in_shard_map():
  # The axes come from the config's logical rules; the TPU compile test below
  # splits them over four devices.
  config = scalerl.get_config()
  mesh = sharding.make_mesh(config.mesh, jax.devices()[:1])
  rules = sharding.logical_rules(config.mesh)
  q, k, v = _qkv(2, 128, 4, 2, 64, seed=2)
  with sharding.activate(mesh, rules):
    abstract = mesh.abstract_mesh
    assert splash_attention._mesh_axes(abstract, 2, 2) == (
        ("data", "fsdp"),
        "tensor",
    )
    out = jax.jit(
        functools.partial(splash_attention.splash, dtype=_F32, interpret=True)
    )(q, k, v)
  ref = transformer.plain_attention(q, k, v, dtype=_F32)
  assert float(jnp.max(jnp.abs(out - ref))) < 1e-5


def test_splash_compiles_for_a_tpu_slice_under_auto():
  # The TPU compiler, from abstract inputs on a v5e 2x2 slice's devices: auto
  # must pick splash there (the mesh says tpu on a CPU host), and the compiled
  # forward and backward must not hold [T, T] scores.
  pytest.importorskip(
      "libtpu", reason="libtpu is not installed (pip install 'jax[tpu]')"
  )
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  # Other processes on this host may hold libtpu's lock;
  # compiling needs no chip.
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  topology = topologies.get_topology_desc(
      topology_name="v5e:2x2", platform="tpu"
  )
  mesh = topologies.make_mesh(topology, (1, 4, 1), ("data", "fsdp", "tensor"))
  rules = sharding.logical_rules(scalerl.get_config().mesh)
  b, t, h, k, e = 4, 4096, 4, 2, 128
  spec = NamedSharding(
      mesh, PartitionSpec(("data", "fsdp"), None, "tensor", None)
  )

  def loss(q, kk, v):
    return jnp.sum(
        attention.apply("auto", q, kk, v, dtype=jnp.bfloat16).astype(_F32)
    )

  with sharding.activate(mesh, rules):
    assert attention.resolve("auto", t, jnp.bfloat16) == "splash"
    args = [
        jax.ShapeDtypeStruct((b, t, n, e), jnp.bfloat16, sharding=spec)
        for n in (h, k, k)
    ]
    compiled = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(*args).compile()
  # The Mosaic kernel, not the interpreter.
  assert "tpu_custom_call" in compiled.as_text()
  # A chip's float32 scores are 4 heads x 4096^2 x 4 bytes = 256 MiB; plain's
  # program needed 425 MiB of temporaries here, splash's under 1 MiB.
  assert aot.compiled_memory(compiled, "tpu").temporaries < 16 * 2**20


@pytest.mark.parametrize(
    "b,k,expected",
    [
        (4, 2, (("data", "fsdp"), "tensor")),
        (1, 2, (None, "tensor")),  # One prompt's prefill on a 4-way batch axis.
        (8, 1, (("data", "fsdp"), None)),  # One kv head cannot split two ways.
    ],
)
def test_splash_mesh_axes_split_what_divides(b, k, expected):
  mesh = jax.sharding.AbstractMesh((1, 4, 2), ("data", "fsdp", "tensor"))
  with nn.logical_axis_rules(sharding.logical_rules(scalerl.get_config().mesh)):
    assert splash_attention._mesh_axes(mesh, b, k) == expected


@pytest.mark.parametrize(
    "platform,t,dtype,expected",
    [
        ("tpu", 100, jnp.float32, "splash"),
        ("tpu", 16_384, jnp.bfloat16, "splash"),
        ("gpu", 16_384, jnp.bfloat16, "cudnn"),
        ("cuda", 100, jnp.bfloat16, "cudnn"),
        # cuDNN's kernel takes 16-bit inputs only.
        ("gpu", 100, jnp.float32, "plain"),
        ("gpu", attention.LONG_SEQ_LEN, jnp.float32, "blockwise"),
        ("cpu", attention.LONG_SEQ_LEN - 1, jnp.float32, "plain"),
        ("cpu", attention.LONG_SEQ_LEN, jnp.float32, "blockwise"),
    ],
)
def test_auto_picks_by_platform(platform, t, dtype, expected):
  assert attention.pick(platform, t, dtype) == expected


def test_auto_reads_the_mesh_platform():
  # No mesh: the CPU backend.
  assert attention.resolve("auto", 10, _F32) == "plain"
  assert attention.resolve("blockwise", 10, _F32) == "blockwise"
  mesh = jax.make_mesh((1,), ("data",), devices=jax.devices()[:1])
  with jax.set_mesh(mesh):
    assert attention.platform() == "cpu"


def test_registry():
  assert attention.IMPLS.names() == (
      "auto",
      "blockwise",
      "cudnn",
      "plain",
      "splash",
  )
  with pytest.raises(ValueError, match="already registered"):
    attention.IMPLS.register("blockwise")(blockwise_attention.blockwise)
  with pytest.raises(ValueError, match="reserved"):
    attention.IMPLS.register("auto")(blockwise_attention.blockwise)
  with pytest.raises(ValueError, match="model.attention: 'flash'"):
    attention.apply("flash", *_qkv(1, 4, 2, 1, 8), dtype=_F32)


def test_config_names_the_field():
  config = scalerl.get_config()
  with config.unlocked():
    config.model.attention = "flash"
  with pytest.raises(
      config_lib.ConfigError, match=r"model.attention: 'flash' is not one of"
  ):
    config_lib.validate(config)
  with config.unlocked():
    config.model.attention = "cudnn"
  with pytest.raises(
      config_lib.ConfigError, match="model.attention: 'cudnn' needs .*bfloat16"
  ):
    config_lib.validate(config)
  with config.unlocked():
    config.model.compute_dtype = "bfloat16"
  config_lib.validate(config)


def test_cudnn_arguments_on_the_xla_implementation():
  # The cuDNN entry's layout, causality and grouping, run through the same
  # JAX call's XLA implementation (a CPU has no cuDNN).
  # T = 23 is padded to cuDNN's length multiple and cut back.
  q, k, v = _qkv(2, 23, 4, 2, 16, seed=3)
  xla = functools.partial(
      attention._dot_product_attention, implementation="xla"
  )
  assert max(_max_errors(xla, q, k, v, None)) < 1e-5


def _model(attention_name):
  config = scalerl.get_config()
  with config.unlocked():
    config.model.attention = attention_name
  return transformer.Transformer(
      model_config.ModelConfig.from_config(config.model)
  )


@pytest.mark.skipif(
    jax.default_backend() != "gpu", reason="cuDNN's kernel needs an NVIDIA GPU"
)
# 1,279: a train step's length that cuDNN refused unpadded.
@pytest.mark.parametrize("t,h,k", [(512, 8, 2), (300, 4, 4), (1279, 4, 2)])
def test_cudnn_equals_plain_on_a_gpu(t, h, k):
  # cuDNN computes in bfloat16; the reference is plain attention in float32 on
  # the same bfloat16-rounded inputs. A bfloat16 output carries ~2^-9 relative
  # error, so the bound is 1% of each tensor's largest entry.
  q, kk, v = (x.astype(jnp.bfloat16) for x in _qkv(2, t, h, k, 128, seed=4))
  w = jax.random.normal(jax.random.key(9), q.shape)

  def run(fn, dtype):
    loss = lambda *qkv: jnp.sum(fn(*qkv, None, dtype=dtype).astype(_F32) * w)
    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))(q, kk, v)

  cudnn = attention._IMPLS["cudnn"]
  (_, grads), (_, ref_grads) = (
      run(cudnn, jnp.bfloat16),
      run(transformer.plain_attention, _F32),
  )
  for g, ref in zip(grads, ref_grads):
    g, ref = g.astype(_F32), ref.astype(_F32)
    assert float(jnp.max(jnp.abs(g - ref))) < 1e-2 * float(
        jnp.max(jnp.abs(ref))
    )
  out = jax.jit(functools.partial(cudnn, dtype=jnp.bfloat16))(q, kk, v, None)
  ref = transformer.plain_attention(q, kk, v, None, dtype=_F32)
  err = jnp.max(jnp.abs(out.astype(_F32) - ref))
  assert float(err) < 1e-2 * float(jnp.max(jnp.abs(ref)))
  # cuDNN's fused kernel, not XLA's fallback.
  hlo = (
      jax.jit(functools.partial(cudnn, dtype=jnp.bfloat16))
      .lower(q, kk, v, None)
      .compile()
      .as_text()
  )
  assert "__cudnn$fmha" in hlo


def test_transformer_blockwise_equals_plain():
  tokens = jax.random.randint(jax.random.key(0), (2, 70), 0, 512)
  plain = _model("plain")
  params = jax.jit(plain.init)(jax.random.key(1), tokens)
  logits = {
      name: jax.jit(_model(name).apply)(params, tokens)
      for name in ("plain", "blockwise", "auto")
  }
  np.testing.assert_allclose(
      logits["blockwise"], logits["plain"], atol=1e-5, rtol=0
  )
  # Another kernel.
  assert float(jnp.max(jnp.abs(logits["blockwise"] - logits["plain"]))) > 0
  # auto = plain on CPU here.
  assert logits["auto"].tobytes() == logits["plain"].tobytes()


def test_prefill_through_blockwise_equals_plain():
  tokens = jax.random.randint(jax.random.key(2), (2, 40), 0, 512)
  pos = jnp.broadcast_to(jnp.arange(40), (2, 40))
  params = helpers.init_params(_model("plain"), seed=3)

  @functools.partial(jax.jit, static_argnums=0)
  def prefill(cfg, params):
    return decode.forward(
        cfg,
        decode.prepare(cfg, params),
        tokens,
        pos,
        kv_cache.init_cache(cfg, 2, 40),
    )

  (plain_logits, plain_cache), (logits, cache) = (
      prefill(_model(name).cfg, params) for name in ("plain", "blockwise")
  )
  np.testing.assert_allclose(logits, plain_logits, atol=1e-5, rtol=0)
  assert float(jnp.max(jnp.abs(logits - plain_logits))) > 0  # Another kernel.
  for a, b in zip(jax.tree.leaves(cache), jax.tree.leaves(plain_cache)):
    np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)
