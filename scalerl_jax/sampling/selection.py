"""Next-token selection: greedy, temperature, top-k and top-p sampling.

Each chosen token comes with `logp`, log softmax(logits / temperature)[token]
over the whole vocabulary (what the trainer recomputes: the pi_gen of
pi_train / pi_gen), and `logp_sampling`, its log-probability under the
top-k / top-p truncated distribution it was drawn from (equal to `logp`
without truncation, 0 for greedy). Greedy records `logp` at temperature 1
(`logprob_temperature`). A row's draw is decided by one uniform number.

Design: docs/design/sampling.md.

Shape letters: the package key (scalerl_jax/__init__.py), and X entries
drawn from (V or C), C candidates kept by top-k, J blocks of A = `_BLOCK`
entries.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from scalerl_jax.models.lm_head import token_logprobs

_BLOCK = 128  # A: entries per block of the two-level draw (`_draw`).


def _pick(logits_NxX: jax.Array, token_N: jax.Array) -> jax.Array:
  return token_logprobs(logits_NxX[:, None], token_N[:, None])[:, 0]


def _invert(cdf_NxX: jax.Array, target_N: jax.Array) -> jax.Array:
  """The entry whose interval of the (non-decreasing) cdf holds the target."""
  index_N = jnp.sum(cdf_NxX <= target_N[:, None], axis=-1)
  # Rounding can push the target onto the total; fall back to the last entry
  # with weight, never a zero-weight one. That entry is where the cdf first
  # reaches its total (the cdf rises there, so its weight is > 0); counting it
  # from the cdf makes both counts one pass over [N, X].
  last_N = jnp.sum(cdf_NxX < cdf_NxX[:, -1:], axis=-1)
  return jnp.minimum(index_N, last_N)


def _draw(weights_NxX: jax.Array, uniform_N: jax.Array) -> jax.Array:
  """Index i drawn with probability weights[i] / sum(weights) (never 0).

  Weights >= 0, uniform in [0, 1). Over 2 x _BLOCK entries the cdf is
  inverted in two levels: the block, then the entry.
  """
  n, x = weights_NxX.shape
  if x <= 2 * _BLOCK:
    cdf_NxX = jnp.cumsum(weights_NxX, axis=-1)
    return _invert(cdf_NxX, uniform_N * cdf_NxX[:, -1]).astype(jnp.int32)
  blocks = -(-x // _BLOCK)
  w_NxJxA = jnp.pad(weights_NxX, ((0, 0), (0, blocks * _BLOCK - x))).reshape(
      n, blocks, _BLOCK
  )
  cdf_NxJ = jnp.cumsum(jnp.sum(w_NxJxA, axis=-1), axis=-1)
  target_N = uniform_N * cdf_NxJ[:, -1]
  block_N = _invert(cdf_NxJ, target_N)  # Its weight is > 0, as above.
  # Mass of the blocks before.
  before_NxJ = jnp.pad(cdf_NxJ[:, :-1], ((0, 0), (1, 0)))
  before_N = jnp.take_along_axis(before_NxJ, block_N[:, None], axis=-1)[:, 0]
  inner_NxA = jnp.take_along_axis(w_NxJxA, block_N[:, None, None], axis=1)[:, 0]
  within_N = _invert(jnp.cumsum(inner_NxA, axis=-1), target_N - before_N)
  return (block_N * _BLOCK + within_N).astype(jnp.int32)


def _nucleus_threshold(probs_NxV: jax.Array, top_p: float) -> jax.Array:
  """Largest t with sum(probs[probs >= t]) >= top_p, per row (exact).

  Bisects the int32 bit patterns, which order like non-negative floats.
  """

  def as_float(bits_N):
    return jax.lax.bitcast_convert_type(bits_N, jnp.float32)

  def halve(_, bounds):
    lo_N, hi_N = bounds  # Invariant: lo is a valid threshold, hi is not.
    mid_N = lo_N + (hi_N - lo_N) // 2
    t_N = as_float(mid_N)
    mass_N = jnp.sum(
        jnp.where(probs_NxV >= t_N[:, None], probs_NxV, 0.0), axis=-1
    )
    ok_N = mass_N >= top_p
    return jnp.where(ok_N, mid_N, lo_N), jnp.where(ok_N, hi_N, mid_N)

  top_N = jax.lax.bitcast_convert_type(jnp.max(probs_NxV, axis=-1), jnp.int32)
  lo_N = jnp.zeros_like(top_N)
  lo_N, _ = jax.lax.fori_loop(0, 32, halve, (lo_N, top_N + 1))
  return as_float(lo_N)


def logprob_temperature(temperature: float) -> float:
  """The temperature of `logp` and of the trainer's pi_train: 1 for greedy."""
  return temperature if temperature > 0 else 1.0


