"""Supervised warm start: the base policy of the built-in experiment.

Without `model.hf_path`, a short supervised phase on the built-in sources'
worked solutions gives the base policy for RL. The result is cached (orbax)
in `cache_dir`, keyed by a hash of every config field that shapes it, and
reused by later runs, resumes and sweep points sharing those settings.

Design: docs/design/warm_start.md.

Shape letters: the package key (scalerl_jax/__init__.py), and X examples.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
from typing import Any, Optional

from absl import logging
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import orbax.checkpoint as ocp

from scalerl_jax import warm_steps
from scalerl_jax import workdir as workdir_lib
from scalerl_jax.data import builtin_code
from scalerl_jax.data import builtin_task
from scalerl_jax.data import mixture
from scalerl_jax.data import parity_gate
from scalerl_jax.data import parity_task
from scalerl_jax.data import pipeline
from scalerl_jax.data import search_task
from scalerl_jax.data import tokenizer as tokenizer_lib
from scalerl_jax.models import lm_head
from scalerl_jax.models import transformer


def _own_warm_split(prompts):
  """Training records of a task that warm-starts on its own `warm` split, kept
  apart from the RL (`train`) and validation prompts: `prompts(levels, None,
  seed, "warm")` (every warm problem of the search task, WARM_PER_LEVEL a
  level of the parity task)."""

  def records(levels, num, seed, split):
    del num, split
    return prompts(levels, None, seed, "warm")

  return records


# Sources that warm-start on their own `warm` split -> their prompt records
# (levels, num, seed, split): data.builtin_num_train leaves their base alone.
_OWN_SPLIT = {
    search_task.SOURCE: search_task.search_prompts,
    parity_task.SOURCE: parity_task.parity_prompts,
}
# Sources with worked solutions -> their training records
# (levels, num, seed, split).
_WORKED = {
    builtin_task.SOURCE: builtin_task.builtin_prompts,
    builtin_code.SOURCE: builtin_code.code_prompts,
    **{source: _own_warm_split(p) for source, p in _OWN_SPLIT.items()},
}
# Sources whose targets are drawn per record by the task.
_DRAWN_TARGETS = (search_task.SOURCE, parity_task.SOURCE)


def max_new_tokens(config: ml_collections.ConfigDict) -> int:
  """Completion tokens of a warm-start target: trainer.warm_start_max_new_tokens
  or, when that is 0, sampling.max_new_tokens."""
  return (
      config.trainer.warm_start_max_new_tokens or config.sampling.max_new_tokens
  )


def cache_dir(
    config: ml_collections.ConfigDict, workdir: str, vocab_size: int
) -> str:
  """`<trainer.warm_start_dir or workdir/BASE_POLICY_DIR>/<fingerprint>`."""
  root = config.trainer.warm_start_dir or os.path.join(
      workdir, workdir_lib.BASE_POLICY_DIR
  )
  return os.path.join(os.path.abspath(root), fingerprint(config, vocab_size))


def base_seed(config: ml_collections.ConfigDict) -> int:
  """Seed of the base policy's init, warm-start data order and slips.

  `trainer.warm_start_seed`, or `config.seed` when that is -1.
  """
  seed = config.trainer.warm_start_seed
  return config.seed if seed < 0 else seed


# What `trainer.warm_start_float32` sets in the warm start's model.
FLOAT32_BASE = {"compute_dtype": "float32", "fp32_lm_head": True}


def base_model(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """`config.model` as the warm start computes with it: float32 with the FP32
  head under `trainer.warm_start_float32`, else the run's own precision."""
  model = config.model.to_dict()
  if config.trainer.warm_start_float32:
    model.update(FLOAT32_BASE)
  return model


