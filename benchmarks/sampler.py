"""Sampler throughput on CPU against a naive loop, Hugging Face
`generate` and Tunix.

  python -m benchmarks.sampler
  python -m benchmarks.sampler --variants=tiny_cpu --batch_sizes=64 \
      --new_tokens=64
  python -m benchmarks.sampler \
      --variants='tiny_cpu:family=qwen3;qk_norm=True;rope_theta=1e6'

For each model (`tiny_cpu` and the ~50M `small_cpu` of configs/scalerl.py, with
random weights; a variant may change model fields, benchmarks/shapes.py) and
each batch size and completion length, all measured in this one run on the
same weights and prompts:

* sampler: `Sampler.generate` (prefill + jitted decode loop over the KV cache),
  temperature 1, no top-k/top-p, no EOS, so every row makes exactly
  `new_tokens` tokens;
* naive: a jitted full forward pass over the whole (fixed-shape, padded)
  sequence for every token. Every step costs the same, so it is timed over
  `--naive_steps` steps;
* transformers: `generate` with its KV cache, PyTorch CPU, on the same weights
  exported with `hf_io.save_checkpoint`, sampling at temperature 1 without
  top-k/top-p and with `min_new_tokens` = `max_new_tokens`.
* Tunix: the `Sampler` of Tunix (`google-tunix`, the optional `bench` extra;
  "n/a" with the reason when it cannot be imported) over Tunix's Qwen3 of the
  same shape holding the same weights (loaded by Tunix from that export),
  sampling at temperature 1 with top-p 1 (its plain categorical draw), no EOS,
  its KV cache exactly prompt + new tokens long, timed through its `__call__`
  (prompts in and tokens out as text of the ids: its host work counts, as
  `Sampler.generate`'s does; benchmarks/tunix_sampler.py).
  Tunix's Qwen3 always has q/k norms and RoPE base 1e6: on the llama-family
  variants it runs with norm scales of one (two small norms per layer more than
  ours); `tiny_cpu:family=qwen3;qk_norm=True;rope_theta=1e6` is the same
  network in both (greedy tokens equal).
* matmuls alone: the decode step's weight matmuls (fused q/k/v, o, fused
  gate/up, down, LM head) on [batch, D] rows in a jitted loop, with nothing
  else: no attention, norms, sampling or prefill. It is the ceiling that XLA's
  CPU matmuls put on any decoder at these shapes.
* all matmuls: the same, plus the prefill's weight matmuls (the layers' on
  [batch x prompt, D] rows, no LM head) timed alone in the same way. The
  sampler's wall time includes its prefill, so this is the like-for-like
  ceiling: at 32-token prompts and 64 new tokens, the prefill has half as
  many tokens as the decode.
* all matmuls + cache read: the all-matmuls time plus the time to read, once per
  decode step, every key and value a token attends to (the filled part of
  the cache only, as an ideal paged attention would) at the read bandwidth
  of this machine (a jitted sum over a 256 MiB array, measured in this run).
  Decode attention is a batched matrix-vector product, so its speed is set by
  memory bandwidth, not by the matmul units: this is the floor for a decoder
  that keeps its cache in float32.

With `--mesh_shape` (e.g. 2,1,1 under
XLA_FLAGS=--xla_force_host_platform_device_count=2) the sampler's slots are
split over several devices and the two matmul ceilings split their rows the
same way. The same sampler and ceilings on one device are timed in the same
rounds, each ceiling column takes the faster of the two layouts, and a line
per row after the table compares the layouts. On the 2-core CPU this is how
both cores work on the decode: XLA:CPU runs a decode step's small ops on one
thread.

After the table, the read bandwidth decode attention gets from its own access
pattern: the model's `attention` for one query per row over every layer's full
cache (`attention_read_bytes_per_s`), in float32 and in bfloat16.

Tokens per second count generated tokens only; wall time includes the prompt's
prefill for both KV-cache samplers. The machine's dense matmul throughput (a
large float32 matmul through JAX) is measured in the same run, and the useful
model FLOPs (2 x weights x tokens, plus attention over the positions each token
sees; the prefill without the LM head, which XLA drops there) divided by the
wall time are reported as a fraction of it.

Each row times the sampler, Tunix and the two matmul ceilings in alternation,
`--repeats` rounds, and keeps each one's best: on a shared machine whose speed
drifts between minutes, their ratios then compare like with like.
"""

