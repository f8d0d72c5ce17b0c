"""Causal self-attention for training and prefill, chosen by name.

`config.model.attention` names an implementation registered here (or, for
`plain`, beside its math in models/transformer.py), or `auto`, which `pick`s
one by the platform the model is compiled for: splash on TPU, cuDNN on GPU
(16-bit compute), plain below `LONG_SEQ_LEN` positions and blockwise from
there on CPU. The KV-cache decode step keeps its own path (models/decode.py).

Every implementation takes q [B, T, H, E], k and v [B, T, K, E] and returns
[B, T, H, E], query head k * Q + q reading kv head k. Key j is visible to query
i iff j <= i (token order; every caller's positions are 0..T-1) and, given
`segment_ids_BxT`, both carry the same id (padding: pads in a segment of their
own). Scores and softmax statistics are float32, matmul inputs `dtype`.

Shape letters: the package key, and M = T * Q query rows per kv head, C key
positions per block, N key blocks.
"""

from __future__ import annotations

import functools
import math
from typing import Callable, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu import splash_attention as sa
from jax.sharding import PartitionSpec

AttentionFn = Callable[..., jax.Array]

AUTO = "auto"
# auto on CPU: plain's [B, H, T, T] float32 scores below this many positions
# (16 MiB per head and row at 2048), blockwise from here on.
LONG_SEQ_LEN = 2048
BLOCKWISE_BLOCK = 512  # Key positions per blockwise step.
SPLASH_BLOCK = 512  # Splash's q and kv tile (sequences are padded to a multiple).
_NEG = -0.7 * float(jnp.finfo(jnp.float32).max)  # Masked score; finite, so no inf - inf.

_IMPLS: dict[str, AttentionFn] = {}


def register_attention(name: str) -> Callable[[AttentionFn], AttentionFn]:
  """Decorator registering an implementation as `config.model.attention=name`."""
  def register(fn: AttentionFn) -> AttentionFn:
    if name in _IMPLS or name == AUTO:
      raise ValueError(f"attention {name!r} is already registered" if name != AUTO
                       else f"attention {AUTO!r} is reserved for `pick`")
    _IMPLS[name] = fn
    return fn
  return register


def choices() -> tuple[str, ...]:
  """The values `config.model.attention` allows: auto and every registered name."""
  return (AUTO,) + tuple(sorted(_IMPLS))


def pick(platform: str, seq_len: int, dtype) -> str:
  """What `auto` means on `platform` ('tpu', 'gpu', 'cuda', 'cpu', ...)."""
  if platform == "tpu":
    return "splash"
  if platform in ("gpu", "cuda") and jnp.dtype(dtype).itemsize == 2:
    return "cudnn"  # cuDNN's flash attention takes 16-bit inputs only.
  return "plain" if seq_len < LONG_SEQ_LEN else "blockwise"


def platform() -> str:
  """The platform of the mesh being traced under, else JAX's default backend.

  A mesh of `jax.experimental.topologies` devices says 'tpu' on any machine,
  so a program compiled for a TPU slice from a CPU host picks splash.
  """
  device = jax.sharding.get_abstract_mesh().abstract_device
  return device.platform if device is not None else jax.default_backend()


def resolve(name: str, seq_len: int, dtype) -> str:
  """`name`, with `auto` replaced by `pick` for the current platform."""
  return pick(platform(), seq_len, dtype) if name == AUTO else name


def apply(name: str, q_BxTxHxE: jax.Array, k_BxTxKxE: jax.Array, v_BxTxKxE: jax.Array,
          segment_ids_BxT: Optional[jax.Array] = None, *, dtype) -> jax.Array:
  """Causal attention by the implementation `name` (or `auto`) -> [B, T, H, E].

  Args:
    name: a value of `choices()`.
    q_BxTxHxE: queries (rotary embedding applied).
    k_BxTxKxE: keys (rotary embedding applied).
    v_BxTxKxE: values.
    segment_ids_BxT: int ids; tokens attend only within theirs. None = one.
    dtype: matmul input dtype.
  """
  impl = resolve(name, q_BxTxHxE.shape[1], dtype)
  if impl not in _IMPLS:
    raise ValueError(f"model.attention: {name!r} is not one of {choices()}")
  return _IMPLS[impl](q_BxTxHxE, k_BxTxKxE, v_BxTxKxE, segment_ids_BxT, dtype=dtype)


