"""The KV cache of the decode path (models/decode.py): its layouts, its
allocation, and the row-wise copies the sampler's slots make of it.

One buffer per layer: keys [B, K, E, S], values [B, K, S, E] ("SE") or
[B, K, E, S] ("ES"), by platform (`value_layout`). Positions are allocated in
whole multiples of `cache_align(platform)`; those past a cache's length are
never written or attended to.

Design: docs/design/models.md. Shape letters: the package key
(scalerl_jax/__init__.py).
"""

from __future__ import annotations

from typing import Any, Optional

import jax
import jax.numpy as jnp

from scalerl_jax.models.model_config import ModelConfig

# {"k": layers x [B, K, E, S], "v": layers x [B, K, S, E] or [B, K, E, S]}
Cache = dict[str, tuple[jax.Array, ...]]

KEY_AXES = ("act_batch", "act_kv_heads", "head_dim", "act_len")
# The value cache's layouts, by name: its logical axes. "SE", position-major,
# is the layout XLA:CPU's probabilities-times-values product reads in place
# ("ES" ran slower there). "ES", as the keys, is for TPUs when head_dim is
# under their 128 lanes: an E-minor cache is padded to 128 there, and the
# compiler copied every layer's values into that padded layout. Both
# measured in docs/tpu.md ("The value cache at head_dim 64").
VALUE_LAYOUTS = {
    "SE": ("act_batch", "act_kv_heads", "act_len", "head_dim"),
    "ES": KEY_AXES,
}
TPU_LANES = 128


def value_layout(platform: str, head_dim: int) -> str:
  """The value-cache layout (a key of VALUE_LAYOUTS) for `platform`."""
  return "ES" if platform == "tpu" and head_dim < TPU_LANES else "SE"


def cache_align(platform: str) -> int:
  """Cache positions are allocated in multiples of this on `platform`.

  On TPU the keys' positions are their minor (lane) dimension. A length that
  fills no 128-lane tile made the compiler keep the cache in another layout
  and copy it inside the decode loop (docs/tpu.md, "The cache in whole lane
  tiles", has the bytes before and after).
  """
  return TPU_LANES if platform == "tpu" else 1


def allocated_length(length: int, align: int) -> int:
  """The positions a cache of `length` allocates: the next multiple of
  `align` (`cache_align`)."""
  return -(-length // align) * align


def len_axis(layout: str) -> int:
  """The position axis of a value cache in `layout`."""
  return VALUE_LAYOUTS[layout].index("act_len")


def value_order(layout: str) -> tuple[int, ...]:
  """The transpose of new values [B, T, K, E] into the cache's `layout`."""
  new = ("act_batch", "act_len", "act_kv_heads", "head_dim")
  return tuple(new.index(axis) for axis in VALUE_LAYOUTS[layout])


def init_cache(
    cfg: ModelConfig,
    batch: int,
    length: int,
    dtype=None,
    value_layout: str = "SE",
    align: int = 1,
) -> Cache:
  """An empty cache of `length` positions for `batch` rows, allocated as the
  next multiple of `align` (`cache_align`); positions past `length` are
  never written or attended to."""
  if length > cfg.max_seq_len:
    raise ValueError(
        f"KV cache length {length} exceeds model.max_seq_len {cfg.max_seq_len}"
    )
  length = allocated_length(length, align)
  dtype = dtype or cfg.dtype
  k, e, n = cfg.num_kv_heads, cfg.head_dim, cfg.num_layers
  size = {
      "act_batch": batch,
      "act_kv_heads": k,
      "act_len": length,
      "head_dim": e,
  }
  values = tuple(size[axis] for axis in VALUE_LAYOUTS[value_layout])
  return {
      "k": tuple(jnp.zeros((batch, k, e, length), dtype) for _ in range(n)),
      "v": tuple(jnp.zeros(values, dtype) for _ in range(n)),
  }


def cache_length(cache: Cache) -> int:
  return cache["k"][0].shape[-1]


def cache_prefix(cache: Cache, length: int, value_layout: str = "SE") -> Cache:
  """A copy of the first `length` positions of every row."""
  head = (slice(None),) * len_axis(value_layout)
  return {
      "k": tuple(x[..., :length] for x in cache["k"]),
      "v": tuple(x[head + (slice(length),)] for x in cache["v"]),
  }


def put_prefix(
    cache: Cache,
    part: Cache,
    rows: Any = slice(None),
    value_layout: str = "SE",
) -> Cache:
  """Writes `part` (one row per entry of `rows`) over their first positions.

  Row ids out of range are dropped.
  """
  p = cache_length(part)
  inner = (slice(None),) * (len_axis(value_layout) - 1)
  return {
      "k": tuple(
          old.at[rows, ..., :p].set(new, mode="drop")
          for old, new in zip(cache["k"], part["k"])
      ),
      "v": tuple(
          old.at[(rows,) + inner + (slice(p),)].set(new, mode="drop")
          for old, new in zip(cache["v"], part["v"])
      ),
  }


def write_rows(
    cache_BxX: jax.Array,
    update_BxX: jax.Array,
    start_B: jax.Array,
    axis: int,
    keep_B: Optional[jax.Array] = None,
) -> jax.Array:
  """Writes update[b] into cache[b] from start[b] along the cache's `axis`.

  A start too late for the update to fit is moved back until it does. One
  dynamic-update-slice per row, not a scatter: docs/design/models.md. Rows
  where `keep_B` is True write back what they hold there instead (None:
  every row writes).
  """

  def write(row_X, update_X, start, keep):
    starts = [jnp.zeros((), start.dtype)] * row_X.ndim
    starts[axis - 1] = start
    update_X = update_X.astype(row_X.dtype)
    if keep is not None:
      held_X = jax.lax.dynamic_slice(row_X, starts, update_X.shape)
      update_X = jnp.where(keep, held_X, update_X)
    return jax.lax.dynamic_update_slice(row_X, update_X, starts)

  if keep_B is None:
    return jax.vmap(lambda r, u, s: write(r, u, s, None))(
        cache_BxX, update_BxX, start_B
    )
  return jax.vmap(write)(cache_BxX, update_BxX, start_B, keep_B)
