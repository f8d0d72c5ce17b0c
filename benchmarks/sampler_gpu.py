"""The sampler on one accelerator against its HBM floor and transformers.

  python -m benchmarks.sampler_gpu --runs=256x512,64x256 \
      --kernels=plain,pallas
  python -m benchmarks.sampler_gpu --hf_only --hf_rows=64

Random weights of the variant (`--shape`, default qwen3_0.6b), 256-token
random prompts, temperature 1, no EOS (every row makes exactly its new
tokens), a bfloat16 KV cache. For each run ROWSxNEW and decode kernel
(`sampling.decode_attention`), measured in this one run on the same weights:

* tok/s: new tokens over the wall time of `Sampler.generate` on prepared
  weights (prefill and every decode step; best of `--repeats` after a
  compiling call);
* floor: the time to read, on every decode step, the prepared weights once
  and each row's filled cache once, at the copy bandwidth measured here
  (a device copy of 2 GiB, bytes read plus written), plus the prefill's FLOPs
  at the bfloat16 matmul rate measured here. "decode floor" leaves the
  prefill out, as issue 37's first numbers did;
* with `--hf_only`, in a process of its own (a JAX process holds most of the
  GPU's memory): transformers `generate` (bfloat16, sdpa, its KV cache) on
  the same weights (made on the CPU from the same seed) exported with
  `hf_io.save_checkpoint`, `--hf_rows` rows of `--hf_new` tokens;
* the sampler-trainer mismatch: for the first run, the mean and max
  |log pi_gen - log pi_train| over generated tokens, pi_train from
  `policy_logprobs` on the sampled tokens (the trainer's forward), for each
  LM head in `--heads`.
"""

import tempfile
import time

from absl import app
from absl import flags
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import hf_sampling
from benchmarks import timing
from benchmarks.shapes import shape_config
from scalerl_jax import sharding
from scalerl_jax.metrics import compute
from scalerl_jax.models import hf_io
from scalerl_jax.models import model_config
from scalerl_jax.models import transformer
from scalerl_jax.rl import logprobs as logprobs_lib
from scalerl_jax.sampling.sampler import Sampler

_SHAPE = flags.DEFINE_string("shape", "qwen3_0.6b", "Config variant.")
_RUNS = flags.DEFINE_list("runs", ["256x512", "64x256"], "ROWSxNEW.")
_KERNELS = flags.DEFINE_list("kernels", ["plain", "pallas"], "Decode kernels.")
_PROMPT = flags.DEFINE_integer("prompt_len", 256, "Prompt length.")
_REPEATS = flags.DEFINE_integer("repeats", 2, "Timed calls; best is kept.")
_HF_ROWS = flags.DEFINE_integer("hf_rows", 64, "transformers rows; 0: none.")
_HF_NEW = flags.DEFINE_integer("hf_new", 128, "transformers new tokens.")
_HEADS = flags.DEFINE_list(
    "heads", ["bf16_3x", "off"], "LM heads for the mismatch."
)
_MISMATCH = flags.DEFINE_string(
    "mismatch_run", "64x128", "ROWSxNEW of the mismatch runs; '' none."
)
_HF_ONLY = flags.DEFINE_bool(
    "hf_only",
    False,
    "Only transformers (run it in a process of its own: a JAX process holds "
    "most of the GPU's memory). The weights are made on the CPU.",
)
_JSON = flags.DEFINE_string("json", "", "Write the results as JSON here.")


def copy_bytes_per_s(gib: int = 2) -> float:
  """Device copy bandwidth, bytes read plus written per second."""
  x = jnp.ones((gib * 2**28,), jnp.float32)
  copy = jax.jit(lambda x: x + 1)
  jax.block_until_ready(copy(x))
  return 2 * x.nbytes / timing.best_seconds(lambda: copy(x), 5)