def fingerprint(config: ml_collections.ConfigDict, vocab_size: int) -> str:
  """Hash of everything the warm-started parameters depend on."""
  relevant = {
      "model": base_model(config),
      "seed": base_seed(config),
      "difficulty": list(config.data.builtin_difficulty),
      "steps": config.trainer.warm_start_steps,
      "lr": config.trainer.warm_start_lr,
      "batch": config.trainer.warm_start_batch,
      "vocab": vocab_size,
      "slip_prob": config.trainer.warm_start_slip_prob,
      "answer_slip_prob": config.trainer.warm_start_answer_slip_prob,
      "max_len": config.sampling.max_prompt_len + max_new_tokens(config),
  }
  # Absent at 0, so that bases from before the field stay valid.
  if config.trainer.warm_start_weight_decay:
    relevant["weight_decay"] = config.trainer.warm_start_weight_decay
  # The RL prompt pool's size shapes the base only where the warm start
  # draws from it.
  if config.data.source not in _OWN_SPLIT:
    relevant["num_train"] = config.data.builtin_num_train
  # Absent for one source, so that its caches stay valid.
  if mixture.names(config):
    relevant["mixture"] = config.data.mixture.to_dict()
  if config.data.source in _DRAWN_TARGETS:
    relevant["source"] = config.data.source
  if config.data.source == parity_task.SOURCE:
    relevant["task"] = parity_task.WARM_SETTINGS
    # Absent at 0, so that bases from before the field stay valid.
    if config.trainer.warm_start_skip_prob:
      relevant["skip_prob"] = config.trainer.warm_start_skip_prob
    if config.trainer.warm_start_chain_first_steps:
      relevant["chain_first"] = config.trainer.warm_start_chain_first_steps
    # Absent at 0, as above.
    if config.trainer.warm_start_chain_loss_target:
      relevant["chain_until"] = [
          config.trainer.warm_start_chain_loss_target,
          config.trainer.warm_start_chain_max_steps,
      ]
    # Absent at the default, as above.
    if config.trainer.warm_start_chain_rate != warm_steps.CHAIN_RATES[0]:
      relevant["chain_rate"] = config.trainer.warm_start_chain_rate
  return hashlib.sha256(
      json.dumps(relevant, sort_keys=True, default=str).encode()
  ).hexdigest()[:16]


