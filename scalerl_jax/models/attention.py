"""Causal self-attention for training and prefill, chosen by name.

`config.model.attention` names an implementation registered here (`plain`
beside its math in models/transformer.py), or `auto`: `pick` by platform.
Every implementation takes q [B, T, H, E], k and v [B, T, K, E] and returns
[B, T, H, E], query head k * Q + q reading kv head k. Key j is visible to
query i iff j <= i (token order) and, given `segment_ids_BxT`, both carry the
same id. Scores and softmax statistics are float32, matmul inputs `dtype`.
The KV-cache decode step keeps its own path (models/decode.py).

Design: docs/design/attention.md.

Shape letters: the package key (scalerl_jax/__init__.py), and R = T * Q query
rows per kv head, C key positions per block, J key blocks.
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

from scalerl_jax import sharding

AttentionFn = Callable[..., jax.Array]

AUTO = "auto"
# auto on CPU: plain below this many positions, blockwise from here on.
LONG_SEQ_LEN = 2048
BLOCKWISE_BLOCK = 512  # Key positions per blockwise step.
SPLASH_BLOCK = 512  # Splash's q and kv tile; sequences are padded to it.
# Masked score: finite, so no inf - inf.
_NEG = -0.7 * float(jnp.finfo(jnp.float32).max)

_IMPLS: dict[str, AttentionFn] = {}


def register_attention(name: str) -> Callable[[AttentionFn], AttentionFn]:
  """Decorator registering an implementation as `model.attention=name`."""

  def register(fn: AttentionFn) -> AttentionFn:
    if name in _IMPLS or name == AUTO:
      raise ValueError(
          f"attention {name!r} is already registered"
          if name != AUTO
          else f"attention {AUTO!r} is reserved for `pick`"
      )
    _IMPLS[name] = fn
    return fn

  return register


def choices() -> tuple[str, ...]:
  """The values `config.model.attention` allows: auto and every registered."""
  return (AUTO,) + tuple(sorted(_IMPLS))


def pick(platform: str, seq_len: int, dtype) -> str:
  """What `auto` means on `platform` ('tpu', 'gpu', 'cuda', 'cpu', ...)."""
  if platform == "tpu":
    return "splash"
  if platform in ("gpu", "cuda") and jnp.dtype(dtype).itemsize == 2:
    return "cudnn"  # cuDNN's flash attention takes 16-bit inputs only.
  return "plain" if seq_len < LONG_SEQ_LEN else "blockwise"


def platform() -> str:
  """The platform of the mesh traced under, else JAX's default backend.

  A mesh of topology devices says 'tpu' on any host (AOT compiles).
  """
  device = jax.sharding.get_abstract_mesh().abstract_device
  return device.platform if device is not None else jax.default_backend()


def resolve(name: str, seq_len: int, dtype) -> str:
  """`name`, with `auto` replaced by `pick` for the current platform."""
  return pick(platform(), seq_len, dtype) if name == AUTO else name


def apply(
    name: str,
    q_BxTxHxE: jax.Array,
    k_BxTxKxE: jax.Array,
    v_BxTxKxE: jax.Array,
    segment_ids_BxT: Optional[jax.Array] = None,
    *,
    dtype,
) -> jax.Array:
  """Causal attention by implementation `name` (a value of `choices()`).

  q and k come with the rotary embedding applied; `segment_ids_BxT` None
  means one segment. Raises ValueError for an unknown name.
  """
  impl = resolve(name, q_BxTxHxE.shape[1], dtype)
  if impl not in _IMPLS:
    raise ValueError(f"model.attention: {name!r} is not one of {choices()}")
  return _IMPLS[impl](
      q_BxTxHxE, k_BxTxKxE, v_BxTxKxE, segment_ids_BxT, dtype=dtype
  )


def visible(segment_ids_BxT: Optional[jax.Array], b: int, t: int) -> jax.Array:
  """[B, T, T] bool: key j visible to query i (causal, same segment)."""
  causal_TxT = jnp.tril(jnp.ones((t, t), bool))
  if segment_ids_BxT is None:
    return jnp.broadcast_to(causal_TxT, (b, t, t))
  return causal_TxT[None] & (
      segment_ids_BxT[:, :, None] == segment_ids_BxT[:, None, :]
  )


# --- blockwise: online softmax over key blocks, flash-style backward ---------


def _key_blocks(x_BxTxKxE: jax.Array, c: int) -> jax.Array:
  """[B, T, K, E] -> [J, B, K, C, E], padded with zeros to J * C positions."""
  b, t, k, e = x_BxTxKxE.shape
  n = -(-t // c)
  x = jnp.pad(x_BxTxKxE, ((0, 0), (0, n * c - t), (0, 0), (0, 0)))
  return x.reshape(b, n, c, k, e).transpose(1, 0, 3, 2, 4)


def _block_visible(seg_BxR, q, c):
  """Per key block [B, 1, R, C] visibility; padded keys follow every query."""
  m = seg_BxR.shape[1]
  qpos_R = jnp.arange(m) // q

  def at(i, seg_BxC):
    kpos_C = i * c + jnp.arange(c)
    causal_RxC = qpos_R[:, None] >= kpos_C[None, :]
    return (causal_RxC[None] & (seg_BxR[:, :, None] == seg_BxC[:, None, :]))[
        :, None
    ]

  return at


def _scores(q_BxKxRxE, k_BxKxCxE, dtype):
  return _bmm(q_BxKxRxE, k_BxKxCxE, 3, 3, dtype) * (q_BxKxRxE.shape[-1] ** -0.5)


def _bmm(x, y, x_axis, y_axis, dtype):
  """Batched over (B, K): contracts `x_axis` of x with `y_axis` of y."""
  return jax.lax.dot_general(
      x.astype(dtype),
      y.astype(dtype),
      (((x_axis,), (y_axis,)), ((0, 1), (0, 1))),
      preferred_element_type=jnp.float32,
  )


def _blockwise_inputs(q_BxTxHxE, k_BxTxKxE, v_BxTxKxE, segment_ids_BxT, c):
  b, t, h, e = q_BxTxHxE.shape
  k = k_BxTxKxE.shape[2]
  g = h // k
  q_BxKxRxE = (
      q_BxTxHxE.reshape(b, t, k, g, e)
      .transpose(0, 2, 1, 3, 4)
      .reshape(b, k, t * g, e)
  )
  seg_BxT = (
      jnp.zeros((b, t), jnp.int32)
      if segment_ids_BxT is None
      else segment_ids_BxT.astype(jnp.int32)
  )
  n = -(-t // c)
  seg_JxBxC = (
      jnp.pad(seg_BxT, ((0, 0), (0, n * c - t)))
      .reshape(b, n, c)
      .transpose(1, 0, 2)
  )
  blocks = (
      jnp.arange(n),
      _key_blocks(k_BxTxKxE, c),
      _key_blocks(v_BxTxKxE, c),
      seg_JxBxC,
  )
  return q_BxKxRxE, jnp.repeat(seg_BxT, g, axis=1), blocks, g


def _blockwise_forward(
    q_BxTxHxE, k_BxTxKxE, v_BxTxKxE, segment_ids_BxT, dtype, c
):
  """(out [B, K, R, E] float32, log-sum-exp [B, K, R]) by online softmax."""
  q_BxKxRxE, seg_BxR, blocks, g = _blockwise_inputs(
      q_BxTxHxE, k_BxTxKxE, v_BxTxKxE, segment_ids_BxT, c
  )
  at = _block_visible(seg_BxR, g, c)

  def step(carry, block):
    max_BxKxR, sum_BxKxR, acc_BxKxRxE = carry
    i, k_BxKxCxE, v_BxKxCxE, seg_BxC = block
    vis = at(i, seg_BxC)
    s_BxKxRxC = _scores(q_BxKxRxE, k_BxKxCxE, dtype)
    new_max = jnp.maximum(
        max_BxKxR, jnp.max(jnp.where(vis, s_BxKxRxC, _NEG), axis=-1)
    )
    p_BxKxRxC = jnp.where(vis, jnp.exp(s_BxKxRxC - new_max[..., None]), 0.0)
    rescale = jnp.exp(max_BxKxR - new_max)
    acc = acc_BxKxRxE * rescale[..., None] + _bmm(
        p_BxKxRxC, v_BxKxCxE, 3, 2, dtype
    )
    return (new_max, sum_BxKxR * rescale + p_BxKxRxC.sum(-1), acc), None

  b, k, m, e = q_BxKxRxE.shape
  init = (
      jnp.full((b, k, m), _NEG),
      jnp.zeros((b, k, m)),
      jnp.zeros((b, k, m, e)),
  )
  (max_BxKxR, sum_BxKxR, acc_BxKxRxE), _ = jax.lax.scan(step, init, blocks)
  return acc_BxKxRxE / sum_BxKxR[..., None], max_BxKxR + jnp.log(sum_BxKxR)


def _to_heads(x_BxKxRxE, t):
  b, k, m, e = x_BxKxRxE.shape
  return (
      x_BxKxRxE.reshape(b, k, t, m // t, e)
      .transpose(0, 2, 1, 3, 4)
      .reshape(b, t, -1, e)
  )


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _blockwise(q_BxTxHxE, k_BxTxKxE, v_BxTxKxE, segment_ids_BxT, dtype, c):
  out_BxKxRxE, _ = _blockwise_forward(
      q_BxTxHxE, k_BxTxKxE, v_BxTxKxE, segment_ids_BxT, dtype, c
  )
  return _to_heads(out_BxKxRxE, q_BxTxHxE.shape[1]).astype(dtype)


def _blockwise_fwd(q_BxTxHxE, k_BxTxKxE, v_BxTxKxE, segment_ids_BxT, dtype, c):
  out_BxKxRxE, lse_BxKxR = _blockwise_forward(
      q_BxTxHxE, k_BxTxKxE, v_BxTxKxE, segment_ids_BxT, dtype, c
  )
  out = _to_heads(out_BxKxRxE, q_BxTxHxE.shape[1]).astype(dtype)
  return out, (
      q_BxTxHxE,
      k_BxTxKxE,
      v_BxTxKxE,
      segment_ids_BxT,
      out_BxKxRxE,
      lse_BxKxR,
  )


def _blockwise_bwd(dtype, c, residuals, dout_BxTxHxE):
  """Recomputes each key block's probabilities from the saved log-sum-exp."""
  q_BxTxHxE, k_BxTxKxE, v_BxTxKxE, segment_ids_BxT, out_BxKxRxE, lse_BxKxR = (
      residuals
  )
  b, t, h, e = q_BxTxHxE.shape
  q_BxKxRxE, seg_BxR, blocks, g = _blockwise_inputs(
      q_BxTxHxE, k_BxTxKxE, v_BxTxKxE, segment_ids_BxT, c
  )
  at = _block_visible(seg_BxR, g, c)
  k = k_BxTxKxE.shape[2]
  dout_BxKxRxE = (
      dout_BxTxHxE.astype(jnp.float32)
      .reshape(b, t, k, g, e)
      .transpose(0, 2, 1, 3, 4)
      .reshape(b, k, t * g, e)
  )
  delta_BxKxR = jnp.sum(dout_BxKxRxE * out_BxKxRxE, axis=-1)

  def step(dq_BxKxRxE, block):
    i, k_BxKxCxE, v_BxKxCxE, seg_BxC = block
    s_BxKxRxC = _scores(q_BxKxRxE, k_BxKxCxE, dtype)
    p_BxKxRxC = jnp.where(
        at(i, seg_BxC), jnp.exp(s_BxKxRxC - lse_BxKxR[..., None]), 0.0
    )
    dv_BxKxCxE = _bmm(p_BxKxRxC, dout_BxKxRxE, 2, 2, dtype)
    dp_BxKxRxC = _bmm(dout_BxKxRxE, v_BxKxCxE, 3, 3, dtype)
    ds_BxKxRxC = p_BxKxRxC * (dp_BxKxRxC - delta_BxKxR[..., None]) * (e**-0.5)
    dq = dq_BxKxRxE + _bmm(ds_BxKxRxC, k_BxKxCxE, 3, 2, dtype)
    dk_BxKxCxE = _bmm(ds_BxKxRxC, q_BxKxRxE, 2, 2, dtype)
    return dq, (dk_BxKxCxE, dv_BxKxCxE)

  dq_BxKxRxE, (dk_JxBxKxCxE, dv_JxBxKxCxE) = jax.lax.scan(
      step, jnp.zeros_like(dout_BxKxRxE), blocks
  )

  def from_blocks(x_JxBxKxCxE, like):
    n = x_JxBxKxCxE.shape[0]
    x = x_JxBxKxCxE.transpose(1, 0, 3, 2, 4).reshape(b, n * c, k, e)[:, :t]
    return x.astype(like.dtype)

  return (
      _to_heads(dq_BxKxRxE, t).astype(q_BxTxHxE.dtype),
      from_blocks(dk_JxBxKxCxE, k_BxTxKxE),
      from_blocks(dv_JxBxKxCxE, v_BxTxKxE),
      None,
  )


