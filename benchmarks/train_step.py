"""Train-step throughput on CPU as a fraction of the machine's matmul rate.

  python -m benchmarks.train_step
  python -m benchmarks.train_step --shapes=small_cpu --prompts_per_step=8 \
      --seq_lens=64

For each model shape and sequence length S, on random weights and a synthetic
batch of P x G rows (random tokens; the loss mask over a random-length
completion after an S/4-token prompt; generator log-probs near the policy's;
0/1 rewards with both values in every group), all measured in this one run:

* step: the run's own program, `rl.train_step.jit_train_step` on the pieces
  `rl.step_parts.build` makes (as jobs/planner/aot_programs.py does), the state
  donated, on a batch already on the device;
* its parts, each jitted alone on the same arrays: forward (`policy_logprobs`
  only); backward (`loss_and_grads` minus forward); log-prob and loss (the
  final norm, LM head, log-softmax, entropy and loss, forward and backward,
  from the last block's output; it is part of forward and backward too);
  optimizer update (`optimizer.update` and `apply_updates`); the rest of the
  step (norms, metrics, the non-finite guard) is step minus `loss_and_grads`
  minus the update; host-to-device placement of the batch
  (`rl.batch.place_batch`, as the trainer places it).

FLOPs are `compute.train_flops` over the padded rows (the hardware's work).
They are reported against a dense float32 matmul through JAX measured in the
same run. A shape is a config variant, optionally with model fields changed:
`tiny_cpu:embed_dim=256;mlp_dim=768`.
"""

import functools
import os
import time
from typing import Any, Callable

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np
import optax

from benchmarks.shapes import shape_config
from scalerl_jax import sharding
from scalerl_jax.metrics import compute
from scalerl_jax.models import transformer
from scalerl_jax.rl import advantages
from scalerl_jax.rl import batch as batch_lib
from scalerl_jax.rl import logprobs
from scalerl_jax.rl import losses
from scalerl_jax.rl import step_parts
from scalerl_jax.rl import train_step as train_step_lib

_SHAPES = flags.DEFINE_list(
    "shapes",
    [
        "tiny_cpu",
        "small_cpu",
        "tiny_cpu:embed_dim=256;mlp_dim=768;num_heads=8;num_kv_heads=4",
    ],
    "Config variants, each optionally with model fields: variant:field=value;field=value.",
)
_SEQ_LENS = flags.DEFINE_list(
    "seq_lens", ["64", "128", "256"], "Padded sequence lengths S."
)
_PROMPTS = flags.DEFINE_integer(
    "prompts_per_step", 0, "P; 0 keeps the config's."
)
_REPEATS = flags.DEFINE_integer(
    "repeats", 5, "Timed runs after the warm-up; best is kept."
)
_MATMUL = flags.DEFINE_integer(
    "matmul_size", 2048, "Side of the square matmul."
)


def best_times(
    fns: dict[str, Callable[[], Any]], repeats: int
) -> dict[str, tuple[float, float]]:
  """Shortest wall time and process CPU time of each function
  over `repeats` rounds.

  Every function is called once per round, in turn, after one warm-up call
  each, so load from other processes that comes and goes affects all alike.
  CPU time (all of this process's threads) counts the work done whether or not
  other processes held the cores meanwhile, so its ratios
  hold on a busy machine.
  """
  for fn in fns.values():
    jax.block_until_ready(fn())
  best = {name: (float("inf"), float("inf")) for name in fns}
  for _ in range(repeats):
    for name, fn in fns.items():
      wall, cpu = time.perf_counter(), time.process_time()
      jax.block_until_ready(fn())
      wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
      best[name] = (min(best[name][0], wall), min(best[name][1], cpu))
  return best


def matmul(n: int) -> Callable[[], jax.Array]:
  """A dense float32 [n, n] x [n, n] matmul through JAX (2 n^3 FLOPs)."""
  a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
  b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32)
  product = jax.jit(jnp.matmul)
  return lambda: product(a, b)


