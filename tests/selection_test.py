"""Token selection: draw frequencies and log-probs of the
(truncated) distribution."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scalerl_jax.sampling import selection

PROBS = np.array([0.05, 0.3, 0.02, 0.25, 0.15, 0.1, 0.08, 0.05])


def _renormalised(keep):
  p = np.where(np.isin(np.arange(len(PROBS)), keep), PROBS, 0.0)
  return p / p.sum()


# Sorted: token 1 (0.3), 3 (0.25), 4 (0.15), 5 (0.1),
# 6 (0.08), 0 and 7 (0.05), 2.
CASES = {
    (0, 1.0): PROBS,
    # Top 3 of 8.
    (3, 1.0): _renormalised([1, 3, 4]),
    # Cumulative 0.3, 0.55, 0.7, 0.8: the first prefix
    # reaching 0.75 has 4 tokens.
    (0, 0.75): _renormalised([1, 3, 4, 5]),
    # Top 4 renormalised: 0.375, 0.3125, 0.1875, 0.125 -> cumulative reaches
    # 0.8 at the third.
    (4, 0.8): _renormalised([1, 3, 4]),
}


@pytest.mark.parametrize("top_k,top_p", list(CASES))
def test_draw_frequencies_and_logprobs(top_k, top_p):
  n = 20_000
  logits = jnp.broadcast_to(
      jnp.log(jnp.asarray(PROBS, jnp.float32)), (n, len(PROBS))
  )
  uniform = jax.random.uniform(jax.random.key(0), (n,))
  tokens, logp, logp_sampling = jax.jit(
      selection.select_tokens, static_argnums=(2, 3, 4)
  )(logits, uniform, 1.0, top_k, top_p)
  expected = CASES[(top_k, top_p)]
  freq = np.bincount(np.asarray(tokens), minlength=len(PROBS)) / n
  # 4.5 standard deviations of a frequency estimated from 20k draws.
  np.testing.assert_allclose(freq, expected, atol=4.5 * np.sqrt(0.25 / n))
  assert (expected[np.asarray(tokens)] > 0).all()
  np.testing.assert_allclose(logp, np.log(PROBS[np.asarray(tokens)]), atol=1e-5)
  np.testing.assert_allclose(
      logp_sampling, np.log(expected[np.asarray(tokens)]), atol=1e-5
  )


def test_temperature_scales_the_distribution():
  n = 20_000
  logits = jnp.broadcast_to(
      jnp.log(jnp.asarray(PROBS, jnp.float32)), (n, len(PROBS))
  )
  tokens, logp, _ = selection.select_tokens(
      logits, jax.random.uniform(jax.random.key(1), (n,)), 0.5, 0, 1.0
  )
  sharpened = PROBS**2 / (PROBS**2).sum()
  freq = np.bincount(np.asarray(tokens), minlength=len(PROBS)) / n
  np.testing.assert_allclose(freq, sharpened, atol=4.5 * np.sqrt(0.25 / n))
  np.testing.assert_allclose(
      logp, np.log(sharpened[np.asarray(tokens)]), atol=1e-5
  )


@pytest.mark.parametrize("top_p", [0.1, 0.5, 0.9, 0.99])
def test_nucleus_threshold_equals_sorted_prefix(top_p):
  logits = jax.random.normal(jax.random.key(2), (64, 1000)) * 3
  probs = jax.nn.softmax(logits, axis=-1)
  keep = np.asarray(
      probs >= selection._nucleus_threshold(probs, top_p)[:, None]
  )
  p = np.asarray(probs, np.float64)
  order = np.argsort(-p, axis=-1, kind="stable")
  sorted_p = np.take_along_axis(p, order, axis=-1)
  mass_before = np.zeros_like(p)
  np.put_along_axis(
      mass_before, order, np.cumsum(sorted_p, -1) - sorted_p, axis=-1
  )
  # Float32 sums may decide differently only where the mass sits on top_p.
  differ = keep != (mass_before < top_p)
  assert (np.abs(mass_before[differ] - top_p) < 1e-5).all()
  assert keep.sum(-1).min() >= 1 and differ.sum() <= 2


@pytest.mark.parametrize("temperature", [0.0, 0.7, 1.0])
def test_logp_is_taken_at_the_logprob_temperature(temperature):
  # The trainer recomputes pi_train at logprob_temperature: the sampling
  # temperature, or 1 for greedy, whose recorded logp is the plain softmax.
  assert selection.logprob_temperature(temperature) == (temperature or 1.0)
  logits = jax.random.normal(jax.random.key(0), (4, 11))
  uniform = jax.random.uniform(jax.random.key(1), (4,))
  tokens, logp, _ = selection.select_tokens(
      logits, uniform, temperature, 0, 1.0
  )
  want = jax.nn.log_softmax(
      logits / selection.logprob_temperature(temperature), axis=-1
  )
  np.testing.assert_allclose(
      logp, want[jnp.arange(4), tokens], rtol=1e-6, atol=1e-6
  )


def test_draw_falls_back_to_the_last_entry_with_weight():
  # A target on the total (uniform 1.0, which rounding can reach) counts every
  # entry; the draw then takes the last one with weight,
  # never a zero-weight one.
  weights = jnp.array(
      [
          [0.25, 0.75, 0.0, 0.0, 0.0],
          [0.0, 0.5, 0.0, 0.5, 0.0],
          [0.0, 0.0, 0.0, 0.0, 1.0],
          [1.0, 2.0, 3.0, 4.0, 0.0],
      ]
  )
  np.testing.assert_array_equal(
      selection._draw(weights, jnp.ones(4)), [1, 3, 4, 3]
  )
  # Otherwise it inverts the cdf: [0.1, 0.3, 0.6, 1.0] of row 3 at
  # 0.0, 0.15, 0.45, 0.95.
  np.testing.assert_array_equal(
      selection._draw(
          jnp.broadcast_to(weights[3], (4, 5)),
          jnp.array([0.0, 0.15, 0.45, 0.95]),
      ),
      [0, 1, 2, 3],
  )


@pytest.mark.parametrize("vocab", [200, 1000, 8192])
def test_draw_inverts_the_cdf_in_one_or_two_levels(vocab):
  # Up to 2 x 128 entries one cumulative sum, beyond it blocks of 128 and then
  # the entry within the block (a last, partial block at 1000): either way the
  # entry whose cdf interval holds u x total, as float64 numpy finds it, and
  # never one without weight (70% of the weights are zero).
  rng = np.random.RandomState(vocab)
  weights = (
      rng.exponential(size=(500, vocab)) * (rng.rand(500, vocab) < 0.3)
  ).astype(np.float32)
  uniform = rng.rand(500).astype(np.float32)
  got = np.asarray(selection._draw(jnp.asarray(weights), jnp.asarray(uniform)))
  cdf = np.cumsum(weights.astype(np.float64), axis=-1)
  target = uniform * cdf[:, -1]
  want = np.array(
      [np.searchsorted(c, t, side="right") for c, t in zip(cdf, target)]
  )
  differ = got != want
  # Float32 sums may decide differently only where the
  # target sits on a boundary.
  assert differ.sum() <= 2
  assert (
      np.abs(cdf[differ, want[differ]] - target[differ])
      < 1e-4 * cdf[differ, -1]
  ).all()
  assert (weights[np.arange(500), got] > 0).all()