_blockwise.defvjp(_blockwise_fwd, _blockwise_bwd)


@register_attention("blockwise")
def blockwise(
    q_BxTxHxE: jax.Array,
    k_BxTxKxE: jax.Array,
    v_BxTxKxE: jax.Array,
    segment_ids_BxT: Optional[jax.Array] = None,
    *,
    dtype,
    block_size: int = BLOCKWISE_BLOCK,
) -> jax.Array:
  """Online softmax over key blocks in pure JAX (any backend).

  Neither pass holds more than [B, H, T, block_size] scores.
  """
  c = min(block_size, q_BxTxHxE.shape[1])
  return _blockwise(q_BxTxHxE, k_BxTxKxE, v_BxTxKxE, segment_ids_BxT, dtype, c)


# --- splash: Pallas' TPU kernel under shard_map ------------------------------


def split_axes(mesh, name: str, size: int):
  """The mesh axes the active rules map logical `name` to, for a shard_map
  spec of a dimension of `size`; None where they do not divide it."""
  # One name per call: flax maps a mesh axis once.
  spec = nn.logical_to_mesh_axes((name,))[0]
  ways = math.prod(mesh.shape[a] for a in sharding.axes_of(spec))
  return spec if size % ways == 0 else None


def _mesh_axes(mesh, b: int, k: int):
  """(batch axes, head axes) of `mesh` for splash's shard_map, from the rules.

  Heads are split only where query and kv heads share their mesh axes; a
  dimension its axes do not divide is not split.
  """
  heads = split_axes(mesh, "act_heads", k)
  return (
      split_axes(mesh, "act_batch", b),
      heads if heads == split_axes(mesh, "act_kv_heads", k) else None,
  )