def floor_seconds(cfg, prepared, rows, prompt, new, bandwidth, flops):
  """(decode floor, prefill floor) seconds (module docstring)."""
  weights = sum(x.nbytes for x in jax.tree_util.tree_leaves(prepared))
  weights -= prepared["embedding"].nbytes  # Looked up, not read whole.
  itemsize = 2  # bfloat16 cache.
  per_position = cfg.num_layers * 2 * cfg.num_kv_heads * cfg.head_dim
  # Decode step j reads the positions 0 .. prompt + j of its row.
  positions = new * prompt + new * (new + 1) / 2
  cache = rows * per_position * itemsize * positions
  decode = (new * weights + cache) / bandwidth
  prefill = compute.prefill_flops(cfg, [prompt] * rows) / flops
  return decode, prefill


def _config(kernel, head, prompt, new):
  config = shape_config(_SHAPE.value)
  with config.unlocked():
    config.sampling.max_prompt_len = prompt
    config.sampling.max_new_tokens = new
    config.sampling.decode_attention = kernel
    config.sampling.interruption.enabled = False
    config.sampling.kv_cache_dtype = "bfloat16"
    config.model.fp32_lm_head = head != "off"
    if head != "off":
      config.model.lm_head_algorithm = head
  return config


def _prompts(cfg, rows, prompt):
  rng = np.random.RandomState(rows)
  return rng.randint(1, cfg.vocab_size, (rows, prompt)), np.full(rows, prompt)


def _hf_tokens_per_s(params, cfg, rows, prompt, new) -> float:
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top

  hf_dir = tempfile.mkdtemp(prefix="sampler_gpu_")
  hf_io.save_checkpoint(params, cfg, hf_dir)
  model = (
      transformers.AutoModelForCausalLM.from_pretrained(
          hf_dir, dtype=torch.bfloat16, attn_implementation="sdpa"
      )
      .cuda()
      .eval()
  )
  prompts, _ = _prompts(cfg, rows, prompt)
  ids = torch.from_numpy(prompts.astype(np.int64)).cuda()
  kwargs = hf_sampling.kwargs(torch.ones_like(ids))
  with torch.inference_mode():
    model.generate(ids, max_new_tokens=4, min_new_tokens=4, **kwargs)
    torch.cuda.synchronize()
    start = time.perf_counter()
    model.generate(ids, max_new_tokens=new, min_new_tokens=new, **kwargs)
    torch.cuda.synchronize()
  return rows * new / (time.perf_counter() - start)


def mismatch(config, mesh, rules, params, rows) -> dict[str, float]:
  """|log pi_gen - log pi_train| over generated tokens (module docstring)."""
  cfg = model_config.ModelConfig.from_config(config.model)
  model = transformer.Transformer(cfg)
  sampler = Sampler.from_config(config, mesh, rules, eos_ids=(), pad_id=0)
  prompts, lens = _prompts(cfg, rows, config.sampling.max_prompt_len)
  out = sampler.generate(params, prompts, lens, jax.random.key(1))
  logprobs = jax.jit(logprobs_lib.policy_logprobs, static_argnums=(0, 3, 4))
  tokens = np.asarray(out.tokens)
  with sharding.activate(mesh, rules):
    # Eight rows at a time, as a train microbatch: one chunk's float32 logits
    # of every row at once would not fit beside the sampler.
    train_logp = np.concatenate(
        [
            np.asarray(
                logprobs(
                    model,
                    params,
                    tokens[i : i + 8],
                    1.0,
                    config.trainer.logprob_chunk,
                )[0]
            )
            for i in range(0, len(tokens), 8)
        ]
    )
  mask = np.asarray(out.mask)
  diff = np.abs(np.asarray(out.gen_logp) - train_logp)[mask]
  return {"mean": float(diff.mean()), "max": float(diff.max())}


