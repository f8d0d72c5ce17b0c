"""Thinking-budget interruptions (ScaleRL paper, §5).

Each sequence draws a thinking budget b uniformly from
[thinking_budget_min, thinking_budget_max] when it starts. If it has produced
b completion tokens without emitting the think-close marker itself, the
configured phrase is injected as its next tokens, one forced token per decode
step, and it may then generate at most `answer_budget` further tokens (never
more than `max_new_tokens` in total). Forced tokens get loss mask 0,
log-probs 0 and policy version -1.

Design: docs/design/sampling.md.

Shape letters: the package key (scalerl_jax/__init__.py), and R phrase tokens.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import flax.struct
import jax
import jax.numpy as jnp

NOT_INJECTING = -1


@dataclasses.dataclass(frozen=True)
class InterruptionSettings:
  """What triggers an interruption and what is injected (hashable)."""

  enabled: bool = False
  # Completion tokens of thinking before the phrase, drawn per sequence
  # uniformly in [min, max].
  thinking_budget_min: int = 1
  thinking_budget_max: int = 1
  answer_budget: int = 1  # Tokens the sequence may generate after the phrase.
  phrase_ids: tuple[int, ...] = ()  # The injected phrase, as token ids.
  think_close_id: Optional[int] = None  # Ends thinking ("</think>").

  @classmethod
  def from_config(
      cls,
      it: Any,
      phrase_ids: tuple[int, ...] = (),
      think_close_id: Optional[int] = None,
  ) -> "InterruptionSettings":
    """From `config.sampling.interruption`, the phrase as token ids."""
    return cls(
        enabled=bool(it.enabled),
        thinking_budget_min=int(it.thinking_budget_min),
        thinking_budget_max=int(it.thinking_budget_max),
        answer_budget=int(it.answer_budget),
        phrase_ids=tuple(int(t) for t in phrase_ids),
        think_close_id=None if think_close_id is None else int(think_close_id),
    )

  def validate(self, max_new_tokens: int, vocab_size: int) -> None:
    """Raises ValueError naming the offending field."""
    if not self.enabled:
      return
    prefix = "sampling.interruption"
    if not self.phrase_ids:
      raise ValueError(
          f"{prefix}.phrase: enabled, but no phrase token ids were given"
      )
    if self.think_close_id is None:
      raise ValueError(
          f"{prefix}: enabled, but no think-close marker token id was given"
      )
    bad = [
        t
        for t in self.phrase_ids + (self.think_close_id,)
        if not 0 <= t < vocab_size
    ]
    if bad:
      raise ValueError(
          f"{prefix}: token ids {bad} are outside the vocabulary [0, {vocab_size})"
      )
    if not 0 < self.thinking_budget_min <= self.thinking_budget_max:
      raise ValueError(
          f"{prefix}.thinking_budget_min: need 0 < min <= max, got "
          f"[{self.thinking_budget_min}, {self.thinking_budget_max}]"
      )
    if self.answer_budget <= 0:
      raise ValueError(
          f"{prefix}.answer_budget: {self.answer_budget} must be > 0"
      )
    if self.thinking_budget_max + len(self.phrase_ids) > max_new_tokens:
      raise ValueError(
          f"{prefix}.thinking_budget_max: {self.thinking_budget_max} plus the "
          f"{len(self.phrase_ids)}-token phrase exceeds sampling.max_new_tokens {max_new_tokens}"
      )


@flax.struct.dataclass
class InterruptionState:
  # [N] int32 thinking tokens allowed before the phrase.
  thinking_budget: jax.Array
  # [N] int32 next phrase token to inject; -1 when not injecting.
  phrase_pos: jax.Array
  think_closed: jax.Array  # [N] bool the sequence emitted the marker itself.
  interrupted: jax.Array  # [N] bool the phrase was injected.


def empty(num_slots: int) -> InterruptionState:
  return InterruptionState(
      thinking_budget=jnp.zeros((num_slots,), jnp.int32),
      phrase_pos=jnp.full((num_slots,), NOT_INJECTING, jnp.int32),
      think_closed=jnp.zeros((num_slots,), bool),
      interrupted=jnp.zeros((num_slots,), bool),
  )


def draw(
    settings: InterruptionSettings, keys_N: jax.Array
) -> InterruptionState:
  """Bookkeeping for new sequences, budgets drawn uniformly (one key each)."""
  state = empty(keys_N.shape[0])
  if not settings.enabled:
    return state
  budget_N = jax.vmap(
      lambda key: jax.random.randint(
          key,
          (),
          settings.thinking_budget_min,
          settings.thinking_budget_max + 1,
          dtype=jnp.int32,
      )
  )(keys_N)
  return state.replace(thinking_budget=budget_N)


def apply(
    settings: InterruptionSettings,
    state: InterruptionState,
    sampled_N: jax.Array,
    completion_len_N: jax.Array,
    limit_N: jax.Array,
    live_N: jax.Array,
    max_new_tokens: int,
) -> tuple[jax.Array, jax.Array, InterruptionState, jax.Array]:
  """Replaces sampled tokens by phrase tokens where an interruption is due.

  `completion_len_N` counts generated and injected tokens so far (the index
  of the token chosen now); `limit_N` is where each sequence stops; `live_N`
  marks rows producing a token this step. Returns (tokens_N to append,
  forced_N marking injected ones, new state, new limit_N).
  """
  if not settings.enabled:
    return sampled_N, jnp.zeros_like(live_N), state, limit_N
  phrase_R = jnp.asarray(settings.phrase_ids, jnp.int32)
  num_phrase = len(settings.phrase_ids)
  begin_N = (
      live_N
      & ~state.interrupted
      & ~state.think_closed
      & (completion_len_N == state.thinking_budget)
  )
  phrase_pos_N = jnp.where(begin_N, 0, state.phrase_pos)
  forced_N = live_N & (phrase_pos_N != NOT_INJECTING)
  tokens_N = jnp.where(
      forced_N, phrase_R[jnp.maximum(phrase_pos_N, 0)], sampled_N
  )
  next_pos_N = jnp.where(forced_N, phrase_pos_N + 1, phrase_pos_N)
  next_pos_N = jnp.where(next_pos_N >= num_phrase, NOT_INJECTING, next_pos_N)
  answer_end_N = jnp.minimum(
      completion_len_N + num_phrase + settings.answer_budget, max_new_tokens
  )
  state = state.replace(
      phrase_pos=next_pos_N,
      think_closed=state.think_closed
      | (live_N & ~forced_N & (sampled_N == settings.think_close_id)),
      interrupted=state.interrupted | begin_N,
  )
  return tokens_N, forced_N, state, jnp.where(begin_N, answer_end_N, limit_N)