def _splash_local(
    q_BxTxHxE, k_BxTxKxE, v_BxTxKxE, segment_ids_BxT, *, block, interpret
):
  """The splash kernel on one device's rows and heads (T a block multiple)."""
  _, t, h, e = q_BxTxHxE.shape
  k = k_BxTxKxE.shape[2]
  sizes = sa.BlockSizes(
      block_q=block,
      block_kv=block,
      block_kv_compute=block,
      block_q_dkv=block,
      block_kv_dkv=block,
      block_kv_dkv_compute=block,
      block_q_dq=block,
      block_kv_dq=block,
  )
  make = sa.make_splash_mqa if k == 1 else sa.make_splash_mha
  kernel = make(
      sa.MultiHeadMask([sa.CausalMask((t, t))] * h),
      block_sizes=sizes,
      head_shards=1,
      q_seq_shards=1,
      interpret=interpret,
  )

  def one_row(q_HxTxE, k_KxTxE, v_KxTxE, seg_T):
    if k == 1:
      k_KxTxE, v_KxTxE = k_KxTxE[0], v_KxTxE[0]
    seg = None if seg_T is None else sa.SegmentIds(q=seg_T, kv=seg_T)
    return kernel(q_HxTxE, k_KxTxE, v_KxTxE, segment_ids=seg)

  out_BxHxTxE = jax.vmap(one_row)(
      (q_BxTxHxE * (e**-0.5)).transpose(0, 2, 1, 3),
      k_BxTxKxE.transpose(0, 2, 1, 3),
      v_BxTxKxE.transpose(0, 2, 1, 3),
      segment_ids_BxT,
  )
  return out_BxHxTxE.transpose(0, 2, 1, 3)