def supervised_examples(
    records,
    tok: tokenizer_lib.Tokenizer,
    seq_len: int,
    slip_prob: float = 0.0,
    rng: Optional[np.random.Generator] = None,
    answer_slip_prob: float = 0.0,
    skip_prob: float = 0.0,
    chain_first: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
  """Prompt + worked solution + EOS per record, cut to `seq_len`.

  `slip_prob` is the chance of a wrong value at each rewrite of a solution
  (`builtin_task.Problem.steps`), `answer_slip_prob` that its Answer line
  misstates the value reached, `skip_prob` that a parity chain leaves out an
  even digit; `rng` draws the slips, the search task's guesses and the
  parity task's chains (needed for those tasks or when a probability is
  > 0). Returns tokens_XxS int32 (right-padded with pad_id) and mask_XxS
  float32, 1 where token t is part of the solution (predicted from t - 1).
  """
  tokens = np.full((len(records), seq_len), tok.pad_id, np.int32)
  mask = np.zeros((len(records), seq_len), np.float32)
  for i, record in enumerate(records):
    prompt = pipeline.prompt_ids(tok, record["prompt"])
    # A program slips as an Answer line does.
    if record["source"] == builtin_code.SOURCE:
      text = builtin_code.target_text(record, answer_slip_prob, rng)
    elif record["source"] == search_task.SOURCE:
      # Guesses in a fresh random order: the base learns to guess uniformly.
      text = search_task.target_text(record, rng)
    elif record["source"] == parity_task.SOURCE:
      # The chain (with its skips) or a guessed direct answer.
      text = parity_task.target_text(record, rng, skip_prob, i < chain_first)
    else:
      text = builtin_task.target_text(record, slip_prob, rng, answer_slip_prob)
    target = tok.encode(text) + [tok.eos_id]
    ids = (prompt + target)[:seq_len]
    tokens[i, : len(ids)] = ids
    mask[i, len(prompt) : len(ids)] = 1.0
  return tokens, mask


def _sft_step(params, opt_state, tokens_BxS, mask_BxS, *, model, optimizer):
  def loss_fn(p):
    logits = model.apply({"params": p}, tokens_BxS[:, :-1])
    logp = lm_head.token_logprobs(logits, tokens_BxS[:, 1:])
    m = mask_BxS[:, 1:]
    return -jnp.sum(logp * m) / jnp.maximum(jnp.sum(m), 1.0)

  loss, grads = jax.value_and_grad(loss_fn)(params)
  updates, opt_state = optimizer.update(grads, opt_state, params)
  return optax.apply_updates(params, updates), opt_state, loss


def _domain_configs(
    config: ml_collections.ConfigDict, steps: int
) -> list[ml_collections.ConfigDict]:
  """The single-source configs to warm-start on: the run's, or each domain's.

  Raises ValueError for a source without worked solutions.
  """
  configs = [
      mixture.domain_config(config, name) for name in mixture.names(config)
  ] or [config]
  for sub in configs:
    if sub.data.source not in _WORKED:
      raise ValueError(
          f"trainer.warm_start_steps: {steps}, but a supervised warm start needs worked "
          f"solutions, which only the built-in sources {tuple(_WORKED)} have (got "
          f"{sub.data.source!r}); set model.hf_path to a base checkpoint or "
          "trainer.warm_start_steps=0"
      )
  return configs


def _examples(
    config: ml_collections.ConfigDict,
    configs: list[ml_collections.ConfigDict],
    tok: tokenizer_lib.Tokenizer,
    plan: warm_steps.Phases,
) -> tuple[np.ndarray, np.ndarray, int]:
  """Every step's rows, drawn before the first step: (tokens_XxS, mask_XxS,
  the number of problems they were drawn from), trimmed to the longest row."""
  records = [
      r
      for sub in configs
      for r in _WORKED[sub.data.source](
          tuple(sub.data.builtin_difficulty),
          sub.data.builtin_num_train,
          base_seed(config),
          "train",
      )
  ]
  seq_len = config.sampling.max_prompt_len + max_new_tokens(config)
  batch = config.trainer.warm_start_batch
  # Every epoch visits the problems in a new order with newly drawn slips, so
  # the policy learns a slip rate, not which problems slip.
  rng = np.random.default_rng(base_seed(config))
  epochs = -(-plan.drawn * batch // len(records))
  order = np.concatenate(
      [rng.permutation(len(records)) for _ in range(epochs)]
  )[: plan.drawn * batch]
  tokens, mask = supervised_examples(
      [records[i] for i in order],
      tok,
      seq_len,
      config.trainer.warm_start_slip_prob,
      rng,
      config.trainer.warm_start_answer_slip_prob,
      config.trainer.warm_start_skip_prob,
      plan.chain_cap * batch,
  )
  used = min(int(np.max(np.nonzero(tokens != tok.pad_id)[1])) + 2, seq_len)
  return tokens[:, :used], mask[:, :used], len(records)


def _save(checkpointer: ocp.StandardCheckpointer, path: str, params: Any):
  """Saves the base at `path`, unless a sweep's other run saved it first."""
  try:
    checkpointer.save(path, params)
    checkpointer.wait_until_finished()
  except (ValueError, FileExistsError, OSError):
    if not os.path.isdir(path):
      raise
    # Another run of the same sweep saved these very settings first.
    logging.info(
        "A base policy for these settings appeared in %s meanwhile", path
    )


def warm_start(
    config: ml_collections.ConfigDict,
    workdir: str,
    model: transformer.Transformer,
    params: Any,
    shardings: Any,
    tok: tokenizer_lib.Tokenizer,
) -> Any:
  """The cached warm-started parameters, training them first if needed.

  `params` are the freshly initialised, sharded starting point; the result
  is placed in `shardings` too. Built-in sources only (`_WORKED`).
  """
  t = config.trainer
  if t.warm_start_steps == 0:
    return params
  configs = _domain_configs(config, t.warm_start_steps)
  path = os.path.join(cache_dir(config, workdir, tok.vocab_size), PARAMS_DIR)
  checkpointer = ocp.StandardCheckpointer()
  phases_path = os.path.join(os.path.dirname(path), PHASES_FILE)
  if os.path.isdir(path):
    logging.info("Reusing the warm-started base policy in %s", path)
    abstract = jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
        params,
        shardings,
    )
    params = checkpointer.restore(path, abstract)
    check_gate(config, workdir, model, params, tok, phases_path)
    return params

  plan = warm_steps.phases(t)
  tokens, mask, num_problems = _examples(config, configs, tok, plan)
  rate = warm_steps.rates(plan, t.warm_start_lr)
  optimizer = warm_steps.optimizer(t, plan, rate)
  if t.warm_start_float32:
    model = transformer.Transformer(
        dataclasses.replace(model.cfg, **FLOAT32_BASE)
    )
  step = jax.jit(
      functools.partial(_sft_step, model=model, optimizer=optimizer),
      donate_argnums=(0, 1),
  )
  opt_state = jax.jit(optimizer.init)(params)
  logging.info(
      "Warm start: %d supervised steps on %d built-in problems (slip probability "
      "%g per rewrite, %g per Answer line)",
      t.warm_start_steps,
      num_problems,
      t.warm_start_slip_prob,
      t.warm_start_answer_slip_prob,
  )
  params, info = warm_steps.run(
      step, params, opt_state, tokens, mask, t.warm_start_batch, plan, rate
  )
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(phases_path, "w") as f:
    json.dump(info, f)
  _save(checkpointer, path, params)
  check_gate(config, workdir, model, params, tok, phases_path)
  return params


GATE_FILE = "base_gate.json"
# Beside a cached base's params: how many chain steps its warm start took and
# their mean loss (warm_steps.run).
PHASES_FILE = "warm_phases.json"
# In a cached base's directory: its parameters (orbax), present once saved.
PARAMS_DIR = "params"


def check_gate(config, workdir, model, params, tok, phases_path="") -> None:
  """Measures the parity base against trainer.base_gate_* (when
  base_gate_min_chain_exact > 0), writes `<workdir>/GATE_FILE` (with the
  warm start's `PHASES_FILE` where `phases_path` holds one), and raises
  ValueError naming every failure: a base that has not learned the chain is
  not one the run's plan admits (data/parity_gate.py)."""
  t = config.trainer
  if not t.base_gate_min_chain_exact:
    return
  measured = parity_gate.measure(model, params, tok)
  gate = {
      "levels": tuple(t.base_gate_levels),
      "min_chain_exact": t.base_gate_min_chain_exact,
      "p_chain_range": tuple(t.base_gate_p_chain_range),
  }
  failures = parity_gate.check(measured, gate)
  record = {
      "base_seed": base_seed(config),
      "gate": gate,
      "measured": measured,
      "passed": not failures,
      "failures": failures,
  }
  if phases_path:
    # The cache directory of these parameters, which a plan's records keep
    # (scalerl_jax/jobs/plan_records.py) so another machine resumes the
    # base's points on the very same parameters.
    record["fingerprint"] = os.path.basename(os.path.dirname(phases_path))
    if os.path.exists(phases_path):
      with open(phases_path) as f:
        record["warm_phases"] = json.load(f)
  with open(os.path.join(workdir, GATE_FILE), "w") as f:
    json.dump(record, f, indent=1, sort_keys=True)
  logging.info("Base gate: %s", json.dumps(record, sort_keys=True))
  if failures:
    raise ValueError(
        f"the base of warm-start seed {base_seed(config)} fails its gate "
        f"(trainer.base_gate_*): {'; '.join(failures)}"
    )
