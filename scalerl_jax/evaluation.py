"""Validation: mean@k and pass@k of a policy on held-out prompts.

`val/mean_at_k`, the y-axis of every compute-performance curve, comes from
here (the trainer every `trainer.eval_every` steps, `launch/evaluate.py` for
a checkpoint), with `val/<domain>/...` per domain of a mixture.

Design: docs/design/evaluation.md.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import ml_collections
import numpy as np

from scalerl_jax.data import mixture
from scalerl_jax.data import pipeline as pipeline_lib
from scalerl_jax.data import tokenizer as tokenizer_lib
from scalerl_jax.rl.slot_runner import completion_texts
from scalerl_jax.sampling import sampler as sampler_lib
from scalerl_jax.sampling.sampler import Sampler


def validation_key(config: ml_collections.ConfigDict) -> jax.Array:
  """The PRNG key of every validation of a run (trainer's and checkpoint's)."""
  return jax.random.key(config.seed + 2)


def is_eval_step(trainer: ml_collections.ConfigDict, step: int) -> bool:
  """Whether the trainer validates after `step` (> 0): every
  `trainer.eval_every_early` steps up to `trainer.eval_early_until`, every
  `trainer.eval_every` steps, and at the last step."""
  early = trainer.eval_early_until and step <= trainer.eval_early_until
  return (
      step % trainer.eval_every == 0
      or step == trainer.num_steps
      or bool(early and step % trainer.eval_every_early == 0)
  )


def prompts_per_batch(config: ml_collections.ConfigDict, samples: int) -> int:
  """Validation prompts per batch: `trainer.eval_batch_rows` rows, or as many
  as a train step's batch (0)."""
  rows = (
      config.trainer.eval_batch_rows
      or config.data.prompts_per_step * config.data.generations_per_prompt
  )
  return max(1, rows // samples)


def num_slots(config: ml_collections.ConfigDict, batch_divisor: int) -> int:
  """Sampler slots of one validation batch (`batch_divisor`-way sharding)."""
  samples = config.trainer.eval_samples
  return sampler_lib.generate_slots(
      prompts_per_batch(config, samples) * samples, batch_divisor
  )


def evaluate(
    sampler: Sampler,
    params: Any,
    batches: Sequence[pipeline_lib.PromptBatch],
    tok: tokenizer_lib.Tokenizer,
    pool: Any,
    rng: jax.Array,
    version: int = 0,
) -> dict[str, float]:
  """`summarize_domains` of G sampled completions per validation prompt.

  The sampler's temperature is the evaluation's; `batches` come from
  `pipeline.eval_batches`; each batch is verified by `pool` while the next
  decodes. Pass `rng = validation_key(config)` so that repeated evaluations
  of the same parameters agree.
  """
  scores, lengths, truncated, domains, scoring = [], [], [], [], []
  params = sampler.prepare(params)  # Regrouped once for every batch.
  for i, batch in enumerate(batches):
    k = batch.generations_per_prompt
    tokens_BxL, lens_B = batch.expand()
    out = sampler.generate(
        params, tokens_BxL, lens_B, jax.random.fold_in(rng, i), version
    )
    texts = completion_texts(out.tokens, out.prompt_len, out.seq_len, tok)
    records = [record for record in batch.records for _ in range(k)]
    # Batch i is verified while batch i + 1 decodes; scores keep their order.
    scoring.append((pool.submit(texts, records), k))
    lengths.append(out.completion_len)
    truncated.append(out.truncated)
    domains += [mixture.domain_of(record) for record in batch.records]
  for future, k in scoring:
    scores.append(np.asarray(future.result()[0], np.float32).reshape(-1, k))
  return summarize_domains(
      np.concatenate(scores),
      np.concatenate(lengths),
      np.concatenate(truncated),
      domains,
  )


def summarize_domains(
    scores_PxG: np.ndarray,
    lengths_B: np.ndarray,
    truncated_B: np.ndarray,
    domains_P: Sequence[str],
) -> dict[str, float]:
  """`summarize` of all prompts, and as val/<domain>/... of each domain."""
  out = summarize(scores_PxG, lengths_B, truncated_B)
  domains_P = np.asarray(domains_P)
  k = scores_PxG.shape[1]
  for name in sorted(set(domains_P.tolist()) - {""}):
    rows_P = domains_P == name
    rows_B = np.repeat(rows_P, k)
    part = summarize(scores_PxG[rows_P], lengths_B[rows_B], truncated_B[rows_B])
    out.update(
        {f"val/{name}/{key[len('val/'):]}": v for key, v in part.items()}
    )
  return out


def summarize(
    scores_PxG: np.ndarray, lengths_B: np.ndarray, truncated_B: np.ndarray
) -> dict[str, float]:
  """The validation metrics of P prompts' G = k scored samples each.

  Returns val/mean_at_k, val/pass_at_k (prompts with a sample scoring > 0.5),
  val/mean_length (completion tokens), val/truncation_rate, val/num_prompts
  and val/mean_at_k_stderr, the standard error of mean@k from sampling alone
  (prompts held fixed): sqrt(sum_p s_p^2 / k) / P, s_p^2 the unbiased
  variance of prompt p's scores.
  """
  n, k = scores_PxG.shape
  var_P = (
      scores_PxG.astype(np.float64).var(axis=1, ddof=1)
      if k > 1
      else np.zeros(n)
  )
  return {
      "val/mean_at_k": float(scores_PxG.mean()),
      "val/mean_at_k_stderr": float(np.sqrt(var_P.sum() / k) / n),
      "val/pass_at_k": float((scores_PxG.max(axis=1) > 0.5).mean()),
      "val/mean_length": float(np.mean(lengths_B)),
      "val/truncation_rate": float(np.mean(truncated_B)),
      "val/num_prompts": float(n),
  }
