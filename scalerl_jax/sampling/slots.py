"""The slot state of continuous batching: its layout, start and take.

Each of a `SlotState`'s N slots owns one KV-cache row and one row of
per-token records in the trainer's layout: prompt at positions
[0, prompt_len), completion after it, `pad_id` after the end, positions
absolute in both rows. `start` prefills prompts into free slots, `take`
frees finished ones; the decode loop that fills them is decode_loop.py.
Every function is pure and jit-able; `programs.Programs` binds the static
arguments and shardings, `sampler.Sampler` the buckets.

Design: docs/design/sampling.md.

Shape letters: the package key (scalerl_jax/__init__.py), and n new
sequences, W metadata ints per sequence; S = prompt + completion budget.
"""

from __future__ import annotations

from typing import Any, Callable

import flax.struct
import jax
import jax.numpy as jnp
from jax.sharding import Mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec

from scalerl_jax import sharding
from scalerl_jax.models import decode
from scalerl_jax.models import kv_cache
from scalerl_jax.models.model_config import DTYPES
from scalerl_jax.models.model_config import ModelConfig
from scalerl_jax.sampling import interruptions
from scalerl_jax.sampling.completions import Completions
from scalerl_jax.sampling.settings import SamplingSettings

NO_VERSION = -1  # Policy version recorded for prompt, injected and pad tokens.
# W of slots whose caller passes no metadata (`Sampler.generate`, so
# validation), and `Sampler.init_state`'s default.
DEFAULT_META_WIDTH = 1


@flax.struct.dataclass
class SlotState:
  """Device state of all slots (a pytree; donated to every update)."""

  # {"k": layers x [N, K, E, S], "v": layers x [N, K, S, E]}
  cache: kv_cache.Cache
  tokens: jax.Array  # [N, S] int32 prompt, completion, then pad_id.
  # [N, S] float32 log pi_gen at the sampling temperature; 0 where mask is 0.
  gen_logp: jax.Array
  # [N, S] float32 log-prob under the truncated sampling distribution.
  logp_sampling: jax.Array
  # [N, S] int32 policy version that chose the token; -1 where mask is 0.
  version: jax.Array
  mask: jax.Array  # [N, S] bool loss mask: True for generated tokens only.
  prompt_len: jax.Array  # [N] int32
  seq_len: jax.Array  # [N] int32 tokens in the row; the next token goes here.
  limit: jax.Array  # [N] int32 completion length at which the row stops.
  active: jax.Array  # [N] bool the slot holds a sequence not yet harvested.
  done: jax.Array  # [N] bool the sequence has ended.
  truncated: jax.Array  # [N] bool it ended at its length limit without EOS.
  # [N, S] float32: the token at position t is drawn with uniform[t], which
  # `start` sets to jax.random.uniform(fold_in(row key, t)) for every t.
  uniform: jax.Array
  meta: jax.Array  # [N, W] int32 caller's metadata, returned with the sequence.
  interruption: interruptions.InterruptionState  # [N] fields


def state_shardings(
    mesh: Mesh, rules: sharding.Rules, num_layers: int, value_layout: str
) -> SlotState:
  """`SlotState`'s shardings: slots over the batch axes, the rest replicated."""
  rows = sharding.named_sharding(mesh, rules, ("act_batch",))
  rows_pos = sharding.named_sharding(mesh, rules, ("act_batch", "act_len"))
  rows_meta = sharding.named_sharding(mesh, rules, ("act_batch", None))
  keys = sharding.named_sharding(mesh, rules, kv_cache.KEY_AXES)
  values = sharding.named_sharding(
      mesh, rules, kv_cache.VALUE_LAYOUTS[value_layout]
  )
  layers = range(num_layers)
  return SlotState(
      cache={
          "k": tuple(keys for _ in layers),
          "v": tuple(values for _ in layers),
      },
      tokens=rows_pos,
      gen_logp=rows_pos,
      logp_sampling=rows_pos,
      version=rows_pos,
      mask=rows_pos,
      prompt_len=rows,
      seq_len=rows,
      limit=rows,
      active=rows,
      done=rows,
      truncated=rows,
      uniform=rows_pos,
      meta=rows_meta,
      interruption=interruptions.InterruptionState(rows, rows, rows, rows),
  )


def replicated(mesh: Mesh) -> NamedSharding:
  """Sharding of small outputs every process reads in full."""
  return NamedSharding(mesh, PartitionSpec())