@register_attention("splash")
def splash(
    q_BxTxHxE: jax.Array,
    k_BxTxKxE: jax.Array,
    v_BxTxKxE: jax.Array,
    segment_ids_BxT: Optional[jax.Array] = None,
    *,
    dtype,
    interpret: Optional[bool] = None,
) -> jax.Array:
  """Pallas' splash attention, sharded over the mesh's batch and head axes.

  Under a mesh (`sharding.activate`) it runs in shard_map over the axes of
  `act_batch` and `act_heads`. `interpret` runs the kernel in Pallas'
  interpreter; None means off TPU only.
  """
  if interpret is None:
    interpret = platform() != "tpu"
  t = q_BxTxHxE.shape[1]
  block = min(SPLASH_BLOCK, -(-t // 128) * 128)
  pad = ((0, 0), (0, -(-t // block) * block - t))
  args = [
      jnp.pad(x.astype(dtype), pad + ((0, 0), (0, 0)))
      for x in (q_BxTxHxE, k_BxTxKxE, v_BxTxKxE)
  ]
  if segment_ids_BxT is not None:
    args.append(
        jnp.pad(segment_ids_BxT.astype(jnp.int32), pad, constant_values=-1)
    )
  body = functools.partial(_splash_local, block=block, interpret=interpret)
  if segment_ids_BxT is None:
    body = functools.partial(body, segment_ids_BxT=None)
  mesh = jax.sharding.get_abstract_mesh()
  if not mesh.empty:
    batch, heads = _mesh_axes(mesh, q_BxTxHxE.shape[0], k_BxTxKxE.shape[2])
    spec = PartitionSpec(batch, None, heads, None)
    specs = (spec,) * 3 + (PartitionSpec(batch, None),) * (len(args) - 3)
    body = jax.shard_map(
        body, mesh=mesh, in_specs=specs, out_specs=spec, check_vma=False
    )
  return body(*args)[:, :t]


# --- cudnn: jax.nn.dot_product_attention on GPU ------------------------------

# Lengths are padded to a multiple of this for cuDNN.
CUDNN_LEN_MULTIPLE = 64


def _dot_product_attention(
    q_BxTxHxE, k_BxTxKxE, v_BxTxKxE, segment_ids_BxT, *, dtype, implementation
):
  if segment_ids_BxT is not None:
    raise ValueError(
        "model.attention='cudnn' takes no segment ids (right padding needs none)"
    )
  # cuDNN's flash attention refuses some lengths in training (JAX 0.11.2 on
  # an H200: "Unsupported sequence length Q 1279, KV 1279"). Causal attention
  # lets T be padded at the end: no real query sees a key past itself.
  t = q_BxTxHxE.shape[1]
  pad = [(0, 0), (0, -t % CUDNN_LEN_MULTIPLE), (0, 0), (0, 0)]
  out = jax.nn.dot_product_attention(
      *(
          jnp.pad(x.astype(dtype), pad)
          for x in (q_BxTxHxE, k_BxTxKxE, v_BxTxKxE)
      ),
      is_causal=True,
      implementation=implementation,
  )
  return out[:, :t]


register_attention("cudnn")(
    functools.partial(_dot_product_attention, implementation="cudnn")
)
