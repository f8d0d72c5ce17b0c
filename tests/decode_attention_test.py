"""The Pallas decode-attention kernel (Pallas' interpreter on CPU) against
`transformer.attention` at T = 1, and the rule that picks it."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scalerl_jax.models import decode_attention
from scalerl_jax.models import decode_attention_gpu
from scalerl_jax.models.transformer import attention


def _inputs(b, k, q, e, s, dtype, seed=0):
  r = np.random.RandomState(seed)
  return (
      jnp.asarray(r.randn(b, 1, k, q, e), dtype),
      jnp.asarray(r.randn(b, k, e, s), dtype),
      jnp.asarray(r.randn(b, k, s, e), dtype),
  )


def _attend(
    q_Bx1xKxQxE, keys, values, lengths, dtype, position_axis=2, platform="tpu"
):
  return decode_attention.attend(
      q_Bx1xKxQxE[:, 0],
      keys,
      values,
      jnp.asarray(lengths),
      values_position_axis=position_axis,
      dtype=dtype,
      platform=platform,
  )


@pytest.mark.parametrize("position_axis", [2, 3])
@pytest.mark.parametrize(
    "k,q,e,s",
    [(2, 3, 16, 1024), (1, 7, 64, 384), (4, 1, 32, 96)],
)
def test_kernel_equals_plain_attention_at_every_length(
    position_axis, k, q, e, s
):
  # Lengths 1 (the first position alone), mid-block, a block's end and the
  # whole cache: positions after a row's are never read.
  lengths = np.array([1, s // 2 + 3, decode_attention.block_for(s), s])
  q_Bx1xKxQxE, keys, values = _inputs(len(lengths), k, q, e, s, jnp.float32)
  visible = np.arange(s)[None, None, :] < lengths[:, None, None]
  want = attention(q_Bx1xKxQxE, keys, values, visible, jnp.float32)[:, 0]
  got = _attend(
      q_Bx1xKxQxE,
      keys,
      values.swapaxes(2, 3) if position_axis == 3 else values,
      lengths,
      jnp.float32,
      position_axis,
  )
  np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)


def test_kernel_never_reads_the_blocks_past_a_rows_length():
  # NaN in every block after the one holding a row's last position cannot
  # reach its output: those blocks are not read. (Within that block, stale
  # positions are masked out of the scores, as in plain attention; a NaN
  # there would reach both through the values.)
  lengths = np.array([5, 700])
  q_Bx1xKxQxE, keys, values = _inputs(2, 2, 2, 16, 1024, jnp.float32, seed=1)
  block = decode_attention.block_for(1024)
  ends = -(-lengths // block) * block
  past = np.arange(1024)[None, :] >= ends[:, None]
  poisoned_keys = jnp.where(past[:, None, None, :], jnp.nan, keys)
  poisoned_values = jnp.where(past[:, None, :, None], jnp.nan, values)
  got = _attend(
      q_Bx1xKxQxE, poisoned_keys, poisoned_values, lengths, jnp.float32
  )
  assert np.isfinite(np.asarray(got)).all()


def test_kernel_in_bfloat16_tracks_plain_attention():
  q_Bx1xKxQxE, keys, values = _inputs(2, 2, 4, 64, 512, jnp.bfloat16, seed=2)
  lengths = np.array([100, 512])
  visible = np.arange(512)[None, None, :] < lengths[:, None, None]
  want = attention(q_Bx1xKxQxE, keys, values, visible, jnp.bfloat16)[:, 0]
  got = _attend(q_Bx1xKxQxE, keys, values, lengths, jnp.bfloat16)
  # Plain rounds the probabilities to bfloat16 before the product, the kernel
  # after it: within a few bfloat16 ulps of outputs of size ~0.1.
  err = np.abs(np.asarray(got, np.float32) - np.asarray(want, np.float32))
  assert err.max() < 2e-2


def test_blocks_and_the_auto_rule():
  assert decode_attention.block_for(16_384) == 512
  assert decode_attention.block_for(1_536) == 512
  assert decode_attention.block_for(1_280) == 256
  assert decode_attention.block_for(384) == 384  # At most a block: whole.
  assert decode_attention.block_for(1_000) is None
  assert decode_attention.choose("auto", "tpu", 16_384) == "pallas"
  assert decode_attention.choose("auto", "tpu", 1_000) == "plain"
  assert decode_attention.choose("auto", "cpu", 16_384) == "plain"
  assert decode_attention.choose("auto", "gpu", 1_000) == "pallas"
  assert decode_attention.choose("pallas", "gpu", 1_000) == "pallas"
  assert decode_attention.choose("pallas", "cpu", 160) == "pallas"
  with pytest.raises(ValueError, match="1000 positions"):
    decode_attention.choose("pallas", "tpu", 1_000)
  with pytest.raises(ValueError, match="not one of"):
    decode_attention.choose("flash", "tpu", 16_384)


def test_jit_and_grad_free():
  # The sampler jits it; it must trace with abstract lengths.
  q_Bx1xKxQxE, keys, values = _inputs(2, 2, 2, 16, 256, jnp.float32, seed=3)
  f = jax.jit(
      lambda *a: decode_attention.attend(
          *a, values_position_axis=2, dtype=jnp.float32
      )
  )
  out = f(q_Bx1xKxQxE[:, 0], keys, values, jnp.array([3, 256]))
  assert out.shape == (2, 2, 2, 16)


@pytest.mark.parametrize(
    "k,q,e,s",
    [(2, 2, 128, 200), (1, 7, 64, 100), (4, 1, 32, 64)],
)
def test_gpu_kernel_equals_plain_attention_at_every_length(k, q, e, s):
  # The Triton kernel in Pallas' interpreter. Lengths 1, within the first
  # block, a block's end, a block's end + 1 and the whole cache (no multiple
  # of the block: the last block is masked).
  block = decode_attention_gpu.BLOCK
  lengths = np.array([1, 5, min(block, s), min(block + 1, s), s])
  q_Bx1xKxQxE, keys, values = _inputs(len(lengths), k, q, e, s, jnp.float32)
  visible = np.arange(s)[None, None, :] < lengths[:, None, None]
  # Exact float32 products for the reference: on a GPU the default is TF32.
  with jax.default_matmul_precision("highest"):
    want = attention(q_Bx1xKxQxE, keys, values, visible, jnp.float32)[:, 0]
  got = _attend(q_Bx1xKxQxE, keys, values, lengths, jnp.float32, platform="gpu")
  np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)


def test_gpu_kernel_never_reads_past_a_rows_length():
  # NaN at every position from a row's length on cannot reach its output:
  # the walk stops at the length and masks the loads of its last block.
  lengths = np.array([3, 70])
  q_Bx1xKxQxE, keys, values = _inputs(2, 2, 2, 16, 128, jnp.float32, seed=4)
  past = np.arange(128)[None, :] >= lengths[:, None]
  got = _attend(
      q_Bx1xKxQxE,
      jnp.where(past[:, None, None, :], jnp.nan, keys),
      jnp.where(past[:, None, :, None], jnp.nan, values),
      lengths,
      jnp.float32,
      platform="gpu",
  )
  assert np.isfinite(np.asarray(got)).all()
