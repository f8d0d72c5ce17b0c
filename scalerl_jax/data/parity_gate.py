"""The parity task's base gate: is a warm-started base one that RL can lift?

A base of the parity task (data/parity_task.py) is usable only if it has
learned the chain: with the chain forced, every token it writes greedily is
right, and it still chooses between the chain and a direct answer at the
token after `<think> `. The chain is learned in a sudden drop at a step that
varies with the seed (docs/parity_task.md), so a warm start can end before
it; this module measures, teacher forced on held-out (`val`) problems:

- `chain_exact/<level>`: the fraction of problems whose whole chain (from the
  first digit's successor to EOS) is the argmax at every position, i.e.
  greedy decoding from the forced first digit writes the chain exactly
  (argmax == target at every position is greedy decoding's induction);
- `p_chain/<level>`: the mean probability of not closing the thinking at
  the decision position (`</think>` starts the direct answer), the base's
  chance of taking the chain.

`check` compares them with a registered gate (a plan's `base_gate`).

Shape letters: X problems, S positions, V vocabulary.
"""

from __future__ import annotations

from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from scalerl_jax.data import parity_task
from scalerl_jax.data import pipeline
from scalerl_jax.data import tokenizer as tokenizer_lib

# Tokens of a chain before its first digit: `<think>` and ` `
# (parity_task.CHAIN_FIXED_TOKENS).
_BEFORE_FIRST_DIGIT = 2


def chain_examples(
    problems, tok: tokenizer_lib.Tokenizer
) -> tuple[np.ndarray, np.ndarray]:
  """tokens_XxS (prompt, chain, EOS; right-padded) and each row's decision
  position (the index of the chain's first digit)."""
  rows, decisions = [], []
  for p in problems:
    prompt = pipeline.prompt_ids(tok, parity_task.prompt_text(p))
    chain = tok.encode(parity_task.chain_text(p)) + [tok.eos_id]
    rows.append(prompt + chain)
    decisions.append(len(prompt) + _BEFORE_FIRST_DIGIT)
  tokens = np.full((len(rows), max(map(len, rows))), tok.pad_id, np.int32)
  for i, r in enumerate(rows):
    tokens[i, : len(r)] = r
  return tokens, np.asarray(decisions, np.int32)


def measure(
    model: Any,
    params: Any,
    tok: tokenizer_lib.Tokenizer,
    levels=parity_task.LEVELS,
    per_level: int = 200,
    seed: int = 0,
) -> dict[str, float]:
  """`chain_exact/<level>` and `p_chain/<level>` of `params` on up to
  `per_level` `val` problems of each level (level 1 holds fewer)."""
  out = {}
  for level in levels:
    problems = parity_task.parity_problems((level,), per_level, seed, "val")
    tokens_XxS, decision_X = chain_examples(problems, tok)
    logits_XxSxV = model.apply({"params": params}, jnp.asarray(tokens_XxS))
    logits_XxSxV = np.asarray(logits_XxSxV[:, :-1], np.float32)
    targets_XxS = tokens_XxS[:, 1:]
    argmax_ok_XxS = logits_XxSxV.argmax(-1) == targets_XxS
    # Position s predicts token s + 1; the decision predicts the first digit.
    pos_S = np.arange(targets_XxS.shape[1])
    after_X = (pos_S[None] >= decision_X[:, None]) & (targets_XxS != tok.pad_id)
    exact_X = np.all(argmax_ok_XxS | ~after_X, axis=1)
    rows = np.arange(len(problems))
    at_decision_XxV = jax.nn.log_softmax(logits_XxSxV[rows, decision_X - 1])
    p_direct_X = np.exp(np.asarray(at_decision_XxV)[:, tok.end_think_id])
    out[f"chain_exact/{level}"] = float(exact_X.mean())
    out[f"p_chain/{level}"] = float(np.mean(1.0 - p_direct_X))
  return out


def check(
    measured: Mapping[str, float], gate: Mapping[str, float]
) -> list[str]:
  """The gate's failures (empty: the base passes). `gate` holds
  `min_chain_exact` and `p_chain_range` (low, high), applied to each of its
  `levels`."""
  failures = []
  low, high = gate["p_chain_range"]
  for name, value in sorted(measured.items()):
    kind, level = name.split("/")
    if int(level) not in gate["levels"]:
      continue
    if kind == "chain_exact" and value < gate["min_chain_exact"]:
      failures.append(
          f"level {level}: greedy chain exact on {value:.3f} of problems, "
          f"below {gate['min_chain_exact']}"
      )
    if kind == "p_chain" and not low <= value <= high:
      failures.append(
          f"level {level}: P(chain) {value:.3f} outside [{low}, {high}]"
      )
  return failures
