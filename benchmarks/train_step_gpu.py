"""The RL train step on one accelerator: time, MFU, memory, and where the
time goes.

  python -m benchmarks.train_step_gpu \
      --shape='qwen3_0.6b:model.attention=cudnn' --seq_len=1280 --parts
  python -m benchmarks.train_step_gpu --shape=... --plan_only  # any machine

One config per process, so that the allocator's peak is the step's own (a
driver runs one process per variant: benchmarks/gpu_check.sh). Measured in
this one run, on random weights and a synthetic batch of P x G rows (random
tokens, a loss mask over a random-length completion after an S/4-token
prompt, generator log-probs drawn near -1, 0/1 rewards with both values in
every group, so every group trains):

* step: the run's own program, `train_step.jit_train_step` on the pieces
  `rl.step_parts.build` makes, as jobs/planner/aot_programs.py does (the state
  donated, the batch on the device); its compile time; its FLOP/s counted as
  `compute.train_flops` counts them, against the chip's dense bfloat16 peak
  (of `--chip`, jobs/planner/accelerators.py) and against a bfloat16 8192^3
  matmul timed here;
* memory: the allocator's peak after the compile and the timed steps,
  beside the planner's train step (`plan.make_plan`, without the rollout
  slots a run keeps beside it);
* with `--parts`, each jitted alone on one microbatch and multiplied by M:
  forward (the layers), backward (the layers' gradient less their forward;
  with remat it recomputes one forward, counted in it), LM head (final norm,
  head, log-softmax and entropy, chunked as the step does, forward and
  backward), attention (the kernel alone, forward and backward, x layers),
  and the optimizer update; "rest" is the step less these.
"""

import functools
import json
import os
import time

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np
import optax

from benchmarks import timing
from benchmarks.shapes import shape_config
from scalerl_jax import sharding
from scalerl_jax.jobs.planner import accelerators
from scalerl_jax.jobs.planner import plan as plan_lib
from scalerl_jax.metrics import compute
from scalerl_jax.models import attention as attention_lib
from scalerl_jax.models import lm_head
from scalerl_jax.rl import batch as batch_lib
from scalerl_jax.rl import logprobs
from scalerl_jax.rl import step_parts
from scalerl_jax.rl import train_step as train_step_lib

_SHAPE = flags.DEFINE_string(
    "shape",
    "qwen3_0.6b:model.attention=cudnn",
    "Config variant with fields set: variant:field=value;... (benchmarks/"
    "shapes.py).",
)
_PROMPTS = flags.DEFINE_integer("prompts_per_step", 8, "P.")
_SEQ_LEN = flags.DEFINE_integer("seq_len", 1280, "Padded sequence length S.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed steps; best is kept.")
_PARTS = flags.DEFINE_bool("parts", False, "Also time the step's parts.")
_CHIP = flags.DEFINE_enum(
    "chip",
    "h100",
    list(accelerators.ACCELERATORS),
    "The chip whose dense bfloat16 peak MFU is counted against.",
)
_MATMUL_N = flags.DEFINE_integer(
    "matmul_n", 8192, "Side of the bfloat16 matmul timed beside the step."
)
_LABEL = flags.DEFINE_string("label", "", "Row label; default the shape.")
_JSON = flags.DEFINE_string("json", "", "Append the row as JSON here.")
_PLAN_ONLY = flags.DEFINE_bool(
    "plan_only",
    False,
    "Print the planner's train step for a GPU (planned_train_gb) and stop; "
    "needs no GPU.",
)


