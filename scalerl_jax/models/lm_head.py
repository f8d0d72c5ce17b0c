"""The LM head: the final projection to the vocabulary, and log-probs.

With `config.model.fp32_lm_head` (PAPER.md §5: final logits in float32,
moved A 0.52 -> 0.61) the logits are float32, computed as
`config.model.lm_head_algorithm` says: "highest", one float32 matmul at
Precision.HIGHEST, or "bf16_3x", the float32 weights split into a bfloat16
high part and the rounded rest, multiplied on the bfloat16 units with
float32 sums (`bf16_3x_dot`; its accuracy and cost against HIGHEST are
measured in docs/gpu.md). "auto" is bf16_3x when the model
computes in bfloat16 (its hidden states are then exact in one part), else
highest. The trainer and the sampler (decode.prepare splits once) compute the
same function.

`cfg` is a `models/model_config.ModelConfig`. Shape letters: the package key
(scalerl_jax/__init__.py), and N rows of any leading shape.
"""

from __future__ import annotations

from typing import Any, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

# The choices of `config.model.lm_head_algorithm` (module docstring).
ALGORITHMS = ("auto", "highest", "bf16_3x")


def head_algorithm(cfg: Any) -> str:
  """How the FP32 head multiplies: "highest" or "bf16_3x", "auto" resolved
  (ALGORITHMS). Unused without `cfg.fp32_lm_head`."""
  if cfg.lm_head_algorithm not in ALGORITHMS:
    raise ValueError(
        f"model.lm_head_algorithm: {cfg.lm_head_algorithm!r} is not one of "
        f"{ALGORITHMS}"
    )
  if cfg.lm_head_algorithm == "auto":
    return "bf16_3x" if cfg.compute_dtype == "bfloat16" else "highest"
  return cfg.lm_head_algorithm


def split_bf16(x: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(hi, lo) in bfloat16 with hi + lo = x to 16 significant bits.

  hi is x rounded to bfloat16 (to nearest, ties to even) in integer
  arithmetic on its bits, and lo the rest rounded to bfloat16. Not a cast
  through bfloat16 and back: XLA:GPU may fold that round trip away (excess
  precision), leaving lo 0 (docs/gpu.md). Finite x only.
  """
  x32 = x.astype(jnp.float32)
  bits = jax.lax.bitcast_convert_type(x32, jnp.uint32)
  odd = (bits >> 16) & jnp.uint32(1)
  rounded = (bits + jnp.uint32(0x7FFF) + odd) & jnp.uint32(0xFFFF0000)
  hi = jax.lax.bitcast_convert_type(rounded, jnp.float32)
  return hi.astype(jnp.bfloat16), (x32 - hi).astype(jnp.bfloat16)


def _dot_f32(a: jax.Array, b: jax.Array) -> jax.Array:
  return jnp.dot(a, b, preferred_element_type=jnp.float32)


def split_dot(
    x_NxD: jax.Array, w_hi_DxV: jax.Array, w_lo_DxV: jax.Array
) -> jax.Array:
  """x @ (w_hi + w_lo) in float32 from bfloat16 products (no gradient).

  A bfloat16 `x` is exact in one part: two products. A float32 `x` is split
  too, and its low part meets `w_hi` (x_lo @ w_lo, below float32's rounding
  of the sum, is dropped): three. The small products are summed first.
  """
  if x_NxD.dtype == jnp.bfloat16:
    return _dot_f32(x_NxD, w_lo_DxV) + _dot_f32(x_NxD, w_hi_DxV)
  x_hi, x_lo = split_bf16(x_NxD)
  small = _dot_f32(x_hi, w_lo_DxV) + _dot_f32(x_lo, w_hi_DxV)
  return small + _dot_f32(x_hi, w_hi_DxV)


@jax.custom_vjp
def bf16_3x_dot(x_NxD: jax.Array, w_DxV: jax.Array) -> jax.Array:
  """x @ w to float32 accuracy on bfloat16 units (`split_dot` of w's split).

  The gradient is computed as the rest of a bfloat16 network's is: the
  incoming gradient and the operands rounded to bfloat16, float32 sums. The
  FP32 head is there for the forward log-probs (the importance ratio and the
  sampler-trainer mismatch, PAPER.md §5); a HIGHEST-precision backward would
  cost 3x more for a gradient no more accurate than the layers' below it.
  """
  return split_dot(x_NxD, *split_bf16(w_DxV))


def _bf16_3x_fwd(x_NxD, w_DxV):
  w_hi, w_lo = split_bf16(w_DxV)
  return split_dot(x_NxD, w_hi, w_lo), (x_NxD, w_DxV)


def _bf16_3x_bwd(residuals, g_NxV):
  x_NxD, w_DxV = residuals
  g_NxV = g_NxV.astype(jnp.bfloat16)
  dx_NxD = _dot_f32(g_NxV, w_DxV.astype(jnp.bfloat16).T)
  dw_DxV = _dot_f32(x_NxD.astype(jnp.bfloat16).T, g_NxV)
  return dx_NxD.astype(x_NxD.dtype), dw_DxV.astype(w_DxV.dtype)


bf16_3x_dot.defvjp(_bf16_3x_fwd, _bf16_3x_bwd)


def lm_head(
    cfg: Any,
    x_BxTxD: jax.Array,
    head_DxV: jax.Array,
    head_lo_DxV: Optional[jax.Array] = None,
) -> jax.Array:
  """The final projection; float32 logits when `cfg.fp32_lm_head`, computed
  by `head_algorithm(cfg)`.

  `head_lo_DxV`: the low part of a head already split (`split_bf16`), as
  the sampler's prepared weights hold it for bf16_3x; `head_DxV` is then the
  high part.
  """
  lead, d = x_BxTxD.shape[:-1], x_BxTxD.shape[-1]
  if cfg.fp32_lm_head and head_algorithm(cfg) == "bf16_3x":
    x_NxD = x_BxTxD.reshape(-1, d)
    if head_lo_DxV is None:
      logits_NxV = bf16_3x_dot(x_NxD, head_DxV)
    else:
      logits_NxV = split_dot(x_NxD, head_DxV, head_lo_DxV)
    logits_BxTxV = logits_NxV.reshape(lead + (-1,))
  elif cfg.fp32_lm_head:
    logits_BxTxV = jnp.dot(
        x_BxTxD.astype(jnp.float32),
        head_DxV.astype(jnp.float32),
        precision=jax.lax.Precision.HIGHEST,
    )
  else:
    logits_BxTxV = jnp.dot(x_BxTxD, head_DxV.astype(cfg.dtype))
  return nn.with_logical_constraint(
      logits_BxTxV, ("act_batch", "act_len", "act_vocab")
  )


def token_logprobs(
    logits_BxTxV: jax.Array, targets_BxT: jax.Array, temperature: float = 1.0
) -> jax.Array:
  """log softmax(logits / temperature)[target] in float32, per position."""
  logits = logits_BxTxV.astype(jnp.float32)
  if temperature != 1.0:
    logits = logits / temperature
  logz_BxT = jax.nn.logsumexp(logits, axis=-1)
  picked_BxT = jnp.take_along_axis(logits, targets_BxT[..., None], axis=-1)[
      ..., 0
  ]
  return picked_BxT - logz_BxT
