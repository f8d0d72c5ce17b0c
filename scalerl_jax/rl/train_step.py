"""The jitted RL train step: recompute pi_train, advantages, loss, update (pure).

`train_step(state, batch, *, spec) -> (state, metrics)` is a pure function of
arrays; the static choices (model, optimizer, loss, normalisation) live in a
hashable `StepSpec` bound with `functools.partial` before `jax.jit`.

Batch layout (prompt-major: rows i*G .. i*G+G-1 are the G completions of
prompt i). Every per-token array is indexed by the position of the token it
describes, prompt at 0 .. len-1 and the completion right after it:
  tokens_BxS   int32, prompt + completion, right-padded
  mask_BxS     1.0 on tokens the generator sampled (loss tokens), else 0
  gen_logp_BxS generator log-prob of each sampled token, 0 elsewhere
  rewards_PxG  float32 reward of every completion

Shape letters: B = P*G completions, S sequence length, P prompts, G
generations per prompt, V vocabulary.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax
import jax
import jax.numpy as jnp
import optax

from scalerl_jax.models import transformer
from scalerl_jax.rl import advantages, losses


@flax.struct.dataclass
class TrainState:
  """Everything the optimizer loop carries between steps (on the mesh)."""
  step: jax.Array  # int32 scalar: train steps taken (= policy version).
  params: Any
  opt_state: Any


@dataclasses.dataclass(frozen=True)
class StepSpec:
  """Static description of a train step (hashable)."""
  model: transformer.Transformer
  optimizer: optax.GradientTransformation
  loss: losses.LossParams
  adv_norm: str  # prompt | batch | none
  zero_variance_filter: bool
  num_prompts: int  # P
  num_generations: int  # G
  temperature: float  # Sampling temperature; pi_train is taken at the same one.


def init_state(params: Any, optimizer: optax.GradientTransformation) -> TrainState:
  """A fresh TrainState at step 0."""
  return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                    opt_state=optimizer.init(params))


def _masked_mean(x_BxT, mask_BxT):
  return jnp.sum(x_BxT * mask_BxT) / jnp.maximum(jnp.sum(mask_BxT), 1.0)


def policy_logprobs(model: transformer.Transformer, params: Any, tokens_BxS: jax.Array,
                    temperature: float) -> tuple[jax.Array, jax.Array]:
  """pi_train log-probs and entropies of every token given its prefix.

  Returns:
    (logp_BxS, entropy_BxS), float32; position 0 (no prefix) holds 0.
  """
  logits_BxTxV = model.apply({"params": params}, tokens_BxS[:, :-1])
  logits_BxTxV = logits_BxTxV.astype(jnp.float32) / temperature
  logp_BxT = transformer.token_logprobs(logits_BxTxV, tokens_BxS[:, 1:])
  logp_all = jax.nn.log_softmax(logits_BxTxV, axis=-1)
  entropy_BxT = -jnp.sum(jnp.exp(logp_all) * logp_all, axis=-1)
  pad = jnp.zeros((tokens_BxS.shape[0], 1), jnp.float32)
  return (jnp.concatenate([pad, logp_BxT], axis=1),
          jnp.concatenate([pad, entropy_BxT], axis=1))


def _tree_norm(tree):
  return optax.global_norm(jax.tree_util.tree_map(lambda x: x.astype(jnp.float32), tree))


def train_step(state: TrainState, batch: dict[str, jax.Array], *,
               spec: StepSpec) -> tuple[TrainState, dict[str, jax.Array]]:
  """One optimizer step on a batch of scored completions.

  A non-finite loss or gradient leaves params and optimizer state unchanged
  (the step counter still advances) and reports `nonfinite` = 1.

  Args:
    state: the current TrainState.
    batch: the arrays described in the module docstring.
    spec: static choices (bound with functools.partial before jit).

  Returns:
    (new state, dict of scalar metrics).
  """
  p, g = spec.num_prompts, spec.num_generations
  mask_BxS = batch["mask_BxS"].astype(jnp.float32)
  adv_PxG, zero_var_P = advantages.group_advantages(
      batch["rewards_PxG"], spec.adv_norm, zero_variance_filter=spec.zero_variance_filter)
  if spec.zero_variance_filter:
    mask_BxS = advantages.drop_groups(mask_BxS, zero_var_P)
  group_B = advantages.group_ids(p, g)
  tis = spec.loss.tis_cap > 0

  def loss_fn(params):
    logp_BxS, entropy_BxS = policy_logprobs(spec.model, params, batch["tokens_BxS"],
                                            spec.temperature)
    # One update per batch, so the trainer's own old-policy log-probs are its
    # current ones (held constant); TIS then corrects the generator mismatch.
    old = jax.lax.stop_gradient(logp_BxS) if tis else None
    loss, metrics = losses.compute_loss(
        spec.loss, logp_BxS, batch["gen_logp_BxS"], adv_PxG.reshape(p * g), mask_BxS,
        group_B, p, old_logp_BxS=old)
    metrics["entropy"] = _masked_mean(jax.lax.stop_gradient(entropy_BxS), mask_BxS)
    metrics["train_gen_logp_abs_diff"] = _masked_mean(
        jnp.abs(jax.lax.stop_gradient(logp_BxS) - batch["gen_logp_BxS"]), mask_BxS)
    return loss, metrics

  (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
  grad_norm = _tree_norm(grads)
  finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
  # Zeroed gradients keep the optimizer arithmetic finite; the result is
  # discarded below anyway when the step is not finite.
  safe_grads = jax.tree_util.tree_map(lambda x: jnp.where(finite, x, 0), grads)
  updates, opt_state = spec.optimizer.update(safe_grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  keep = lambda new, old: jax.tree_util.tree_map(lambda a, b: jnp.where(finite, a, b), new, old)
  new_state = TrainState(step=state.step + 1, params=keep(params, state.params),
                         opt_state=keep(opt_state, state.opt_state))
  metrics.update(
      loss=loss, l2_grads=grad_norm, l2_params=_tree_norm(new_state.params),
      l2_updates=jnp.where(finite, _tree_norm(updates), 0.0),
      nonfinite=1.0 - finite.astype(jnp.float32),
      zero_variance_frac=jnp.mean(zero_var_P.astype(jnp.float32)),
      loss_tokens=jnp.sum(mask_BxS))
  return new_state, metrics
