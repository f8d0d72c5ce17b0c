"""Next-token selection: greedy, temperature, top-k and top-p sampling.

Two log-probabilities are returned for every chosen token:

* `logp`: log softmax(logits / temperature)[token], the model's distribution at
  the sampling temperature over the whole vocabulary. This is exactly what the
  trainer recomputes (`transformer.token_logprobs` with the same temperature),
  so it is the pi_gen of the importance ratio pi_train / pi_gen.
* `logp_sampling`: the log-probability under the distribution the token was
  actually drawn from, i.e. after top-k / top-p truncation and renormalisation.
  It equals `logp` when neither truncation is active, and is 0 for greedy.

Greedy (temperature 0) has no distribution of its own: it records `logp` at
temperature 1, and the trainer takes pi_train there too (`logprob_temperature`).

Sampling inverts the cumulative distribution with one uniform number per row:
Gumbel-max would draw one number per vocabulary entry, which on CPU costs more
than the rest of a small model's decode step. Top-p without top-k finds the
nucleus by bisecting on the probability threshold (32 masked sums over the
vocabulary) instead of sorting it, for the same reason.

Shape letters: the package key (scalerl_jax/__init__.py), and N rows, C candidates
kept by top-k.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from scalerl_jax.models.transformer import token_logprobs

_BLOCK = 128  # Entries per block of the two-level draw (`_draw`).


def _pick(logits_NxX: jax.Array, token_N: jax.Array) -> jax.Array:
  return token_logprobs(logits_NxX[:, None], token_N[:, None])[:, 0]


def _invert(cdf_NxX: jax.Array, target_N: jax.Array) -> jax.Array:
  """The entry whose interval of the (inclusive, non-decreasing) cdf holds the target."""
  index_N = jnp.sum(cdf_NxX <= target_N[:, None], axis=-1)
  # Rounding can push the target onto the total; fall back to the last entry
  # with weight, never a zero-weight one. That entry is where the cdf first
  # reaches its total (the cdf rises there, so its weight is > 0); counting it
  # from the cdf makes both counts one pass over [N, X].
  last_N = jnp.sum(cdf_NxX < cdf_NxX[:, -1:], axis=-1)
  return jnp.minimum(index_N, last_N)


def _draw(weights_NxX: jax.Array, uniform_N: jax.Array) -> jax.Array:
  """Index i drawn with probability weights[i] / sum(weights); weights >= 0, uniform in [0, 1).

  Over more than 2 x _BLOCK entries the cdf is inverted in two levels: first
  the block of _BLOCK entries that holds the target, then the entry within
  it. XLA:CPU's cumulative sum over a whole [N, V] row costs a fiftieth of a
  small_cpu decode step (V = 8,192); the two levels sum only [N, V / _BLOCK]
  and [N, _BLOCK] cumulatively.
  """
  n, x = weights_NxX.shape
  if x <= 2 * _BLOCK:
    cdf_NxX = jnp.cumsum(weights_NxX, axis=-1)
    return _invert(cdf_NxX, uniform_N * cdf_NxX[:, -1]).astype(jnp.int32)
  blocks = -(-x // _BLOCK)
  w_NxCxB = jnp.pad(weights_NxX, ((0, 0), (0, blocks * _BLOCK - x))).reshape(n, blocks, _BLOCK)
  cdf_NxC = jnp.cumsum(jnp.sum(w_NxCxB, axis=-1), axis=-1)
  target_N = uniform_N * cdf_NxC[:, -1]
  block_N = _invert(cdf_NxC, target_N)  # Its weight is > 0, as above.
  before_NxC = jnp.pad(cdf_NxC[:, :-1], ((0, 0), (1, 0)))  # Mass of the blocks before.
  before_N = jnp.take_along_axis(before_NxC, block_N[:, None], axis=-1)[:, 0]
  inner_NxB = jnp.take_along_axis(w_NxCxB, block_N[:, None, None], axis=1)[:, 0]
  within_N = _invert(jnp.cumsum(inner_NxB, axis=-1), target_N - before_N)
  return (block_N * _BLOCK + within_N).astype(jnp.int32)


def _nucleus_threshold(probs_NxV: jax.Array, top_p: float) -> jax.Array:
  """Largest t with sum(probs[probs >= t]) >= top_p, per row.

  Non-negative float32 values order like their bit patterns, so bisecting the
  int32 patterns finds the exact threshold in at most 32 halvings. Keeping
  probs >= t is the smallest set of most likely tokens reaching top_p.
  """
  def as_float(bits_N):
    return jax.lax.bitcast_convert_type(bits_N, jnp.float32)

  def halve(_, bounds):
    lo_N, hi_N = bounds  # Invariant: lo is a valid threshold, hi is not.
    mid_N = lo_N + (hi_N - lo_N) // 2
    t_N = as_float(mid_N)
    mass_N = jnp.sum(jnp.where(probs_NxV >= t_N[:, None], probs_NxV, 0.0), axis=-1)
    ok_N = mass_N >= top_p
    return jnp.where(ok_N, mid_N, lo_N), jnp.where(ok_N, hi_N, mid_N)

  top_N = jax.lax.bitcast_convert_type(jnp.max(probs_NxV, axis=-1), jnp.int32)
  lo_N = jnp.zeros_like(top_N)
  lo_N, _ = jax.lax.fori_loop(0, 32, halve, (lo_N, top_N + 1))
  return as_float(lo_N)


def logprob_temperature(temperature: float) -> float:
  """The temperature of `logp`, and of the trainer's pi_train: the sampling one, 1 for greedy.

  Args:
    temperature: the sampling temperature, 0 for greedy.

  Returns:
    The temperature the generator's and the trainer's log-probs are taken at.
  """
  return temperature if temperature > 0 else 1.0


def select_tokens(logits_NxV: jax.Array, uniform_N: jax.Array, temperature: float,
                  top_k: int, top_p: float) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Chooses one token per row.

  Args:
    logits_NxV: next-token logits (any float dtype; computed in float32).
    uniform_N: one float32 in [0, 1) per row, which decides its draw (unused
      for greedy): the token is the one whose interval of the cumulative
      distribution holds it.
    temperature: 0 for greedy, else the softmax temperature.
    top_k: keep the k most likely tokens; 0 keeps all.
    top_p: keep the smallest set of most likely tokens whose probability
      (after top-k) reaches top_p; 1.0 keeps all.

  Returns:
    tokens_N (int32), logp_N (model distribution at the temperature) and
    logp_sampling_N (truncated sampling distribution), both float32.
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
      logp_N = jnp.take_along_axis(scaled_NxV, tokens_N[:, None], axis=-1)[:, 0] - logz_N
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
    candidates_NxC = jnp.where(mass_before_NxC < top_p, candidates_NxC, -jnp.inf)
  # (A max, not a slice of the first column: XLA keeps its fast TopK kernel
  # only while every use of the sorted values is the k-slice itself.)
  choice_N = _draw(jnp.exp(candidates_NxC - jnp.max(candidates_NxC, axis=-1, keepdims=True)),
                   uniform_N)
  tokens_N = jnp.take_along_axis(index_NxC, choice_N[:, None], axis=-1)[:, 0].astype(jnp.int32)
  return tokens_N, _pick(scaled_NxV, tokens_N), _pick(candidates_NxC, choice_N)
