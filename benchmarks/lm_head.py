"""The FP32 LM head's algorithms: time and accuracy against float64.

  python -m benchmarks.lm_head --tokens=10240 --vocab=151936 --embed=1024

One microbatch's head at the recipe's qwen3_0.6b shape, on this run's
device: bfloat16 hidden states x [N, D] (unit RMS, as the final norm leaves
them) and float32 weights w [D, V] scaled so the logits spread over about
+-10, as a trained model's do. For each algorithm, measured in this one run:

* fwd ms: logits, log-softmax and the target's log-prob;
* fwd+bwd ms: the same with the gradient of sum(g * logp) to x and w;
* TFLOP/s of the forward (2 N D V FLOPs);
* logit and log-prob error against float64 arithmetic on the same inputs
  (max and mean absolute over the first 256 positions).

Algorithms: `highest` (float32 at Precision.HIGHEST), `bf16_3x`
(lm_head.bf16_3x_dot: the weights split in two bfloat16 parts), `tf32`
(float32 at Precision.HIGH, TF32 on NVIDIA GPUs; not offered by the
config), and `bf16` (no FP32 head: bfloat16 weights, bfloat16 logits).

Exits non-zero, after the table, when an algorithm of the FP32 head
(`highest`, `bf16_3x`) is off by more than its bound: a logit by more than
2^-16 of the largest sum |x| . |w| over the reference rows, a log-prob by
twice that (its logit and the log-sum-exp). Either algorithm keeps at least
16 significant bits of every weight, 2^-17 of each product, so the bound has
twice that room. A head that rounds its weights to bfloat16 (2^-9 of each
product) may err by up to 2^7 times the bound; a split that XLA folded away
is such a head.
"""

import sys

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import timing
from scalerl_jax.models import lm_head

_TOKENS = flags.DEFINE_integer("tokens", 10240, "N: positions in the chunk.")
_VOCAB = flags.DEFINE_integer("vocab", 151936, "V.")
_EMBED = flags.DEFINE_integer("embed", 1024, "D.")
_JSON = flags.DEFINE_string("json", "", "Write the rows as JSON here.")

# The algorithms held to the error bound (module docstring).
FP32_HEAD = ("highest", "bf16_3x")


def _dot(algorithm):
  if algorithm == "bf16_3x":
    return lm_head.bf16_3x_dot
  if algorithm == "bf16":
    return lambda x, w: jnp.dot(x, w.astype(jnp.bfloat16))
  precision = {
      "highest": jax.lax.Precision.HIGHEST,
      "tf32": jax.lax.Precision.HIGH,
  }[algorithm]
  return lambda x, w: jnp.dot(
      x.astype(jnp.float32), w.astype(jnp.float32), precision=precision
  )


def _logp(dot, x, w, targets):
  logits = dot(x, w).astype(jnp.float32)
  return lm_head.token_logprobs(logits[None], targets[None])[0]


def main(argv):
  del argv
  n, d, v = _TOKENS.value, _EMBED.value, _VOCAB.value
  rng = np.random.RandomState(0)
  x = jnp.asarray(rng.randn(n, d), jnp.bfloat16)
  w = jnp.asarray(rng.randn(d, v) * (3.0 / np.sqrt(d)), jnp.float32)
  targets = jnp.asarray(rng.randint(0, v, n), jnp.int32)
  g = jnp.asarray(rng.randn(n), jnp.float32)
  # float64 reference on the host for the first rows (no x64 mode needed).
  rows_ref = min(n, 256)
  ref_logits = np.asarray(x[:rows_ref], np.float64) @ np.asarray(w, np.float64)
  top = ref_logits.max(axis=1, keepdims=True)
  logz = top[:, 0] + np.log(np.exp(ref_logits - top).sum(axis=1))
  idx = np.asarray(targets[:rows_ref])
  want_logp = ref_logits[np.arange(rows_ref), idx] - logz
  scale = np.abs(np.asarray(x[:rows_ref], np.float64)) @ np.abs(
      np.asarray(w, np.float64)
  )
  logit_bound = 2.0**-16 * float(scale.max())
  print(f"device: {jax.devices()[0].device_kind}  N={n} D={d} V={v}")
  print(
      "| algorithm | fwd ms | fwd+bwd ms | fwd TFLOP/s | max logit err "
      "| max logp err | mean logp err |"
  )
  print("|---|---|---|---|---|---|---|")
  rows = []
  for algorithm in ("highest", "bf16_3x", "tf32", "bf16"):
    dot = _dot(algorithm)
    fwd = jax.jit(lambda x, w, t, dot=dot: _logp(dot, x, w, t))
    bwd = jax.jit(
        jax.grad(
            lambda x, w, t, dot=dot: jnp.sum(g * _logp(dot, x, w, t)),
            argnums=(0, 1),
        )
    )
    logits = jax.jit(lambda x, w, dot=dot: dot(x, w).astype(jnp.float32))
    fwd_s = timing.best_seconds(lambda: fwd(x, w, targets), 5)
    bwd_s = timing.best_seconds(lambda: bwd(x, w, targets), 5)
    got = np.asarray(fwd(x, w, targets), np.float64)[:rows_ref]
    got_logits = np.asarray(logits(x[:rows_ref], w), np.float64)
    row = {
        "algorithm": algorithm,
        "device": jax.devices()[0].device_kind,
        "fwd_ms": 1e3 * fwd_s,
        "fwd_bwd_ms": 1e3 * bwd_s,
        "fwd_tflops": 2 * n * d * v / fwd_s / 1e12,
        "max_logit_err": float(np.abs(got_logits - ref_logits).max()),
        "max_logp_err": float(np.abs(got - want_logp).max()),
        "mean_logp_err": float(np.abs(got - want_logp).mean()),
        "max_logit_bound": logit_bound if algorithm in FP32_HEAD else None,
        "max_logp_bound": 2 * logit_bound if algorithm in FP32_HEAD else None,
    }
    rows.append(row)
    print(
        f"| {algorithm} | {row['fwd_ms']:.1f} | {row['fwd_bwd_ms']:.1f} | "
        f"{row['fwd_tflops']:.0f} | {row['max_logit_err']:.2e} | "
        f"{row['max_logp_err']:.2e} | {row['mean_logp_err']:.2e} |",
        flush=True,
    )
  timing.write_json(_JSON.value, rows)
  over = [
      f"{row['algorithm']}: max logit err {row['max_logit_err']:.2e} "
      f"(bound {row['max_logit_bound']:.2e}), max logp err "
      f"{row['max_logp_err']:.2e} (bound {row['max_logp_bound']:.2e})"
      for row in rows
      if row["algorithm"] in FP32_HEAD
      and (
          row["max_logit_err"] > row["max_logit_bound"]
          or row["max_logp_err"] > row["max_logp_bound"]
      )
  ]
  if over:
    sys.exit("FP32 head past its error bound: " + "; ".join(over))
  print(f"FP32 head within its error bound ({logit_bound:.2e} a logit)")


if __name__ == "__main__":
  app.run(main)
