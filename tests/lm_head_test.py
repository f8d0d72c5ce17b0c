"""The LM head: the FP32 head's accuracy against float64, its gradient, the
algorithm rule, and log-probs."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scalerl_jax.models import lm_head
from scalerl_jax.models import model_config
from tests import helpers


def _head_inputs(x_dtype, seed=0):
  # Unit-scale hidden states and a head whose logits spread over about +-10,
  # as a trained model's do.
  rng = np.random.RandomState(seed)
  x = rng.randn(3, 5, 64).astype(np.float32)
  w = (rng.randn(64, 96) * 0.4).astype(np.float32)
  x = np.asarray(jnp.asarray(x, x_dtype).astype(jnp.float32))
  return x, w, x.astype(np.float64) @ w.astype(np.float64)


def _head_cfg(**overrides):
  return model_config.ModelConfig.from_config(
      helpers.tiny_config(**overrides).model
  )


@pytest.mark.parametrize("x_dtype", [jnp.bfloat16, jnp.float32])
@pytest.mark.parametrize("algorithm", ["highest", "bf16_3x"])
def test_fp32_head_is_float32_accurate(algorithm, x_dtype):
  # The FP32 head's logits against float64 arithmetic on the same inputs,
  # per logit over |x| . |w|: float32's 2^-24 over 64 terms with room, 2e-6.
  # bf16_3x keeps 16 of a float32 operand's 24 significant bits (2^-17), so a
  # float32 x is held to 2e-5; the bfloat16 x of a bfloat16 model is exact in
  # one part and only w's split counts. A head in bfloat16 (the last check) is
  # off by ~1e-3: this test fails when the head quietly loses precision.
  x, w, want = _head_inputs(x_dtype)
  scale = np.abs(x).astype(np.float64) @ np.abs(w).astype(np.float64)
  cfg = _head_cfg(compute_dtype="bfloat16", lm_head_algorithm=algorithm)
  # Jitted: XLA may fold a split it can see whole (lm_head.split_bf16).
  head = jax.jit(lm_head.lm_head, static_argnums=0)
  got = head(cfg, jnp.asarray(x, x_dtype), jnp.asarray(w))
  assert got.dtype == jnp.float32
  bound = 2e-5 if (algorithm, x_dtype) == ("bf16_3x", jnp.float32) else 2e-6
  assert np.max(np.abs(np.asarray(got, np.float64) - want) / scale) < bound
  cfg16 = _head_cfg(compute_dtype="bfloat16", fp32_lm_head=False)
  lossy = head(cfg16, jnp.asarray(x, x_dtype), jnp.asarray(w))
  assert np.max(np.abs(np.asarray(lossy, np.float64) - want) / scale) > 1e-4


# A StableHLO dot_general: its precision config, operand and result types.
_DOT = re.compile(
    r"stablehlo\.dot_general .*?(?:precision = \[(\w+), \w+\].*?)?"
    r" : \(tensor<(\S+)>, tensor<(\S+)>\) -> tensor<(\S+)>"
)
# f32 -> bf16 -> f32 conversions: `%b = convert %a (f32 -> bf16)`, then
# `convert %b (bf16 -> f32)`.
_TO_BF16 = re.compile(
    r"(%\S+) = stablehlo\.convert \S+ : \(tensor<\S+xf32>\) -> "
    r"tensor<\S+xbf16>"
)
_TO_F32 = re.compile(
    r"stablehlo\.convert (%\S+) : \(tensor<\S+xbf16>\) -> tensor<\S+xf32>"
)


def _gpu_head_program(algorithm, x_dtype, grad):
  """The StableHLO text of the FP32 head (its gradient too with `grad`),
  lowered for CUDA; no GPU is needed to lower."""
  cfg = _head_cfg(compute_dtype="bfloat16", lm_head_algorithm=algorithm)
  head = lambda x, w: lm_head.lm_head(cfg, x, w)
  if grad:
    head = jax.grad(lambda x, w: jnp.sum(lm_head.lm_head(cfg, x, w) ** 2), 1)
  x = jax.ShapeDtypeStruct((3, 5, 64), x_dtype)
  w = jax.ShapeDtypeStruct((64, 96), jnp.float32)
  traced = jax.jit(head).trace(x, w)
  return traced.lower(lowering_platforms=("cuda",)).as_text()


@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize(
    "algorithm,x_dtype,products",
    [
        # (precision, operand element types) of each product that writes the
        # float32 logits, [15, 96] or [3, 5, 96].
        ("bf16_3x", jnp.bfloat16, [("DEFAULT", "bf16", "bf16")] * 2),
        ("bf16_3x", jnp.float32, [("DEFAULT", "bf16", "bf16")] * 3),
        ("highest", jnp.bfloat16, [("HIGHEST", "f32", "f32")]),
    ],
)
def test_gpu_program_of_the_fp32_head_keeps_its_products(
    algorithm, x_dtype, products, grad
):
  """The head's program as JAX hands it to XLA:GPU: bf16_3x as two bfloat16
  products (three for a float32 x) with float32 results, and no float32 ->
  bfloat16 -> float32 round trip that the compiler could fold; HIGHEST as one
  float32 product at HIGHEST.

  This guards our side only. XLA:GPU may still fold at compile time what this
  program spells out (it did fold a cast round trip, docs/gpu.md); the
  accuracy test above, run on a GPU (gpu_speed.sh's `tests` stage), and
  benchmarks/lm_head.py's error bound are what see the compiled head. On CPU,
  where XLA keeps the split, the accuracy test alone cannot tell.
  """
  text = _gpu_head_program(algorithm, x_dtype, grad)
  got = [
      (precision or "DEFAULT", lhs.split("x")[-1], rhs.split("x")[-1])
      for precision, lhs, rhs, out in _DOT.findall(text)
      if out in ("15x96xf32", "3x5x96xf32")
  ]
  assert got == products, text
  for function in text.split("func.func")[1:]:
    to_bf16 = set(_TO_BF16.findall(function))
    assert not to_bf16 & set(_TO_F32.findall(function)), function


def test_auto_head_algorithm_follows_the_compute_dtype():
  auto = lambda dtype: lm_head.head_algorithm(_head_cfg(compute_dtype=dtype))
  assert (auto("bfloat16"), auto("float32")) == ("bf16_3x", "highest")
  with pytest.raises(ValueError, match="lm_head_algorithm"):
    lm_head.head_algorithm(_head_cfg(lm_head_algorithm="tf32"))


def test_bf16_3x_head_gradient_is_the_bfloat16_product_of_the_exact_one():
  # d/dx and d/dw of sum(g * x @ w) are g @ w.T and x.T @ g; bf16_3x computes
  # them from bfloat16-rounded g and w (x is bfloat16 already), float32 sums:
  # within bfloat16's rounding of the exact values.
  x, w, _ = _head_inputs(jnp.bfloat16, seed=1)
  g = np.random.RandomState(2).randn(3, 5, 96).astype(np.float32)
  cfg = _head_cfg(compute_dtype="bfloat16", lm_head_algorithm="bf16_3x")
  f = lambda x, w: jnp.sum(jnp.asarray(g) * lm_head.lm_head(cfg, x, w))
  dx, dw = jax.grad(f, argnums=(0, 1))(jnp.asarray(x, jnp.bfloat16), w)
  assert (dx.dtype, dw.dtype) == (jnp.bfloat16, jnp.float32)
  g64, x64 = g.reshape(15, 96).astype(np.float64), x.reshape(15, 64)
  want_dx = (g64 @ w.astype(np.float64).T).reshape(3, 5, 64)
  want_dw = x64.astype(np.float64).T @ g64
  rel = lambda a, b: np.max(np.abs(np.asarray(a, np.float64) - b)) / np.max(
      np.abs(b)
  )
  assert rel(dx, want_dx) < 2e-2 and rel(dw, want_dw) < 2e-2


def test_token_logprobs_matches_log_softmax():
  logits = jnp.asarray(np.random.RandomState(0).randn(2, 3, 5), jnp.float32)
  targets = jnp.array([[0, 4, 2], [1, 1, 3]])
  got = lm_head.token_logprobs(logits, targets, temperature=0.5)
  ref = jax.nn.log_softmax(logits / 0.5, axis=-1)
  want = np.take_along_axis(
      np.asarray(ref), np.asarray(targets)[..., None], -1
  )[..., 0]
  np.testing.assert_allclose(got, want, atol=1e-6)