def _position_records(n: int, s: int, pad_id: int) -> dict[str, jax.Array]:
  """Empty slots' [N, S] per-position records, by `SlotState` field."""
  rows_pos = (n, s)
  return dict(
      tokens=jnp.full(rows_pos, pad_id, jnp.int32),
      gen_logp=jnp.zeros(rows_pos, jnp.float32),
      logp_sampling=jnp.zeros(rows_pos, jnp.float32),
      version=jnp.full(rows_pos, NO_VERSION, jnp.int32),
      mask=jnp.zeros(rows_pos, bool),
      uniform=jnp.zeros(rows_pos, jnp.float32),
  )


def position_record_bytes() -> tuple[int, ...]:
  """Bytes per position of each [N, S] record of a `SlotState` (the cache
  apart): what a slot holds per position besides its keys and values."""
  records = jax.eval_shape(lambda: _position_records(1, 1, 0))
  return tuple(x.dtype.itemsize for x in records.values())


def empty_state(
    model_cfg: ModelConfig,
    settings: SamplingSettings,
    num_slots: int,
    meta_width: int,
) -> SlotState:
  n, s = num_slots, settings.cache_len
  return SlotState(
      cache=kv_cache.init_cache(
          model_cfg,
          n,
          s,
          DTYPES[settings.kv_cache_dtype],
          settings.value_layout,
          settings.cache_align,
      ),
      **_position_records(n, s, settings.pad_id),
      prompt_len=jnp.zeros((n,), jnp.int32),
      seq_len=jnp.zeros((n,), jnp.int32),
      limit=jnp.zeros((n,), jnp.int32),
      active=jnp.zeros((n,), bool),
      done=jnp.zeros((n,), bool),
      truncated=jnp.zeros((n,), bool),
      meta=jnp.zeros((n, meta_width), jnp.int32),
      interruption=interruptions.empty(n),
  )


def start(
    model_cfg: ModelConfig,
    settings: SamplingSettings,
    state: SlotState,
    weights: Any,
    slot_ids_n: jax.Array,
    prompts_nxL: jax.Array,
    prompt_lens_n: jax.Array,
    meta_nxW: jax.Array,
    rng: jax.Array,
    in_order: bool = False,
) -> SlotState:
  """Prefills new prompts into their free slots (`Sampler.start`, padded).

  Slot ids >= N mark padding rows, which are dropped; `weights` are
  `decode.prepare`'s; row i draws from fold_in(rng, i) alone. `in_order`
  (static) promises n == N with row i going to slot i or padding, so rows
  are selected in place, not scattered (docs/design/sampling.md).
  """
  prompts_nxL, fresh = _prefill(
      model_cfg, settings, weights, prompts_nxL, prompt_lens_n
  )
  cache, put = _place(settings, state, fresh, slot_ids_n, in_order)
  uniform_nxS, fresh_int = _draw_rows(settings, rng, prompts_nxL.shape[0])
  return SlotState(
      cache=cache,
      **_put_records(
          settings,
          state,
          put,
          prompts_nxL,
          prompt_lens_n,
          meta_nxW,
          uniform_nxS,
      ),
      interruption=jax.tree.map(put, state.interruption, fresh_int),
  )


def _prefill(
    model_cfg: ModelConfig,
    settings: SamplingSettings,
    weights: Any,
    prompts_nxL: jax.Array,
    prompt_lens_n: jax.Array,
) -> tuple[jax.Array, kv_cache.Cache]:
  """The prompts, pad_id past their ends, and a fresh cache of their tokens."""
  n, p = prompts_nxL.shape
  layout = settings.value_layout
  in_prompt_nxL = jnp.arange(p)[None, :] < prompt_lens_n[:, None]
  prompts_nxL = jnp.where(in_prompt_nxL, prompts_nxL, settings.pad_id).astype(
      jnp.int32
  )
  pos_nxL = jnp.broadcast_to(jnp.arange(p, dtype=jnp.int32), (n, p))
  # The logits are unused, so XLA drops the LM head from this program.
  _, fresh = decode.forward(
      model_cfg,
      weights,
      prompts_nxL,
      pos_nxL,
      kv_cache.init_cache(
          model_cfg, n, p, DTYPES[settings.kv_cache_dtype], layout
      ),
      layout,
  )
  return prompts_nxL, fresh


