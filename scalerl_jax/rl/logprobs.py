"""pi_train's log-probs and entropy over sampled tokens (pure, jitted by
the train step): the layers, then the LM head `chunk` positions at a time.

Shape letters: the package key (scalerl_jax/__init__.py), and C positions
per log-prob chunk, J chunks.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from scalerl_jax.models import lm_head
from scalerl_jax.models import model_config
from scalerl_jax.models import transformer


def evened_chunks(t: int, chunk: int) -> tuple[int, int]:
  """(n, c): the head's `t` positions as n chunks of c, c <= `chunk`.

  As many chunks as `chunk` positions need, evened out: at most n - 1 padded
  positions, where `chunk` itself could pad nearly one chunk (T = 1,279 at
  1,024: 769 positions of logits computed for nothing). `chunk` 0: one.
  """
  n = -(-t // min(chunk, t)) if chunk else 1
  return n, -(-t // n)


def _logprobs_and_entropy(logits_BxTxV, targets_BxT, temperature):
  logits_BxTxV = logits_BxTxV.astype(jnp.float32) / temperature
  logp_BxT = lm_head.token_logprobs(logits_BxTxV, targets_BxT)
  logp_all = jax.nn.log_softmax(logits_BxTxV, axis=-1)
  return logp_BxT, -jnp.sum(jnp.exp(logp_all) * logp_all, axis=-1)


def head_logprobs(
    cfg: model_config.ModelConfig,
    params: Any,
    x_BxTxD: jax.Array,
    targets_BxT: jax.Array,
    temperature: float,
    chunk: int,
) -> tuple[jax.Array, jax.Array]:
  """(logp_BxT, entropy_BxT) from the last block's output: final norm, LM
  head and log-softmax, `chunk` positions at a time."""
  b, t, d = x_BxTxD.shape
  n, c = evened_chunks(t, chunk)
  pad = ((0, 0), (0, n * c - t))
  x_JxBxCxD = (
      jnp.pad(x_BxTxD, pad + ((0, 0),)).reshape(b, n, c, d).swapaxes(0, 1)
  )
  targets_JxBxC = jnp.pad(targets_BxT, pad).reshape(b, n, c).swapaxes(0, 1)

  # Rematerialised: the backward pass recomputes one chunk's logits at a time
  # instead of keeping every chunk's.
  @jax.checkpoint
  def one_chunk(params, x_BxCxD, targets_BxC):
    logits_BxCxV = transformer.output_logits(cfg, params, x_BxCxD)
    return _logprobs_and_entropy(logits_BxCxV, targets_BxC, temperature)

  _, (logp_JxBxC, entropy_JxBxC) = jax.lax.scan(
      lambda carry, xs: (carry, one_chunk(params, *xs)),
      None,
      (x_JxBxCxD, targets_JxBxC),
  )
  unchunk = lambda y_JxBxC: y_JxBxC.swapaxes(0, 1).reshape(b, n * c)[:, :t]
  return unchunk(logp_JxBxC), unchunk(entropy_JxBxC)


def policy_logprobs(
    model: transformer.Transformer,
    params: Any,
    tokens_BxS: jax.Array,
    temperature: float,
    chunk: int = 0,
) -> tuple[jax.Array, jax.Array]:
  """float32 (logp_BxS, entropy_BxS) of pi_train = softmax(logits / temp).

  Position 0 (no prefix) holds 0. `chunk` > 0 computes the logits that many
  positions at a time, with the same results.
  """
  if chunk:
    x_BxTxD = model.apply(
        {"params": params}, tokens_BxS[:, :-1], return_hidden=True
    )
    logp_BxT, entropy_BxT = head_logprobs(
        model.cfg, params, x_BxTxD, tokens_BxS[:, 1:], temperature, chunk
    )
  else:
    logits_BxTxV = model.apply({"params": params}, tokens_BxS[:, :-1])
    logp_BxT, entropy_BxT = _logprobs_and_entropy(
        logits_BxTxV, tokens_BxS[:, 1:], temperature
    )
  pad = jnp.zeros((tokens_BxS.shape[0], 1), jnp.float32)
  return (
      jnp.concatenate([pad, logp_BxT], axis=1),
      jnp.concatenate([pad, entropy_BxT], axis=1),
  )