import copy
import functools
import os
import tempfile
import time
from typing import Callable

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import hf_sampling
from benchmarks import tunix_sampler
from benchmarks.shapes import shape_config
from scalerl_jax import sharding
from scalerl_jax.models import hf_io
from scalerl_jax.models.model_config import ModelConfig
from scalerl_jax.models.transformer import Transformer
from scalerl_jax.models.transformer import attention
from scalerl_jax.sampling.sampler import Sampler

_VARIANTS = flags.DEFINE_list(
    "variants", ["tiny_cpu", "small_cpu"], "Model sizes."
)
_BATCH_SIZES = flags.DEFINE_list(
    "batch_sizes", ["1", "16", "64"], "Batch sizes."
)
_NEW_TOKENS = flags.DEFINE_list(
    "new_tokens", ["64", "256"], "Completion lengths."
)
_PROMPT_LEN = flags.DEFINE_integer(
    "prompt_len", 32, "Prompt length (all rows)."
)
_NAIVE_STEPS = flags.DEFINE_integer(
    "naive_steps", 8, "Timed steps of the naive loop."
)
_REPEATS = flags.DEFINE_integer(
    "repeats", 3, "Timed rounds after the warm-up; best is kept."
)
_HF = flags.DEFINE_bool("hf", True, "Also time transformers generate.")
_TUNIX = flags.DEFINE_bool(
    "tunix", True, "Also time Tunix's sampler (the `bench` extra)."
)
_TORCH_THREADS = flags.DEFINE_list(
    "torch_threads",
    ["1", "2"],
    "PyTorch thread counts to try; the fastest is reported (on a shared machine OpenMP "
    "threads can stall each other, so fewer threads are sometimes faster).",
)
_MATMUL = flags.DEFINE_integer(
    "matmul_size", 2048, "Side of the square matmul."
)
_MESH_SHAPE = flags.DEFINE_list(
    "mesh_shape",
    [],
    "config.mesh.shape for the sampler (e.g. 2,1,1: slots over two "
    "devices, weights replicated); the matmul ceilings then run on the same devices, each "
    "on its share of the rows. Empty: the variant's own. Several CPU devices: run with "
    "XLA_FLAGS=--xla_force_host_platform_device_count=N.",
)


def bench_prompts(
    cfg: ModelConfig, batch: int, prompt_len: int
) -> tuple[np.ndarray, np.ndarray]:
  """The benchmarks' prompts: `batch` rows of `prompt_len` random ids
  (seeded by the batch)."""
  prompts = np.random.RandomState(batch).randint(
      1, cfg.vocab_size, (batch, prompt_len)
  )
  return prompts, np.full((batch,), prompt_len)


def _best_times(
    fns: dict[str, Callable[[], object]], repeats: int
) -> dict[str, float]:
  """Best wall time of each function over `repeats` rounds
  that run them in turn.

  Timed in alternation, the programs whose ratios the table reports see the
  same state of a shared machine, whose speed drifts by 10-30% over minutes.
  """
  best = dict.fromkeys(fns, float("inf"))
  for _ in range(repeats):
    for name, fn in fns.items():
      start = time.perf_counter()
      jax.block_until_ready(fn())
      best[name] = min(best[name], time.perf_counter() - start)
  return best


def _best_time(fn: Callable[[], object], repeats: int) -> float:
  return _best_times({"": fn}, repeats)[""]


def matmul_flops_per_s(n: int) -> float:
  """Dense float32 matmul throughput of this machine through JAX."""
  a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
  b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32)
  matmul = jax.jit(jnp.matmul)
  jax.block_until_ready(matmul(a, b))
  return 2 * n**3 / _best_time(lambda: matmul(a, b), 5)