def hf_main():
  config = _config("plain", "bf16_3x", _PROMPT.value, _HF_NEW.value)
  cfg = model_config.ModelConfig.from_config(config.model)
  with jax.default_device(jax.devices("cpu")[0]):
    params = transformer.Transformer(cfg).init(
        jax.random.key(0), jnp.zeros((1, 1), jnp.int32)
    )["params"]
    params = nn.unbox(params)
  hf = _hf_tokens_per_s(
      params, cfg, _HF_ROWS.value, _PROMPT.value, _HF_NEW.value
  )
  print(
      f"transformers generate, {_HF_ROWS.value} rows x {_HF_NEW.value} new: "
      f"{hf:.0f} tok/s"
  )
  timing.write_json(_JSON.value, {"hf_tok_s": hf, "rows": _HF_ROWS.value})


def main(argv):
  del argv
  if _HF_ONLY.value:
    return hf_main()
  bandwidth = copy_bytes_per_s()
  flops = timing.matmul_flops_per_s()
  prompt = _PROMPT.value
  device = jax.devices()[0].device_kind
  print(
      f"device: {device}  copy {bandwidth / 1e12:.2f} TB/s  bf16 matmul "
      f"{flops / 1e12:.0f} TFLOP/s"
  )
  print(
      "| rows x new | kernel | tok/s | floor tok/s | vs floor | decode floor "
      "tok/s | vs decode floor | compile s |"
  )
  print("|---|---|---|---|---|---|---|---|")
  results = {"device": device, "copy_tbps": bandwidth / 1e12, "runs": []}
  # Every variant below differs in sampling and head fields only: one mesh.
  base = _config("plain", "bf16_3x", prompt, 1)
  mesh = sharding.make_mesh(base.mesh)
  rules = sharding.logical_rules(base.mesh)
  params, _ = sharding.init_model_params(
      transformer.Transformer(model_config.ModelConfig.from_config(base.model)),
      jax.random.key(0),
      mesh,
      rules,
  )
  for run in filter(None, _RUNS.value):
    rows, new = map(int, run.split("x"))
    for kernel in _KERNELS.value:
      config = _config(kernel, "bf16_3x", prompt, new)
      cfg = model_config.ModelConfig.from_config(config.model)
      sampler = Sampler.from_config(config, mesh, rules, eos_ids=(), pad_id=0)
      prepared = sampler.prepare(params)
      prompts, lens = _prompts(cfg, rows, prompt)
      start = time.perf_counter()
      jax.block_until_ready(
          sampler.generate(prepared, prompts, lens, jax.random.key(0)).tokens
      )
      compile_s = time.perf_counter() - start
      seconds = timing.best_seconds(
          lambda: sampler.generate(
              prepared, prompts, lens, jax.random.key(0)
          ).tokens,
          _REPEATS.value,
          warm=False,  # The first call above compiled and ran it.
      )
      decode, prefill = floor_seconds(
          cfg, prepared.weights, rows, prompt, new, bandwidth, flops
      )
      tok = rows * new
      row = {
          "rows": rows,
          "new": new,
          "kernel": sampler.settings.decode_attention,
          "tok_s": tok / seconds,
          "floor_tok_s": tok / (decode + prefill),
          "decode_floor_tok_s": tok / decode,
          "first_call_s": compile_s,
      }
      results["runs"].append(row)
      print(
          f"| {rows} x {new} | {row['kernel']} | {row['tok_s']:.0f} | "
          f"{row['floor_tok_s']:.0f} | "
          f"{row['tok_s'] / row['floor_tok_s']:.2f} | "
          f"{row['decode_floor_tok_s']:.0f} | "
          f"{row['tok_s'] / row['decode_floor_tok_s']:.2f} | {compile_s:.0f} |",
          flush=True,
      )
      sampler = prepared = None  # Freed before the next run compiles.
  if _MISMATCH.value:
    rows, new = map(int, _MISMATCH.value.split("x"))
    results["mismatch"] = {}
    for head in _HEADS.value:
      got = mismatch(
          _config("auto", head, prompt, new), mesh, rules, params, rows
      )
      results["mismatch"][head] = got
      print(
          f"sampler-trainer |logp diff|, head {head}: mean {got['mean']:.2e} "
          f"max {got['max']:.2e}",
          flush=True,
      )
  timing.write_json(_JSON.value, results)


if __name__ == "__main__":
  app.run(main)