def synthetic_batch(
    vocab: int, p: int, g: int, seq_len: int, seed: int = 0
) -> dict[str, np.ndarray]:
  """A host batch of P x G rows (see the module docstring)."""
  rng = np.random.RandomState(seed)
  prompt = seq_len // 4
  ends = rng.randint(prompt + seq_len // 4, seq_len + 1, p * g)
  positions = np.arange(seq_len)
  live = positions[None, :] < ends[:, None]
  tokens = np.where(live, rng.randint(1, vocab, (p * g, seq_len)), 0)
  mask = (live & (positions[None, :] >= prompt)).astype(np.float32)
  gen_logp = mask * -rng.uniform(0.5, 1.5, mask.shape)
  rewards = rng.randint(0, 2, (p, g)).astype(np.float32)
  rewards[:, 0], rewards[:, 1] = 0.0, 1.0
  return {
      "tokens_BxS": tokens.astype(np.int32),
      "mask_BxS": mask,
      "gen_logp_BxS": gen_logp.astype(np.float32),
      "rewards_PxG": rewards,
  }


def memory_gb() -> dict[str, float]:
  stats = jax.devices()[0].memory_stats() or {}
  return {
      name: stats[key] / 1e9
      for name, key in (
          ("peak_gb", "peak_bytes_in_use"),
          ("in_use_gb", "bytes_in_use"),
          ("limit_gb", "bytes_limit"),
      )
      if key in stats
  }


def planned_train_gb(config, platform: str) -> float:
  """The planner's train step alone: its peak less the rollout slots a run
  keeps beside it."""
  plan = plan_lib.make_plan(config, 1, platform=platform)
  return (plan.train_peak - plan.kv_cache - plan.slot_records) / 1e9


def time_parts(mesh, rules, model, params, batch, spec) -> dict[str, float]:
  """Seconds per step of each part (module docstring), from one microbatch."""
  cfg = model.cfg
  m = spec.microbatches
  rows = batch["tokens_BxS"].shape[0] // m
  tokens = batch["tokens_BxS"][:rows]
  t = tokens.shape[1] - 1
  key = jax.random.key(1)
  probe_BxTxD = jax.random.normal(key, (rows, t, cfg.embed_dim), cfg.dtype)

  def hidden(p, tokens):
    return model.apply({"params": p}, tokens[:, :-1], return_hidden=True)

  def layers_loss(p, tokens):
    return jnp.sum(hidden(p, tokens).astype(jnp.float32) * probe_BxTxD)

  def head_loss(p, x_BxTxD, tokens):
    logp, _ = logprobs.head_logprobs(
        cfg,
        p,
        x_BxTxD,
        tokens[:, 1:],
        spec.temperature,
        spec.logprob_chunk or t,
    )
    return jnp.sum(logp)

  h, k, e = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
  kernel = attention_lib.resolve(cfg.attention, t, cfg.dtype)
  q = jax.random.normal(key, (rows, t, h, e), cfg.dtype)
  kv = jax.random.normal(key, (rows, t, k, e), cfg.dtype)

  def attention_loss(q, k, v):
    out = attention_lib.apply(kernel, q, k, v, dtype=cfg.dtype)
    return jnp.sum(out.astype(jnp.float32))

  x_BxTxD = jax.jit(hidden)(params, tokens)
  grads = jax.tree_util.tree_map(jnp.zeros_like, params)
  opt_state = spec.optimizer.init(params)

  @jax.jit
  def update(params, opt_state, grads):
    updates, opt_state = spec.optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state

  fns = {
      "forward": (jax.jit(hidden), (params, tokens), m),
      "layers_fwd_bwd": (jax.jit(jax.grad(layers_loss)), (params, tokens), m),
      "lm_head": (
          jax.jit(jax.grad(head_loss, argnums=(0, 1))),
          (params, x_BxTxD, tokens),
          m,
      ),
      "attention": (
          jax.jit(jax.grad(attention_loss, argnums=(0, 1, 2))),
          (q, kv, kv),
          m * cfg.num_layers,
      ),
      "optimizer": (update, (params, opt_state, grads), 1),
  }
  with sharding.activate(mesh, rules):
    seconds = {
        name: times * timing.best_seconds(functools.partial(fn, *args), 3)
        for name, (fn, args, times) in fns.items()
    }
  seconds["backward"] = seconds.pop("layers_fwd_bwd") - seconds["forward"]
  return seconds


def main(argv):
  del argv
  config = shape_config(_SHAPE.value, _PROMPTS.value)
  with config.unlocked():
    config.sampling.max_prompt_len = _SEQ_LEN.value // 5
    config.sampling.max_new_tokens = _SEQ_LEN.value - _SEQ_LEN.value // 5
    config.sampling.interruption.enabled = False
  if _PLAN_ONLY.value:
    print(f"planned_train_gb {planned_train_gb(config, 'gpu'):.2f}")
    return
  parts = step_parts.build(config, rng=jax.random.key(0))
  model, mesh, rules, optimizer, spec = (
      parts.model,
      parts.mesh,
      parts.rules,
      parts.optimizer,
      parts.spec,
  )
  cfg, params, param_sh = model.cfg, parts.params, parts.param_shardings
  # The parts need the parameters after the step has donated its own; without
  # them the state takes these, and the allocator's peak is the step's alone.
  state, state_sh = train_step_lib.init_train_state(
      optimizer,
      jax.tree_util.tree_map(jnp.copy, params) if _PARTS.value else params,
      param_sh,
      mesh,
  )
  step, batch_sh = train_step_lib.jit_train_step(
      config, model, mesh, rules, optimizer, state_sh
  )
  host = synthetic_batch(
      cfg.vocab_size,
      spec.num_prompts,
      spec.num_generations,
      _SEQ_LEN.value,
  )
  batch = batch_lib.place_batch(
      host, batch_sh, sharding.batch_divisor(mesh, rules)
  )
  with sharding.activate(mesh, rules):
    start = time.perf_counter()
    compiled = step.lower(state, batch).compile()
    compile_s = time.perf_counter() - start
    after_compile = memory_gb()
    carry = {"state": state}

    def run():
      carry["state"], metrics = compiled(carry["state"], batch)
      return metrics

    step_s = timing.best_seconds(run, _REPEATS.value)
    metrics = jax.device_get(run())
  memory = memory_gb()
  rows = spec.num_prompts * spec.num_generations
  flops = compute.train_flops(cfg, [_SEQ_LEN.value] * rows)
  planned = planned_train_gb(config, jax.default_backend())
  row = {
      "label": _LABEL.value or _SHAPE.value,
      "device": jax.devices()[0].device_kind,
      "jax": jax.__version__,
      "xla_flags": os.environ.get("XLA_FLAGS", ""),
      "rows": rows,
      "seq_len": _SEQ_LEN.value,
      "microbatches": spec.microbatches,
      "logprob_chunk": spec.logprob_chunk,
      "remat": cfg.remat,
      "remat_policy": cfg.remat_policy,
      "lm_head": lm_head.head_algorithm(cfg) if cfg.fp32_lm_head else "off",
      "attention": attention_lib.resolve(
          cfg.attention, _SEQ_LEN.value - 1, cfg.dtype
      ),
      "compile_s": compile_s,
      "step_s": step_s,
      "train_flops": flops,
      "tflops": flops / step_s / 1e12,
      "mfu": flops
      / step_s
      / (accelerators.ACCELERATORS[_CHIP.value].peak_flops),
      "matmul_tflops": timing.matmul_flops_per_s(_MATMUL_N.value) / 1e12,
      "peak_after_compile_gb": after_compile.get("peak_gb"),
      "memory": memory,
      "planned_train_gb": planned,
      "updated": float(metrics["l2_updates"]) > 0,
      "loss": float(metrics["loss"]),
  }
  if _PARTS.value:
    row["parts_s"] = time_parts(mesh, rules, model, params, batch, spec)
    row["parts_s"]["rest"] = (
        step_s
        - sum(row["parts_s"].values())
        + (row["parts_s"]["attention"])  # Inside forward and backward already.
    )
  print(json.dumps(row, indent=1), flush=True)
  print(
      f"| {row['label']} | {row['device']} | {step_s:.2f} | "
      f"{row['tflops']:.0f} | {100 * row['mfu']:.1f}% | "
      f"{row['matmul_tflops']:.0f} | {compile_s:.0f} | "
      f"{memory.get('peak_gb', float('nan')):.1f} | {planned:.1f} |"
  )
  if _JSON.value:
    with open(_JSON.value, "a") as f:
      f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
  app.run(main)