def read_bytes_per_s(mib: int = 256) -> float:
  """Memory read bandwidth through JAX: a jitted sum over a float32 array."""
  x = jnp.ones((mib * 2**18,), jnp.float32)
  total = jax.jit(jnp.sum)
  jax.block_until_ready(total(x))
  return x.nbytes / _best_time(lambda: total(x), 5)


def attention_read_bytes_per_s(
    cfg: ModelConfig, batch: int, positions: int, dtype=jnp.float32
) -> float:
  """Bytes/s of one decode step's attention over every layer's cache, alone.

  The model's `attention` for one query per row, layer after layer (each
  layer's query is the previous layer's output), over caches of `positions`
  filled positions stored in `dtype`: the read bandwidth decode attention
  gets from its own access pattern, to set beside the streaming read's.
  """
  b, k, e, n = batch, cfg.num_kv_heads, cfg.head_dim, cfg.num_layers
  key = jax.random.key(0)

  def normal(i, shape):
    return jax.random.normal(jax.random.fold_in(key, i), shape).astype(dtype)

  caches = [
      (
          normal(2 * i, (b, k, e, positions)),
          normal(2 * i + 1, (b, k, positions, e)),
      )
      for i in range(n)
  ]
  visible = jnp.ones((b, 1, positions), bool)

  @jax.jit
  def layers(q_Bx1xKxQxE, caches):
    for keys, values in caches:
      q_Bx1xKxQxE = attention(q_Bx1xKxQxE, keys, values, visible, jnp.float32)
    return q_Bx1xKxQxE

  q = jax.random.normal(key, (b, 1, k, cfg.num_heads // k, e))
  jax.block_until_ready(layers(q, caches))
  nbytes = sum(keys.nbytes + values.nbytes for keys, values in caches)
  return nbytes / _best_time(lambda: layers(q, caches), 10)


def decode_positions_attended(prompt_len: int, new: int) -> float:
  """Cache positions one row's decode steps attend to, summed over the steps.

  Step j (from 0) processes the token at position prompt_len - 1 + j and
  attends to positions 0 .. prompt_len - 1 + j.
  """
  return new * prompt_len + new * (new - 1) / 2


def cache_bytes_read(
    cfg: ModelConfig, batch: int, prompt_len: int, new: int
) -> float:
  """Bytes of keys and values the decode steps attend to
  (filled positions only)."""
  itemsize = jnp.dtype(cfg.dtype).itemsize
  per_position = cfg.num_layers * 2 * cfg.num_kv_heads * cfg.head_dim * itemsize
  return batch * per_position * decode_positions_attended(prompt_len, new)


def generate_flops(
    cfg: ModelConfig, batch: int, prompt_len: int, new: int
) -> float:
  """Useful FLOPs of prefill + decode for `batch` rows
  (see module docstring)."""
  d, h, k, e, f = (
      cfg.embed_dim,
      cfg.num_heads,
      cfg.num_kv_heads,
      cfg.head_dim,
      cfg.mlp_dim,
  )
  per_token = cfg.num_layers * 2 * (d * e * (2 * h + 2 * k) + 3 * d * f)
  attn_per_position = cfg.num_layers * 4 * h * e
  head = 2 * d * cfg.vocab_size
  prefill = (
      prompt_len * per_token
      + attn_per_position * prompt_len * (prompt_len + 1) / 2
  )
  decode = new * (
      per_token + head
  ) + attn_per_position * decode_positions_attended(prompt_len, new)
  return batch * (prefill + decode)


def _naive_tokens_per_s(model, params, prompts, new, mesh, rules) -> float:
  batch, prompt_len = prompts.shape

  def step(params, tokens, pos, key):
    logits = model.apply({"params": params}, tokens)
    last = jax.lax.dynamic_index_in_dim(logits, pos - 1, axis=1, keepdims=False)
    nxt = jax.random.categorical(key, last).astype(jnp.int32)
    return jax.lax.dynamic_update_index_in_dim(tokens, nxt, pos, axis=1)

  tokens = np.zeros((batch, prompt_len + new), np.int32)
  tokens[:, :prompt_len] = prompts
  steps = min(new, _NAIVE_STEPS.value)
  with sharding.activate(mesh, rules):
    step = jax.jit(step, donate_argnums=1)
    warm = step(params, jnp.asarray(tokens), prompt_len, jax.random.key(0))

    def run():
      out = jnp.asarray(tokens)
      for i in range(steps):
        out = step(params, out, prompt_len + i, jax.random.key(i))
      return out

    jax.block_until_ready(warm)
    return batch * steps / _best_time(run, _REPEATS.value)


def _matmul_ceiling_programs(
    cfg: ModelConfig, batch: int, prompt_len: int, new: int, rows_sharding=None
) -> dict[str, Callable[[], object]]:
  """The decode's and the prefill's weight matmuls alone,
  compiled (see module docstring).

  With `rows_sharding` (the sampler's slot sharding), the rows are split over
  its devices like the sampler's slots, and every device holds all weights.
  """
  d, f, v = cfg.embed_dim, cfg.mlp_dim, cfg.vocab_size
  qkv = (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim
  key = jax.random.key(0)
  shapes = [(d, qkv), (cfg.num_heads * cfg.head_dim, d), (d, 2 * f), (f, d)]
  weights = [
      [
          0.02 * jax.random.normal(jax.random.fold_in(key, i), shape)
          for shape in shapes
      ]
      for i in range(cfg.num_layers)
  ]
  head = 0.02 * jax.random.normal(key, (d, v))

  def layers(x_BxD):
    for w_qkv, w_o, w_gate_up, w_down in weights:
      attn_BxHE = (x_BxD @ w_qkv)[:, : w_o.shape[0]]
      x_BxD = x_BxD + attn_BxHE @ w_o
      x_BxD = x_BxD + (x_BxD @ w_gate_up)[:, :f] @ w_down
    return x_BxD

  def step(_, x_BxD):
    x_BxD = layers(x_BxD)
    return x_BxD + (x_BxD @ head)[:, :d]

  @jax.jit
  def decode(x_BxD):
    return jax.lax.fori_loop(0, new, step, x_BxD)

  programs = {}
  for name, run, rows in (
      ("decode matmuls", decode, batch),
      ("prefill matmuls", jax.jit(layers), batch * prompt_len),
  ):
    x = jnp.ones((rows, d), jnp.float32)
    if rows_sharding is not None:
      x = jax.device_put(x, rows_sharding)
    jax.block_until_ready(run(x))  # Compile.
    programs[name] = functools.partial(run, x)
  return programs


def _hf_tokens_per_s(
    hf_dir: str, prompts: np.ndarray, new: int
) -> tuple[float, int]:
  """Best tokens/s of transformers generate over `--torch_threads`,
  and its thread count."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top

  model = transformers.AutoModelForCausalLM.from_pretrained(
      hf_dir, dtype=torch.float32
  ).eval()
  ids = torch.from_numpy(prompts.astype(np.int64))
  kwargs = hf_sampling.kwargs(torch.ones_like(ids))
  best = (0.0, 0)
  with torch.inference_mode():
    for threads in map(int, _TORCH_THREADS.value):
      torch.set_num_threads(threads)
      model.generate(ids, max_new_tokens=2, min_new_tokens=2, **kwargs)
      seconds = _best_time(
          lambda: model.generate(
              ids, max_new_tokens=new, min_new_tokens=new, **kwargs
          ),
          _REPEATS.value,
      )
      best = max(best, (prompts.shape[0] * new / seconds, threads))
  return best


def main(argv):
  del argv
  peak = matmul_flops_per_s(_MATMUL.value)
  bandwidth = read_bytes_per_s()
  print(
      f"devices: {jax.devices()}  cpu cores: {os.cpu_count()}  "
      f"mesh shape: {','.join(_MESH_SHAPE.value) or 'the variant config'}"
  )
  print(
      f"dense f32 matmul {_MATMUL.value}^2 through JAX: {peak / 1e9:.1f} GFLOP/s; "
      f"memory read: {bandwidth / 1e9:.1f} GB/s\n"
  )
  header = (
      "| model | batch | new | sampler tok/s | naive tok/s | HF tok/s (threads) "
      "| Tunix tok/s | matmuls alone tok/s | all matmuls tok/s "
      "| all matmuls + cache read tok/s | vs naive | vs HF | vs Tunix | vs matmuls alone "
      "| vs all matmuls | vs all matmuls + cache read "
      "| sampler GFLOP/s | sampler % matmul | HF % matmul |"
  )
  print(header)
  print("|" + "---|" * (header.count("|") - 1))
  prompt_len = _PROMPT_LEN.value
  tunix_missing = (
      tunix_sampler.unavailable() if _TUNIX.value else "n/a (--notunix)"
  )
  reads = []  # Attention's own read bandwidth, printed after the table.
  layouts = []  # With --mesh_shape: the mesh against one device.
  for variant in _VARIANTS.value:
    config = shape_config(variant)
    if _MESH_SHAPE.value:
      config.mesh.shape = tuple(map(int, _MESH_SHAPE.value))
    cfg = ModelConfig.from_config(config.model)
    model = Transformer(cfg)
    mesh = sharding.make_mesh(config.mesh)
    rules = sharding.logical_rules(config.mesh)
    rows_sharding, single = None, None
    if _MESH_SHAPE.value:
      split = sharding.batch_divisor(mesh, rules)
      if any(int(b) % split for b in _BATCH_SIZES.value):
        raise ValueError(
            f"--batch_sizes={','.join(_BATCH_SIZES.value)}: with --mesh_shape="
            f"{','.join(_MESH_SHAPE.value)} the slots split {split} ways, so "
            f"every batch size must be a multiple of {split}"
        )
      rows_sharding = sharding.batch_sharding(mesh, rules, 2)
      # The same sampler on one device, timed in the same rounds
      # (see the module docstring).
      config_one = copy.deepcopy(config)
      config_one.mesh.shape = (1, 1, 1)
      mesh_one = sharding.make_mesh(config_one.mesh, jax.devices()[:1])
      single = (
          config_one,
          mesh_one,
          sharding.init_model_params(model, jax.random.key(0), mesh_one, rules)[
              0
          ],
      )
    params, _ = sharding.init_model_params(
        model, jax.random.key(0), mesh, rules
    )
    hf_dir = tempfile.mkdtemp(prefix="sampler_bench_")
    hf_io.save_checkpoint(params, cfg, hf_dir)
    for new in map(int, _NEW_TOKENS.value):
      config.sampling.max_prompt_len = prompt_len
      config.sampling.max_new_tokens = new
      sampler = Sampler.from_config(config, mesh, rules, eos_ids=(), pad_id=0)
      tunix = (
          None
          if tunix_missing
          else tunix_sampler.TunixSampler(hf_dir, cfg, prompt_len + new)
      )
      batch, positions = max(map(int, _BATCH_SIZES.value)), prompt_len + new
      rates = [
          f"{name} cache {attention_read_bytes_per_s(cfg, batch, positions, dtype) / 1e9:.1f} "
          f"GB/s"
          for name, dtype in (
              ("float32", jnp.float32),
              ("bfloat16", jnp.bfloat16),
          )
      ]
      reads.append(
          f"{variant}, batch {batch}, {positions} positions: {', '.join(rates)}"
      )
      for batch in map(int, _BATCH_SIZES.value):
        prompts, lens = bench_prompts(cfg, batch, prompt_len)
        sampler.generate(params, prompts, lens, jax.random.key(0))  # Compile.
        timed = {
            "sampler": functools.partial(
                lambda *args: sampler.generate(*args).tokens,
                params,
                prompts,
                lens,
                jax.random.key(1),
            )
        }
        timed.update(
            _matmul_ceiling_programs(cfg, batch, prompt_len, new, rows_sharding)
        )
        if single:
          config_one, mesh_one, params_one = single
          config_one.sampling.max_prompt_len = prompt_len
          config_one.sampling.max_new_tokens = new
          one = Sampler.from_config(
              config_one, mesh_one, rules, eos_ids=(), pad_id=0
          )
          one.generate(params_one, prompts, lens, jax.random.key(0))  # Compile.
          timed["sampler, one device"] = functools.partial(
              lambda *args: one.generate(*args).tokens,
              params_one,
              prompts,
              lens,
              jax.random.key(1),
          )
          timed.update(
              {
                  f"{name}, one device": run
                  for name, run in _matmul_ceiling_programs(
                      cfg, batch, prompt_len, new
                  ).items()
              }
          )
        if not tunix_missing:
          tunix.generate(prompts, new, seed=0)  # Compile.
          timed["tunix"] = functools.partial(
              tunix.generate, prompts, new, seed=1
          )
        times = _best_times(timed, _REPEATS.value)
        seconds = times["sampler"]
        ours = batch * new / seconds
        naive = _naive_tokens_per_s(model, params, prompts, new, mesh, rules)
        hf, threads = (
            _hf_tokens_per_s(hf_dir, prompts, new)
            if _HF.value
            else (float("nan"), 0)
        )
        if tunix_missing:
          tunix_col, vs_tunix = tunix_missing, "n/a"
        else:
          tunix_rate = batch * new / times["tunix"]
          tunix_col, vs_tunix = (
              f"{tunix_rate:,.0f}",
              f"{ours / tunix_rate:.2f}x",
          )
        # With --mesh_shape, each ceiling is the faster of its two layouts.
        decode_s, prefill_s = (
            min(t for name, t in times.items() if name.startswith(part))
            for part in ("decode matmuls", "prefill matmuls")
        )
        if single:
          one_rate = batch * new / times["sampler, one device"]
          layouts.append(
              f"{variant}, batch {batch}, {new} new: sampler {ours:,.0f} tok/s on the mesh, "
              f"{one_rate:,.0f} on one device ({ours / one_rate:.2f}x); matmuls alone "
              f"{batch * new / times['decode matmuls']:,.0f} on the mesh, "
              f"{batch * new / times['decode matmuls, one device']:,.0f} on one device"
          )
        ceiling, all_matmuls = batch * new / decode_s, batch * new / (
            decode_s + prefill_s
        )
        floor_s = (
            decode_s
            + prefill_s
            + cache_bytes_read(cfg, batch, prompt_len, new) / bandwidth
        )
        floor = batch * new / floor_s
        flops = generate_flops(cfg, batch, prompt_len, new)
        hf_fraction = flops / (batch * new / hf) / peak
        print(
            f"| {variant} | {batch} | {new} | {ours:,.0f} | {naive:,.0f} | {hf:,.0f} ({threads}) "
            f"| {tunix_col} | {ceiling:,.0f} | {all_matmuls:,.0f} | {floor:,.0f} "
            f"| {ours / naive:.1f}x | {ours / hf:.2f}x | {vs_tunix} | {ours / ceiling:.2f}x "
            f"| {ours / all_matmuls:.2f}x | {ours / floor:.2f}x "
            f"| {flops / seconds / 1e9:.1f} "
            f"| {100 * flops / seconds / peak:.0f}% | {100 * hf_fraction:.0f}% |",
            flush=True,
        )
  if layouts:
    print(
        f"\nMesh {','.join(_MESH_SHAPE.value)} against one device, timed in the same rounds "
        "(the ceilings above are the faster layout's):"
    )
    for line in layouts:
      print(f"  {line}")
  print(
      "\nDecode attention alone over every layer's full cache (bytes of the cache per second; "
      "the streaming read above is the floor's):"
  )
  for line in reads:
    print(f"  {line}")


if __name__ == "__main__":
  app.run(main)
