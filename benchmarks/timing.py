"""Timing helpers of the accelerator benchmarks (train_step_gpu, sampler_gpu,
lm_head): best wall time, the chip's own bfloat16 matmul rate, JSON out."""

import json
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp


def best_seconds(
    fn: Callable[[], Any], repeats: int, warm: bool = True
) -> float:
  """Best wall time of `fn()` (blocked until ready) over `repeats` calls,
  after one untimed call when `warm`."""
  if warm:
    jax.block_until_ready(fn())
  best = float("inf")
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn())
    best = min(best, time.perf_counter() - start)
  return best


def matmul_flops_per_s(n: int = 8192) -> float:
  """A bfloat16 n^3 matmul's FLOP/s through JAX on the default device."""
  a = jax.random.normal(jax.random.key(0), (n, n), jnp.bfloat16)
  b = jax.random.normal(jax.random.key(1), (n, n), jnp.bfloat16)
  product = jax.jit(jnp.matmul)
  return 2 * n**3 / best_seconds(lambda: product(a, b), 5)


def write_json(path: str, results: Any) -> None:
  """`results` as indented JSON at `path`; nothing for an empty path."""
  if path:
    with open(path, "w") as f:
      json.dump(results, f, indent=1)
