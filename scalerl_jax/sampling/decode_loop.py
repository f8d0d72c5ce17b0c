"""The decode loop: decode steps over a `SlotState` until none runs.

A decode step runs the model on every slot's last token (so the first step
re-reads the prompt's last token), chooses the next one and appends it with
its records, so every chosen token depends only on the parameters of the call
that chose it. `advance` loops the steps on the device (`jax.lax.while_loop`,
checked every `decode_steps_per_check` steps) and stops when no slot runs;
`sampler.Sampler` binds the static arguments and shardings. Pure and
jit-able, like slots.py.

Design: docs/design/sampling.md.

Shape letters: the package key (scalerl_jax/__init__.py); S = prompt +
completion budget.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp

from scalerl_jax.models import decode
from scalerl_jax.models import kv_cache
from scalerl_jax.models.model_config import ModelConfig
from scalerl_jax.sampling import interruptions
from scalerl_jax.sampling.completions import completion_lengths
from scalerl_jax.sampling.selection import select_tokens
from scalerl_jax.sampling.settings import SamplingSettings
from scalerl_jax.sampling.slots import NO_VERSION
from scalerl_jax.sampling.slots import SlotState
from scalerl_jax.sampling.slots import longest_running


def _decode_step(
    model_cfg: ModelConfig,
    settings: SamplingSettings,
    weights: Any,
    version: jax.Array,
    state: SlotState,
    go: Optional[jax.Array] = None,
) -> SlotState:
  """One decode step; with `go` (traced) False, a step that changes nothing,
  the cache included (None: a step that runs)."""
  live_N, keep_N = _live_slots(state, go)
  logits_Nx1xV, cache = _last_token_logits(
      model_cfg, settings, weights, state, keep_N
  )
  sampled_N, logp_N, logp_sampling_N = _sample(settings, state, logits_Nx1xV)
  tokens_N, forced_N, int_state, limit_N = _apply_interruptions(
      settings, state, sampled_N, live_N
  )
  generated_N = live_N & ~forced_N
  record = _recorder(state, live_N)
  eos_N, seq_len_N, at_limit_N = _endings(
      settings, state, live_N, generated_N, sampled_N, limit_N
  )
  return state.replace(
      cache=cache,
      tokens=record(state.tokens, tokens_N),
      gen_logp=record(state.gen_logp, jnp.where(generated_N, logp_N, 0.0)),
      logp_sampling=record(
          state.logp_sampling, jnp.where(generated_N, logp_sampling_N, 0.0)
      ),
      version=record(
          state.version, jnp.where(generated_N, version, NO_VERSION)
      ),
      mask=record(state.mask, generated_N),
      seq_len=seq_len_N,
      limit=limit_N,
      done=state.done | eos_N | at_limit_N,
      truncated=state.truncated | (at_limit_N & ~eos_N),
      interruption=int_state,
  )


def _live_slots(
    state: SlotState, go: Optional[jax.Array]
) -> tuple[jax.Array, Optional[jax.Array]]:
  """The slots this step decodes, and the rows whose cache it keeps or None."""
  live_N = state.active & ~state.done
  keep_N = None
  if go is not None:
    live_N &= go
    keep_N = jnp.broadcast_to(~go, live_N.shape)
  return live_N, keep_N


def _last_token_logits(
    model_cfg: ModelConfig,
    settings: SamplingSettings,
    weights: Any,
    state: SlotState,
    keep_N: Optional[jax.Array],
) -> tuple[jax.Array, kv_cache.Cache]:
  """Logits [N, 1, V] after every slot's last token, and the cache it wrote."""
  last_N = jnp.maximum(state.seq_len - 1, 0)
  last_tok_N = jnp.take_along_axis(state.tokens, last_N[:, None], axis=1)[:, 0]
  return decode.forward(
      model_cfg,
      weights,
      last_tok_N[:, None],
      last_N[:, None],
      state.cache,
      settings.value_layout,
      settings.decode_attention,
      keep_N,
  )