def select_tokens(
    logits_NxV: jax.Array,
    uniform_N: jax.Array,
    temperature: float,
    top_k: int,
    top_p: float,
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Chooses one token per row from logits of any float dtype (in float32).

  `uniform_N` in [0, 1) decides each row's draw: the token whose interval of
  the cumulative distribution holds it (unused at temperature 0, greedy).
  `top_k` keeps the k most likely tokens (0: all); `top_p` then the smallest
  set of most likely tokens whose probability reaches it (1.0: all). Returns
  tokens_N (int32), logp_N and logp_sampling_N (float32).
  """
  logits_NxV = logits_NxV.astype(jnp.float32)
  vocab = logits_NxV.shape[-1]
  if temperature == 0:
    tokens_N = jnp.argmax(logits_NxV, axis=-1).astype(jnp.int32)
    logp_N = _pick(logits_NxV, tokens_N)
    return tokens_N, logp_N, jnp.zeros_like(logp_N)

  scaled_NxV = logits_NxV / temperature
  if top_k in (0, vocab):
    max_Nx1 = jnp.max(scaled_NxV, axis=-1, keepdims=True)
    weights_NxV = jnp.exp(scaled_NxV - max_Nx1)
    if top_p >= 1.0:
      tokens_N = _draw(weights_NxV, uniform_N)
      # log softmax at the token from the draw's own max and exponentials: the
      # same operations as `token_logprobs`, without a second pass over V.
      logz_N = jnp.log(jnp.sum(weights_NxV, axis=-1)) + max_Nx1[:, 0]
      logp_N = (
          jnp.take_along_axis(scaled_NxV, tokens_N[:, None], axis=-1)[:, 0]
          - logz_N
      )
      return tokens_N, logp_N, logp_N
    probs_NxV = weights_NxV / jnp.sum(weights_NxV, axis=-1, keepdims=True)
    keep_NxV = probs_NxV >= _nucleus_threshold(probs_NxV, top_p)[:, None]
    tokens_N = _draw(jnp.where(keep_NxV, weights_NxV, 0.0), uniform_N)
    logp_sampling_N = _pick(jnp.where(keep_NxV, scaled_NxV, -jnp.inf), tokens_N)
    return tokens_N, _pick(scaled_NxV, tokens_N), logp_sampling_N

  candidates_NxC, index_NxC = jax.lax.top_k(scaled_NxV, top_k)  # Descending.
  if top_p < 1.0:
    probs_NxC = jax.nn.softmax(candidates_NxC, axis=-1)
    mass_before_NxC = jnp.cumsum(probs_NxC, axis=-1) - probs_NxC
    # The most likely candidate always survives (its mass_before is 0).
    candidates_NxC = jnp.where(
        mass_before_NxC < top_p, candidates_NxC, -jnp.inf
    )
  # (A max, not a slice of the first column: XLA keeps its fast TopK kernel
  # only while every use of the sorted values is the k-slice itself.)
  choice_N = _draw(
      jnp.exp(candidates_NxC - jnp.max(candidates_NxC, axis=-1, keepdims=True)),
      uniform_N,
  )
  tokens_N = jnp.take_along_axis(index_NxC, choice_N[:, None], axis=-1)[
      :, 0
  ].astype(jnp.int32)
  return tokens_N, _pick(scaled_NxV, tokens_N), _pick(candidates_NxC, choice_N)