def visible(segment_ids_BxT: Optional[jax.Array], b: int, t: int) -> jax.Array:
  """[B, T, T] bool: key j visible to query i (causal, same segment)."""
  causal_TxT = jnp.tril(jnp.ones((t, t), bool))
  if segment_ids_BxT is None:
    return jnp.broadcast_to(causal_TxT, (b, t, t))
  return causal_TxT[None] & (segment_ids_BxT[:, :, None] == segment_ids_BxT[:, None, :])


# --- blockwise: online softmax over key blocks, flash-style backward ---------


def _key_blocks(x_BxTxKxE: jax.Array, c: int) -> jax.Array:
  """[B, T, K, E] -> [N, B, K, C, E], padded with zeros to N * C positions."""
  b, t, k, e = x_BxTxKxE.shape
  n = -(-t // c)
  x = jnp.pad(x_BxTxKxE, ((0, 0), (0, n * c - t), (0, 0), (0, 0)))
  return x.reshape(b, n, c, k, e).transpose(1, 0, 3, 2, 4)


def _block_visible(seg_BxM, q, c):
  """Per key block [B, 1, M, C] visibility; padded keys lie after every query."""
  m = seg_BxM.shape[1]
  qpos_M = jnp.arange(m) // q

  def at(i, seg_BxC):
    kpos_C = i * c + jnp.arange(c)
    causal_MxC = qpos_M[:, None] >= kpos_C[None, :]
    return (causal_MxC[None] & (seg_BxM[:, :, None] == seg_BxC[:, None, :]))[:, None]
  return at


def _scores(q_BxKxMxE, k_BxKxCxE, dtype):
  return _bmm(q_BxKxMxE, k_BxKxCxE, 3, 3, dtype) * (q_BxKxMxE.shape[-1] ** -0.5)


def _bmm(x, y, x_axis, y_axis, dtype):
  """Batched over (B, K): contracts `x_axis` of x with `y_axis` of y (2 or 3)."""
  return jax.lax.dot_general(x.astype(dtype), y.astype(dtype),
                             (((x_axis,), (y_axis,)), ((0, 1), (0, 1))),
                             preferred_element_type=jnp.float32)


def _blockwise_inputs(q_BxTxHxE, k_BxTxKxE, v_BxTxKxE, segment_ids_BxT, c):
  b, t, h, e = q_BxTxHxE.shape
  k = k_BxTxKxE.shape[2]
  g = h // k
  q_BxKxMxE = q_BxTxHxE.reshape(b, t, k, g, e).transpose(0, 2, 1, 3, 4).reshape(b, k, t * g, e)
  seg_BxT = (jnp.zeros((b, t), jnp.int32) if segment_ids_BxT is None
             else segment_ids_BxT.astype(jnp.int32))
  n = -(-t // c)
  seg_NxBxC = jnp.pad(seg_BxT, ((0, 0), (0, n * c - t))).reshape(b, n, c).transpose(1, 0, 2)
  blocks = (jnp.arange(n), _key_blocks(k_BxTxKxE, c), _key_blocks(v_BxTxKxE, c), seg_NxBxC)
  return q_BxKxMxE, jnp.repeat(seg_BxT, g, axis=1), blocks, g


def _blockwise_forward(q_BxTxHxE, k_BxTxKxE, v_BxTxKxE, segment_ids_BxT, dtype, c):
  """(out [B, K, M, E] float32, log-sum-exp [B, K, M]) by online softmax."""
  q_BxKxMxE, seg_BxM, blocks, g = _blockwise_inputs(
      q_BxTxHxE, k_BxTxKxE, v_BxTxKxE, segment_ids_BxT, c)
  at = _block_visible(seg_BxM, g, c)

  def step(carry, block):
    max_BxKxM, sum_BxKxM, acc_BxKxMxE = carry
    i, k_BxKxCxE, v_BxKxCxE, seg_BxC = block
    vis = at(i, seg_BxC)
    s_BxKxMxC = _scores(q_BxKxMxE, k_BxKxCxE, dtype)
    new_max = jnp.maximum(max_BxKxM, jnp.max(jnp.where(vis, s_BxKxMxC, _NEG), axis=-1))
    p_BxKxMxC = jnp.where(vis, jnp.exp(s_BxKxMxC - new_max[..., None]), 0.0)
    rescale = jnp.exp(max_BxKxM - new_max)
    acc = acc_BxKxMxE * rescale[..., None] + _bmm(p_BxKxMxC, v_BxKxCxE, 3, 2, dtype)
    return (new_max, sum_BxKxM * rescale + p_BxKxMxC.sum(-1), acc), None

  b, k, m, e = q_BxKxMxE.shape
  init = (jnp.full((b, k, m), _NEG), jnp.zeros((b, k, m)), jnp.zeros((b, k, m, e)))
  (max_BxKxM, sum_BxKxM, acc_BxKxMxE), _ = jax.lax.scan(step, init, blocks)
  return acc_BxKxMxE / sum_BxKxM[..., None], max_BxKxM + jnp.log(sum_BxKxM)


def _to_heads(x_BxKxMxE, t):
  b, k, m, e = x_BxKxMxE.shape
  return x_BxKxMxE.reshape(b, k, t, m // t, e).transpose(0, 2, 1, 3, 4).reshape(b, t, -1, e)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _blockwise(q_BxTxHxE, k_BxTxKxE, v_BxTxKxE, segment_ids_BxT, dtype, c):
  out_BxKxMxE, _ = _blockwise_forward(q_BxTxHxE, k_BxTxKxE, v_BxTxKxE, segment_ids_BxT, dtype, c)
  return _to_heads(out_BxKxMxE, q_BxTxHxE.shape[1]).astype(dtype)


def _blockwise_fwd(q_BxTxHxE, k_BxTxKxE, v_BxTxKxE, segment_ids_BxT, dtype, c):
  out_BxKxMxE, lse_BxKxM = _blockwise_forward(
      q_BxTxHxE, k_BxTxKxE, v_BxTxKxE, segment_ids_BxT, dtype, c)
  out = _to_heads(out_BxKxMxE, q_BxTxHxE.shape[1]).astype(dtype)
  return out, (q_BxTxHxE, k_BxTxKxE, v_BxTxKxE, segment_ids_BxT, out_BxKxMxE, lse_BxKxM)


def _blockwise_bwd(dtype, c, residuals, dout_BxTxHxE):
  """Recomputes each key block's probabilities from the saved log-sum-exp."""
  q_BxTxHxE, k_BxTxKxE, v_BxTxKxE, segment_ids_BxT, out_BxKxMxE, lse_BxKxM = residuals
  b, t, h, e = q_BxTxHxE.shape
  q_BxKxMxE, seg_BxM, blocks, g = _blockwise_inputs(
      q_BxTxHxE, k_BxTxKxE, v_BxTxKxE, segment_ids_BxT, c)
  at = _block_visible(seg_BxM, g, c)
  k = k_BxTxKxE.shape[2]
  dout_BxKxMxE = dout_BxTxHxE.astype(jnp.float32).reshape(b, t, k, g, e).transpose(
      0, 2, 1, 3, 4).reshape(b, k, t * g, e)
  delta_BxKxM = jnp.sum(dout_BxKxMxE * out_BxKxMxE, axis=-1)

  def step(dq_BxKxMxE, block):
    i, k_BxKxCxE, v_BxKxCxE, seg_BxC = block
    s_BxKxMxC = _scores(q_BxKxMxE, k_BxKxCxE, dtype)
    p_BxKxMxC = jnp.where(at(i, seg_BxC), jnp.exp(s_BxKxMxC - lse_BxKxM[..., None]), 0.0)
    dv_BxKxCxE = _bmm(p_BxKxMxC, dout_BxKxMxE, 2, 2, dtype)
    dp_BxKxMxC = _bmm(dout_BxKxMxE, v_BxKxCxE, 3, 3, dtype)
    ds_BxKxMxC = p_BxKxMxC * (dp_BxKxMxC - delta_BxKxM[..., None]) * (e ** -0.5)
    dq = dq_BxKxMxE + _bmm(ds_BxKxMxC, k_BxKxCxE, 3, 2, dtype)
    dk_BxKxCxE = _bmm(ds_BxKxMxC, q_BxKxMxE, 2, 2, dtype)
    return dq, (dk_BxKxCxE, dv_BxKxCxE)

  dq_BxKxMxE, (dk_NxBxKxCxE, dv_NxBxKxCxE) = jax.lax.scan(
      step, jnp.zeros_like(dout_BxKxMxE), blocks)

  def from_blocks(x_NxBxKxCxE, like):
    n = x_NxBxKxCxE.shape[0]
    x = x_NxBxKxCxE.transpose(1, 0, 3, 2, 4).reshape(b, n * c, k, e)[:, :t]
    return x.astype(like.dtype)

  return (_to_heads(dq_BxKxMxE, t).astype(q_BxTxHxE.dtype),
          from_blocks(dk_NxBxKxCxE, k_BxTxKxE), from_blocks(dv_NxBxKxCxE, v_BxTxKxE), None)


_blockwise.defvjp(_blockwise_fwd, _blockwise_bwd)


@register_attention("blockwise")
def blockwise(q_BxTxHxE: jax.Array, k_BxTxKxE: jax.Array, v_BxTxKxE: jax.Array,
              segment_ids_BxT: Optional[jax.Array] = None, *, dtype,
              block_size: int = BLOCKWISE_BLOCK) -> jax.Array:
  """Online softmax over key blocks of `block_size` in pure JAX (any backend).

  The backward pass recomputes each block's probabilities from the saved
  log-sum-exp, so neither pass holds more than [B, H, T, block_size] scores.
  """
  c = min(block_size, q_BxTxHxE.shape[1])
  return _blockwise(q_BxTxHxE, k_BxTxKxE, v_BxTxKxE, segment_ids_BxT, dtype, c)


# --- splash: Pallas' TPU kernel under shard_map ------------------------------


def _mesh_axes(mesh, b: int, k: int):
  """(batch axes, head axes) of `mesh` for splash's shard_map.

  Read from the `act_batch` and `act_heads` logical-axis rules. Heads are
  split only where query and kv heads share their mesh axes, which keeps each
  device's query heads with the kv heads they read, and a dimension its axes
  do not divide (a prefill of one prompt on four chips) is not split.
  """
  def axes(name, size):
    spec = nn.logical_to_mesh_axes((name,))[0]  # One name per call: flax maps an axis once.
    names = (spec,) if isinstance(spec, str) else tuple(spec or ())
    ways = math.prod(mesh.shape[a] for a in names)
    return spec if size % ways == 0 else None

  heads = axes("act_heads", k)
  return axes("act_batch", b), heads if heads == axes("act_kv_heads", k) else None


def _splash_local(q_BxTxHxE, k_BxTxKxE, v_BxTxKxE, segment_ids_BxT, *, block, interpret):
  """The splash kernel on one device's rows and heads (T a multiple of `block`)."""
  _, t, h, e = q_BxTxHxE.shape
  k = k_BxTxKxE.shape[2]
  sizes = sa.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block,
                        block_q_dkv=block, block_kv_dkv=block, block_kv_dkv_compute=block,
                        block_q_dq=block, block_kv_dq=block)
  make = sa.make_splash_mqa if k == 1 else sa.make_splash_mha
  kernel = make(sa.MultiHeadMask([sa.CausalMask((t, t))] * h), block_sizes=sizes,
                head_shards=1, q_seq_shards=1, interpret=interpret)

  def one_row(q_HxTxE, k_KxTxE, v_KxTxE, seg_T):
    if k == 1:
      k_KxTxE, v_KxTxE = k_KxTxE[0], v_KxTxE[0]
    seg = None if seg_T is None else sa.SegmentIds(q=seg_T, kv=seg_T)
    return kernel(q_HxTxE, k_KxTxE, v_KxTxE, segment_ids=seg)

  out_BxHxTxE = jax.vmap(one_row)(
      (q_BxTxHxE * (e ** -0.5)).transpose(0, 2, 1, 3), k_BxTxKxE.transpose(0, 2, 1, 3),
      v_BxTxKxE.transpose(0, 2, 1, 3), segment_ids_BxT)
  return out_BxHxTxE.transpose(0, 2, 1, 3)


@register_attention("splash")
def splash(q_BxTxHxE: jax.Array, k_BxTxKxE: jax.Array, v_BxTxKxE: jax.Array,
           segment_ids_BxT: Optional[jax.Array] = None, *, dtype,
           interpret: Optional[bool] = None) -> jax.Array:
  """Pallas' splash attention, sharded over the mesh's batch and head axes.

  T is padded to a multiple of the kernel's tile; pads come after every real
  token, so causality hides them. Under a mesh (`sharding.activate`) the
  kernel runs in `jax.shard_map` over the axes that `act_batch` and
  `act_heads` map to; without one, on the whole arrays.

  Args:
    q_BxTxHxE, k_BxTxKxE, v_BxTxKxE, segment_ids_BxT, dtype: as for `apply`.
    interpret: run the kernel in Pallas' interpreter; None = off TPU only.
  """
  if interpret is None:
    interpret = platform() != "tpu"
  t = q_BxTxHxE.shape[1]
  block = min(SPLASH_BLOCK, -(-t // 128) * 128)
  pad = ((0, 0), (0, -(-t // block) * block - t))
  args = [jnp.pad(x.astype(dtype), pad + ((0, 0), (0, 0)))
          for x in (q_BxTxHxE, k_BxTxKxE, v_BxTxKxE)]
  if segment_ids_BxT is not None:
    args.append(jnp.pad(segment_ids_BxT.astype(jnp.int32), pad, constant_values=-1))
  body = functools.partial(_splash_local, block=block, interpret=interpret)
  if segment_ids_BxT is None:
    body = functools.partial(body, segment_ids_BxT=None)
  mesh = jax.sharding.get_abstract_mesh()
  if not mesh.empty:
    batch, heads = _mesh_axes(mesh, q_BxTxHxE.shape[0], k_BxTxKxE.shape[2])
    spec = PartitionSpec(batch, None, heads, None)
    specs = (spec,) * 3 + (PartitionSpec(batch, None),) * (len(args) - 3)
    body = jax.shard_map(body, mesh=mesh, in_specs=specs, out_specs=spec, check_vma=False)
  return body(*args)[:, :t]


# --- cudnn: jax.nn.dot_product_attention on GPU ------------------------------


def _dot_product_attention(q_BxTxHxE, k_BxTxKxE, v_BxTxKxE, segment_ids_BxT, *, dtype,
                           implementation):
  if segment_ids_BxT is not None:
    raise ValueError("model.attention='cudnn' takes no segment ids (right padding needs none)")
  return jax.nn.dot_product_attention(
      q_BxTxHxE.astype(dtype), k_BxTxKxE.astype(dtype), v_BxTxKxE.astype(dtype),
      is_causal=True, implementation=implementation)


register_attention("cudnn")(functools.partial(_dot_product_attention, implementation="cudnn"))
