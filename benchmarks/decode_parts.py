"""What the decode step's parts cost the sampler: the sampler
with parts taken out.

  python -m benchmarks.decode_parts --batch_sizes=64 --repeats=7
  python -m benchmarks.decode_parts --variants=small_cpu --batch_sizes=64 \
      --new_tokens=64

For each model, batch size and completion length (the flags of
benchmarks/sampler.py: --variants, --batch_sizes, --new_tokens, --prompt_len,
--repeats), on the same weights and prompts, timed in alternation (best of
`--repeats` rounds):

* sampler: `Sampler.generate` as shipped;
* no decode attention: the same sampler with the decode step's attention
  (T = 1 in `decode.forward`) replaced by a pass-through of the queries, so
  no step reads the KV cache. The prefill keeps its attention, and the cache
  is still written;
* no decode attention, no cache writes: also without the decode step's
  writes of its keys and values;
* matmuls alone and all matmuls: the ceilings of benchmarks/sampler.py (the
  decode step's weight matmuls, and those plus the prefill's).

The two ablations are not samplers (their tokens are wrong; the run checks
that they differ from the sampler's, i.e. that the substitution took effect).
They bound what any change to the parts they remove can buy: a sampler whose
decode attention costs nothing, with XLA's code for the rest of the step, is
no faster than "no decode attention". Each ablated sampler is its own
`Sampler`, compiled while the part is substituted in
`scalerl_jax.models.decode`.
"""

import contextlib
import functools
import itertools

from absl import app
from absl import flags
import jax
import numpy as np

from benchmarks import sampler as sampler_bench
from benchmarks.shapes import shape_config
from scalerl_jax import sharding
from scalerl_jax.models import decode
from scalerl_jax.models import kv_cache
from scalerl_jax.models.model_config import ModelConfig
from scalerl_jax.models.transformer import Transformer
from scalerl_jax.sampling.sampler import Sampler

# The flags of benchmarks/sampler.py: --variants, --batch_sizes, --new_tokens,
# --prompt_len and --repeats mean the same here (its other flags are unused).
FLAGS = flags.FLAGS

_ORIGINAL = {"attention": decode.attention, "_write_rows": kv_cache.write_rows}  # pylint: disable=protected-access


def _no_decode_attention(q_BxTxKxQxE, keys, values, visible, dtype, **kw):
  if q_BxTxKxQxE.shape[1] != 1:  # The prefill.
    return _ORIGINAL["attention"](
        q_BxTxKxQxE, keys, values, visible, dtype, **kw
    )
  return q_BxTxKxQxE


def _no_decode_writes(cache, update, start, axis):
  if update.shape[axis] != 1:  # The prefill.
    return _ORIGINAL["_write_rows"](cache, update, start, axis)
  return cache


ABLATIONS = {
    "sampler": {},
    "no decode attention": {"attention": _no_decode_attention},
    "no decode attention, no cache writes": {
        "attention": _no_decode_attention,
        "_write_rows": _no_decode_writes,
    },
}


@contextlib.contextmanager
def substituted(parts):
  try:
    for name, fn in parts.items():
      setattr(decode, name, fn)
    yield
  finally:
    for name, fn in _ORIGINAL.items():
      setattr(decode, name, fn)


def main(argv):
  del argv
  prompt_len = FLAGS.prompt_len
  names = list(ABLATIONS)
  header = (
      "| model | batch | new | "
      + " | ".join(f"{n} tok/s" for n in names)
      + " | matmuls alone tok/s | all matmuls tok/s | "
      + " | ".join(f"{n} / matmuls alone" for n in names)
      + " |"
  )
  print(f"devices: {jax.devices()}  {prompt_len}-token prompts\n")
  print(header)
  print("|" + "---|" * (header.count("|") - 1))
  for variant in FLAGS.variants:
    config = shape_config(variant)
    cfg = ModelConfig.from_config(config.model)
    mesh = sharding.make_mesh(config.mesh)
    rules = sharding.logical_rules(config.mesh)
    params, _ = sharding.init_model_params(
        Transformer(cfg), jax.random.key(0), mesh, rules
    )
    for batch, new in itertools.product(
        map(int, FLAGS.batch_sizes), map(int, FLAGS.new_tokens)
    ):
      prompts, lens = sampler_bench.bench_prompts(cfg, batch, prompt_len)
      config.sampling.max_prompt_len = prompt_len
      config.sampling.max_new_tokens = new
      timed, tokens = {}, {}
      for name, parts in ABLATIONS.items():
        sampler = Sampler.from_config(config, mesh, rules, eos_ids=(), pad_id=0)
        # Every program this sampler runs is compiled here.
        with substituted(parts):
          tokens[name] = sampler.generate(
              params, prompts, lens, jax.random.key(1)
          ).tokens
        timed[name] = functools.partial(
            lambda s, *args: s.generate(*args).tokens,
            sampler,
            params,
            prompts,
            lens,
            jax.random.key(1),
        )
      for name in names[1:]:
        if np.array_equal(tokens[name], tokens["sampler"]):
          raise RuntimeError(
              f"{name!r} made the sampler's tokens: the substitution in "
              "scalerl_jax.models.decode no longer reaches the decode step"
          )
      timed.update(
          sampler_bench._matmul_ceiling_programs(  # pylint: disable=protected-access
              cfg, batch, prompt_len, new
          )
      )
      times = sampler_bench._best_times(timed, FLAGS.repeats)  # pylint: disable=protected-access
      tokens_made = batch * new
      ceiling = tokens_made / times["decode matmuls"]
      all_matmuls = tokens_made / (
          times["decode matmuls"] + times["prefill matmuls"]
      )
      rates = [tokens_made / times[n] for n in names]
      print(
          f"| {variant} | {batch} | {new} | "
          + " | ".join(f"{r:,.0f}" for r in rates)
          + f" | {ceiling:,.0f} | {all_matmuls:,.0f} | "
          + " | ".join(f"{r / ceiling:.2f}x" for r in rates)
          + " |",
          flush=True,
      )


if __name__ == "__main__":
  app.run(main)