def synthetic_batch(
    spec: train_step_lib.StepSpec, params, seq_len: int, seed: int = 0
) -> dict[str, np.ndarray]:
  """A host batch of P x G rows of `seq_len` tokens (see module docstring)."""
  p, g = spec.num_prompts, spec.num_generations
  rng = np.random.RandomState(seed)
  vocab = spec.model.cfg.vocab_size
  prompt = seq_len // 4
  ends = rng.randint(prompt + seq_len // 4, seq_len + 1, p * g)
  positions = np.arange(seq_len)
  live = positions[None, :] < ends[:, None]
  tokens = np.where(live, rng.randint(1, vocab, (p * g, seq_len)), 0).astype(
      np.int32
  )
  mask = (live & (positions[None, :] >= prompt)).astype(np.float32)
  logp, _ = jax.jit(logprobs.policy_logprobs, static_argnums=(0, 3))(
      spec.model, params, tokens, spec.temperature
  )
  gen_logp = mask * (np.asarray(logp) + 0.05 * rng.standard_normal(mask.shape))
  rewards = rng.randint(0, 2, (p, g)).astype(np.float32)
  rewards[:, 0], rewards[:, 1] = 0.0, 1.0
  return {
      "tokens_BxS": tokens,
      "mask_BxS": mask,
      "gen_logp_BxS": gen_logp.astype(np.float32),
      "rewards_PxG": rewards,
  }


def _head_and_loss(params, x_BxTxD, batch, spec):
  """(loss, mean entropy) from the last block's output: final norm,
  LM head, log-softmax."""
  logits_BxTxV = (
      transformer.output_logits(spec.model.cfg, params, x_BxTxD)
      / spec.temperature
  )
  logp_all = jax.nn.log_softmax(logits_BxTxV.astype(jnp.float32), axis=-1)
  targets_BxT = batch["tokens_BxS"][:, 1:]
  logp_BxT = jnp.take_along_axis(logp_all, targets_BxT[..., None], axis=-1)[
      ..., 0
  ]
  entropy_BxT = -jnp.sum(jnp.exp(logp_all) * logp_all, axis=-1)
  logp_BxS = jnp.pad(logp_BxT, ((0, 0), (1, 0)))
  p, g = spec.num_prompts, spec.num_generations
  adv_PxG, _ = advantages.group_advantages(
      batch["rewards_PxG"],
      spec.adv_norm,
      zero_variance_filter=spec.zero_variance_filter,
  )
  loss, _ = losses.compute_loss(
      spec.loss,
      logp_BxS,
      batch["gen_logp_BxS"],
      adv_PxG.reshape(p * g),
      batch["mask_BxS"],
      advantages.group_ids(p, g),
      p,
  )
  return loss, jnp.mean(entropy_BxT)


def time_parts(
    spec, step, batch_sh, state, divisor, host_batch, repeats
) -> dict[str, tuple[float, float]]:
  """`best_times` of the step, its parts (see module docstring) and the matmul.

  Args:
    spec: the step's `StepSpec`.
    step: `jit_train_step`'s step; `batch_sh`: its batch's shardings.
    state: the train state, donated to `step`.
    divisor: the mesh's batch divisor (`sharding.batch_divisor`).
    host_batch: the host batch (`synthetic_batch`).
    repeats: timed rounds after the warm-up.
  """
  place = lambda: batch_lib.place_batch(host_batch, batch_sh, divisor)
  batch = place()
  copy = lambda tree: jax.tree_util.tree_map(jnp.copy, tree)
  params = copy(state.params)
  forward = jax.jit(
      lambda p, t: logprobs.policy_logprobs(spec.model, p, t, spec.temperature)
  )
  grads_fn = jax.jit(
      functools.partial(train_step_lib.loss_and_grads, spec=spec)
  )
  hidden = jax.jit(
      lambda p, t: spec.model.apply(
          {"params": p}, t[:, :-1], return_hidden=True
      )
  )(params, batch["tokens_BxS"])
  head = jax.jit(
      jax.value_and_grad(
          functools.partial(_head_and_loss, spec=spec),
          argnums=(0, 1),
          has_aux=True,
      )
  )
  _, _, grads = grads_fn(params, batch)

  @functools.partial(jax.jit, donate_argnums=(0, 1))
  def update(params, opt_state, grads):
    updates, opt_state = spec.optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state

  # The step and the update donate their inputs: each gets its own copy.
  carry = {"state": state, "update": (copy(params), copy(state.opt_state))}

  def run_step():
    carry["state"], step_metrics = step(carry["state"], batch)
    return step_metrics

  def run_update():
    carry["update"] = update(*carry["update"], grads)
    return carry["update"]

  return best_times(
      {
          "step": run_step,
          "forward": lambda: forward(params, batch["tokens_BxS"]),
          "grads": lambda: grads_fn(params, batch),
          "logprob_loss": lambda: head(params, hidden, batch),
          "update": run_update,
          "placement": place,
          "matmul": matmul(_MATMUL.value),
      },
      repeats,
  )


def table_row(
    label: str, flops: float, times: dict[str, tuple[float, float]]
) -> str:
  """One markdown row: the step's rate against the matmul's,
  and its parts' shares.

  Rates are FLOPs over the wall time and over half the CPU time (two cores);
  shares are of the step's CPU time.
  """
  (wall, cpu), (mm_wall, mm_cpu) = times["step"], times["matmul"]
  mm_flops = 2 * _MATMUL.value**3
  share = {name: times[name][1] / cpu for name in times}
  share["backward"] = share["grads"] - share["forward"]
  share["rest"] = 1 - share["grads"] - share["update"]
  parts = " | ".join(f"{100 * share[name]:.0f}%" for name in _PARTS)
  return (
      f"| {label} | {wall:.2f} | {flops / wall / 1e9:.1f} | {mm_flops / mm_wall / 1e9:.1f} "
      f"| {100 * flops / wall / (mm_flops / mm_wall):.0f}% "
      f"| {flops / cpu * 2 / 1e9:.1f} | {mm_flops / mm_cpu * 2 / 1e9:.1f} "
      f"| {100 * flops / cpu / (mm_flops / mm_cpu):.0f}% | {parts} |"
  )


_PARTS = ("forward", "backward", "logprob_loss", "update", "rest", "placement")


def main(argv):
  del argv
  print(
      f"devices: {jax.devices()}  cpu cores: {os.cpu_count()}  matmul: float32 "
      f"{_MATMUL.value}^2, timed in turn with the step and its parts\n"
  )
  header = (
      "| shape (params) | P x G x S | step s | GFLOP/s | matmul GFLOP/s | % matmul "
      "| GFLOP/cpu-s x 2 | matmul GFLOP/cpu-s x 2 | % matmul (cpu) | "
      + " | ".join(_PARTS)
      + " |"
  )
  print(header)
  print("|" + "---|" * (header.count("|") - 1))
  for shape in _SHAPES.value:
    config = shape_config(shape, _PROMPTS.value)
    parts = step_parts.build(config, rng=jax.random.key(0))
    mesh, rules, optimizer, spec = (
        parts.mesh,
        parts.rules,
        parts.optimizer,
        parts.spec,
    )
    cfg, params, param_sh = parts.model.cfg, parts.params, parts.param_shardings
    divisor = sharding.batch_divisor(mesh, rules)
    with sharding.activate(mesh, rules):
      for seq_len in map(int, _SEQ_LENS.value):
        # A copy: the step donates its state, and jit passes
        # unchanged inputs through.
        state, state_sh = train_step_lib.init_train_state(
            optimizer, jax.tree_util.tree_map(jnp.copy, params), param_sh, mesh
        )
        step, batch_sh = train_step_lib.jit_train_step(
            config, parts.model, mesh, rules, optimizer, state_sh
        )
        host_batch = synthetic_batch(spec, params, seq_len)
        times = time_parts(
            spec, step, batch_sh, state, divisor, host_batch, _REPEATS.value
        )
        rows = host_batch["tokens_BxS"].shape[0]
        label = (
            f"{shape} ({cfg.num_params() / 1e6:.2f}M) | {spec.num_prompts} x "
            f"{spec.num_generations} x {seq_len}"
        )
        print(
            table_row(label, compute.train_flops(cfg, [seq_len] * rows), times),
            flush=True,
        )


if __name__ == "__main__":
  app.run(main)