def _place(
    settings: SamplingSettings,
    state: SlotState,
    fresh: kv_cache.Cache,
    slot_ids_n: jax.Array,
    in_order: bool,
) -> tuple[kv_cache.Cache, Callable[[jax.Array, jax.Array], jax.Array]]:
  """The cache with `fresh` in its slots, and `put(x, rows)` for records."""
  layout = settings.value_layout
  if in_order:
    valid_n = slot_ids_n < state.seq_len.shape[0]

    def put(x, rows):
      keep = valid_n.reshape((-1,) + (1,) * (rows.ndim - 1))
      return jnp.where(keep, rows.astype(x.dtype), x)

    p = kv_cache.cache_length(fresh)
    cache = kv_cache.put_prefix(
        state.cache,
        jax.tree.map(put, kv_cache.cache_prefix(state.cache, p, layout), fresh),
        value_layout=layout,
    )
    return cache, put

  def put(x, rows):
    return x.at[slot_ids_n].set(rows, mode="drop")

  return kv_cache.put_prefix(state.cache, fresh, slot_ids_n, layout), put


def _draw_rows(
    settings: SamplingSettings, rng: jax.Array, n: int
) -> tuple[jax.Array, interruptions.InterruptionState]:
  """Row i's uniform numbers [S] and interruption state from fold_in(rng, i)."""
  # Row i's keys depend only on (rng, i), not on the bucket or the slot.
  row_keys_nx2 = jax.vmap(
      lambda i: jax.random.split(jax.random.fold_in(rng, i))
  )(jnp.arange(n))
  fresh_int = interruptions.draw(settings.interruption, row_keys_nx2[:, 1])
  # Every position's number is drawn here, once, so that a decode step reads
  # one instead of hashing (docs/design/sampling.md).
  uniform_nxS = jax.vmap(
      lambda key: jax.vmap(
          lambda t: jax.random.uniform(jax.random.fold_in(key, t))
      )(jnp.arange(settings.cache_len))
  )(row_keys_nx2[:, 0])
  return uniform_nxS, fresh_int


def _put_records(
    settings: SamplingSettings,
    state: SlotState,
    put: Callable[[jax.Array, jax.Array], jax.Array],
    prompts_nxL: jax.Array,
    prompt_lens_n: jax.Array,
    meta_nxW: jax.Array,
    uniform_nxS: jax.Array,
) -> dict[str, jax.Array]:
  """Each record of `state` but cache and interruption, new rows `put` in."""
  (n, p), s = prompts_nxL.shape, settings.cache_len
  rows_pos = (n, s)
  return dict(
      tokens=put(
          state.tokens,
          jnp.pad(
              prompts_nxL, ((0, 0), (0, s - p)), constant_values=settings.pad_id
          ),
      ),
      gen_logp=put(state.gen_logp, jnp.zeros(rows_pos, jnp.float32)),
      logp_sampling=put(state.logp_sampling, jnp.zeros(rows_pos, jnp.float32)),
      version=put(state.version, jnp.full(rows_pos, NO_VERSION, jnp.int32)),
      mask=put(state.mask, jnp.zeros(rows_pos, bool)),
      prompt_len=put(state.prompt_len, prompt_lens_n.astype(jnp.int32)),
      seq_len=put(state.seq_len, prompt_lens_n.astype(jnp.int32)),
      limit=put(
          state.limit, jnp.full((n,), settings.max_new_tokens, jnp.int32)
      ),
      active=put(state.active, jnp.ones((n,), bool)),
      done=put(state.done, jnp.zeros((n,), bool)),
      truncated=put(state.truncated, jnp.zeros((n,), bool)),
      uniform=put(state.uniform, uniform_nxS),
      meta=put(state.meta, meta_nxW.astype(jnp.int32)),
  )


def longest_running(state: SlotState) -> jax.Array:
  """Length of the longest sequence still decoding (0 if none)."""
  return jnp.max(jnp.where(state.active & ~state.done, state.seq_len, 0))


def take(state: SlotState, rows_F: jax.Array) -> tuple[SlotState, Completions]:
  """Gathers rows (ids >= N: padding, returned as junk); frees their slots."""

  def rows(x):
    return jnp.take(x, rows_F, axis=0, mode="clip")

  out = Completions(
      tokens=rows(state.tokens),
      gen_logp=rows(state.gen_logp),
      logp_sampling=rows(state.logp_sampling),
      version=rows(state.version),
      mask=rows(state.mask),
      prompt_len=rows(state.prompt_len),
      seq_len=rows(state.seq_len),
      truncated=rows(state.truncated),
      interrupted=rows(state.interruption.interrupted),
      thinking_budget=rows(state.interruption.thinking_budget),
      meta=rows(state.meta),
      slot=rows_F.astype(jnp.int32),
  )
  return (
      state.replace(active=state.active.at[rows_F].set(False, mode="drop")),
      out,
  )