def _sample(
    settings: SamplingSettings, state: SlotState, logits_Nx1xV: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """`select_tokens` of every slot with its next position's uniform number."""
  uniform_N = jnp.take_along_axis(
      state.uniform, state.seq_len[:, None], axis=1, mode="clip"
  )[:, 0]
  return select_tokens(
      logits_Nx1xV[:, 0],
      uniform_N,
      settings.temperature,
      settings.top_k,
      settings.top_p,
  )


def _apply_interruptions(
    settings: SamplingSettings,
    state: SlotState,
    sampled_N: jax.Array,
    live_N: jax.Array,
) -> tuple[jax.Array, jax.Array, interruptions.InterruptionState, jax.Array]:
  """`interruptions.apply` to sampled_N: tokens, forced, state, limits."""
  completion_N = completion_lengths(state.prompt_len, state.seq_len)
  return interruptions.apply(
      settings.interruption,
      state.interruption,
      sampled_N,
      completion_N,
      state.limit,
      live_N,
      settings.max_new_tokens,
  )


def _recorder(
    state: SlotState, live_N: jax.Array
) -> Callable[[jax.Array, jax.Array], jax.Array]:
  """`record(x, value_N)`: `x` [N, S], value_N at live slots' next position."""
  s = state.tokens.shape[1]
  write_N = jnp.where(
      live_N, state.seq_len, s
  )  # Out of range: written nowhere.
  at_NxS = jnp.arange(s)[None, :] == write_N[:, None]

  def record(x, value_N):
    # A select over the row, not a scatter: XLA:CPU runs the five records as
    # one elementwise loop, where five scatters cost a kernel launch each.
    return jnp.where(at_NxS, value_N[:, None], x)

  return record


def _endings(
    settings: SamplingSettings,
    state: SlotState,
    live_N: jax.Array,
    generated_N: jax.Array,
    sampled_N: jax.Array,
    limit_N: jax.Array,
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Per slot: EOS generated, length after the step, completion limit hit."""
  eos_N = generated_N & jnp.isin(
      sampled_N, jnp.asarray(settings.eos_ids, jnp.int32)
  )
  seq_len_N = state.seq_len + live_N
  at_limit_N = live_N & (
      completion_lengths(state.prompt_len, seq_len_N) >= limit_N
  )
  return eos_N, seq_len_N, at_limit_N


def advance(
    model_cfg: ModelConfig,
    settings: SamplingSettings,
    state: SlotState,
    weights: Any,
    version: jax.Array,
    num_steps: jax.Array,
    window: int = 0,
) -> SlotState:
  """Runs up to `num_steps` (traced) decode steps; stops when no slot runs.

  Every token is chosen with `weights` and recorded with `version`. A static
  `window` with 0 < window < S makes attention read only the first `window`
  cache positions, and stops the loop before a running slot's next token
  would sit past them. The loop checks whether to go on every
  `settings.decode_steps_per_check` steps (on a GPU each check waits for the
  device); the steps it runs past its end change nothing.
  """
  s = settings.cache_len
  windowed = 0 < window < s

  def running(carry):
    step, st = carry
    # One reduction over the slots (a running slot holds at least one token),
    # so a slot-sharded loop synchronises its devices once per step.
    longest = longest_running(st)
    ok = (step < num_steps) & (longest > 0)
    if windowed:
      # A step processes the token at position seq_len - 1.
      ok &= longest <= window
    return ok

  def body(carry):
    step, st = carry
    every = settings.decode_steps_per_check
    if every == 1:
      return step + 1, _decode_step(model_cfg, settings, weights, version, st)

    # `every` steps between checks: a fixed-trip inner loop, whose steps
    # past the loop's end (num_steps reached, the window full, or no slot
    # running) change nothing (`_decode_step`'s go), so the tokens and
    # records are those of a check every step.
    def inner(_, carry):
      step, st = carry
      go = running(carry)
      return step + go.astype(step.dtype), _decode_step(
          model_cfg, settings, weights, version, st, go
      )

    return jax.lax.fori_loop(0, every, inner, (step, st))

  if not windowed:
    _, state = jax.lax.while_loop(running, body, (jnp.int32(0), state))
    return state
  full, layout = state.cache, settings.value_layout
  state = state.replace(cache=kv_cache.cache_prefix(full, window, layout))
  _, state = jax.lax.while_loop(running, body, (jnp.int32(0), state))
  return state.replace(
      cache=kv_cache.put_prefix(full, state.cache, value_layout=layout)
  )
