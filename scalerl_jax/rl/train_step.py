"""The RL train step: pi_train, advantages, loss, update; pure, and jitted
with its shardings beside it (`jit_train_step`, `host_step`).

`train_step(state, batch, *, spec) -> (state, metrics)`, with the static
choices in a hashable `StepSpec`. The batch (rl/batch.py) is
prompt-major: `tokens_BxS`, `mask_BxS` (1.0 on sampled tokens),
`gen_logp_BxS` and `rewards_PxG`. Over M
microbatches the aggregation's denominators are the whole batch's, so loss,
gradient and metrics equal the whole batch's; with `logprob_chunk` C no pass
holds more than one chunk's [B, C, V] logits (rl/logprobs.py).

Shape letters: the package key (scalerl_jax/__init__.py). Design:
docs/design/rl.md.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Optional

import flax
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec
import ml_collections
import optax

from scalerl_jax import sharding
from scalerl_jax.models import transformer
from scalerl_jax.rl import advantages
from scalerl_jax.rl import batch as batch_lib
from scalerl_jax.rl import logprobs
from scalerl_jax.rl import losses
from scalerl_jax.sampling import selection


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
  microbatches: int = 1  # M: gradient accumulation steps; divides P*G.
  logprob_chunk: int = 0  # C: positions per log-prob chunk; 0 = all at once.

  @classmethod
  def from_config(
      cls,
      config: ml_collections.ConfigDict,
      model: transformer.Transformer,
      optimizer: optax.GradientTransformation,
  ) -> "StepSpec":
    """The step a run's config describes, for `model` and `optimizer`."""
    return cls(
        model=model,
        optimizer=optimizer,
        loss=losses.LossParams.from_config(config.rl),
        adv_norm=config.rl.adv_norm,
        zero_variance_filter=config.rl.zero_variance_filter,
        num_prompts=config.data.prompts_per_step,
        num_generations=config.data.generations_per_prompt,
        temperature=selection.logprob_temperature(config.sampling.temperature),
        microbatches=config.trainer.microbatches,
        logprob_chunk=config.trainer.logprob_chunk,
    )


def init_state(
    params: Any, optimizer: optax.GradientTransformation
) -> TrainState:
  """A fresh TrainState at step 0."""
  return TrainState(
      step=jnp.zeros((), jnp.int32),
      params=params,
      opt_state=optimizer.init(params),
  )


def _masked_mean(x_BxT, mask_BxT):
  return jnp.sum(x_BxT * mask_BxT) / jnp.maximum(jnp.sum(mask_BxT), 1.0)


# Metrics that `_rows_loss` reports as its rows' share of a whole-batch mean
# (summed over microbatches); every other metric is a mean over the rows' loss
# tokens (weighted by them) or a maximum.
_SHARES = ("entropy",)


def _rows_loss(params, rows, counts, gen_tokens, spec):
  """(these rows' share of the batch loss, metrics): all rows or a microbatch.

  `rows`: tokens_BxS, gen_logp_BxS, mask_BxS (dropped groups zeroed),
  gen_mask_BxS (every generated token), adv_B, group_B. `counts` and
  `gen_tokens` are the whole batch's.
  """
  logp_BxS, entropy_BxS = logprobs.policy_logprobs(
      spec.model,
      params,
      rows["tokens_BxS"],
      spec.temperature,
      spec.logprob_chunk,
  )
  mask_BxS = rows["mask_BxS"]
  loss, metrics = losses.compute_loss(
      spec.loss,
      logp_BxS,
      rows["gen_logp_BxS"],
      rows["adv_B"],
      mask_BxS,
      rows["group_B"],
      spec.num_prompts,
      counts=counts,
  )
  # Entropy over every generated token, the groups zero-variance filtering
  # dropped included: a collapse shows in the groups that no longer train.
  metrics["entropy"] = (
      jnp.sum(jax.lax.stop_gradient(entropy_BxS) * rows["gen_mask_BxS"])
      / gen_tokens
  )
  metrics["train_gen_logp_abs_diff"] = _masked_mean(
      jnp.abs(jax.lax.stop_gradient(logp_BxS) - rows["gen_logp_BxS"]), mask_BxS
  )
  return loss, metrics


def _combine_metrics(metrics_M, tokens_M):
  """The whole batch's metrics from its microbatches' ([M] each).

  Every metric is a mean over loss tokens, weighted here by each microbatch's
  tokens, except the maxima, whose names end in `_max` (rl/losses.py), and the
  `_SHARES`, which each microbatch already divided by the whole batch's count.
  """
  total = jnp.maximum(jnp.sum(tokens_M), 1.0)

  def combine(name, v):
    if name.endswith("_max"):
      return jnp.max(v)
    if name in _SHARES:
      return jnp.sum(v)
    return jnp.sum(v * tokens_M) / total

  return {name: combine(name, v) for name, v in metrics_M.items()}


def _accumulate(grad_fn, params, rows, m):
  """The whole batch's (loss, metrics, grads) over M strided microbatches.

  Gradients are summed in float32 and returned in the parameters' dtypes.
  """
  split = lambda x: x.reshape((x.shape[0] // m, m) + x.shape[1:]).swapaxes(0, 1)

  def body(acc, mb):
    (loss, metrics), grads = grad_fn(params, mb)
    acc = jax.tree_util.tree_map(
        lambda a, g: a + g.astype(jnp.float32), acc, grads
    )
    return acc, (loss, metrics, jnp.sum(mb["mask_BxS"]))

  zeros = jax.tree_util.tree_map(
      lambda p: jnp.zeros(p.shape, jnp.float32), params
  )
  acc, (loss_M, metrics_M, tokens_M) = jax.lax.scan(
      body, zeros, jax.tree_util.tree_map(split, rows)
  )
  grads = jax.tree_util.tree_map(lambda a, p: a.astype(p.dtype), acc, params)
  return jnp.sum(loss_M), _combine_metrics(metrics_M, tokens_M), grads


def _tree_norm(tree):
  return optax.global_norm(
      jax.tree_util.tree_map(lambda x: x.astype(jnp.float32), tree)
  )


def loss_and_grads(
    params: Any, batch: dict[str, jax.Array], spec: StepSpec
) -> tuple[jax.Array, dict[str, jax.Array], Any]:
  """(loss, scalar metrics, gradient) of the whole batch, for any M."""
  p, g = spec.num_prompts, spec.num_generations
  mask_BxS = gen_mask_BxS = batch["mask_BxS"].astype(jnp.float32)
  adv_PxG, zero_var_P = advantages.group_advantages(
      batch["rewards_PxG"],
      spec.adv_norm,
      zero_variance_filter=spec.zero_variance_filter,
  )
  if spec.zero_variance_filter:
    mask_BxS = advantages.drop_groups(mask_BxS, zero_var_P)
  group_B = advantages.group_ids(p, g)
  rows = {
      "tokens_BxS": batch["tokens_BxS"],
      "gen_logp_BxS": batch["gen_logp_BxS"],
      "mask_BxS": mask_BxS,
      "gen_mask_BxS": gen_mask_BxS,
      "adv_B": adv_PxG.reshape(p * g),
      "group_B": group_B,
  }
  counts = losses.batch_counts(mask_BxS, group_B, p)
  gen_tokens = jnp.maximum(jnp.sum(gen_mask_BxS), 1.0)
  grad_fn = jax.value_and_grad(
      functools.partial(
          _rows_loss, counts=counts, gen_tokens=gen_tokens, spec=spec
      ),
      has_aux=True,
  )
  if spec.microbatches == 1:
    (loss, metrics), grads = grad_fn(params, rows)
  else:
    loss, metrics, grads = _accumulate(grad_fn, params, rows, spec.microbatches)
  metrics.update(
      zero_variance_frac=jnp.mean(zero_var_P.astype(jnp.float32)),
      loss_tokens=jnp.sum(mask_BxS),
  )
  return loss, metrics, grads


def train_step(
    state: TrainState, batch: dict[str, jax.Array], *, spec: StepSpec
) -> tuple[TrainState, dict[str, jax.Array]]:
  """One optimizer step on a batch of scored completions: (state, metrics).

  A non-finite loss or gradient (`nonfinite` = 1), or a batch without a loss
  token or with a gradient exactly zero (`no_signal` = 1), leaves params and
  optimizer state unchanged; the step counter still advances.
  """
  loss, metrics, grads = loss_and_grads(state.params, batch, spec)
  grad_norm = _tree_norm(grads)
  finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
  # No loss token (zero-variance filtering dropped every group), or a
  # gradient exactly zero (no filter, and every group's rewards equal): no
  # update either; AdamW's momentum and weight decay would move the
  # parameters all the same.
  signal = (metrics["loss_tokens"] > 0) & (grad_norm > 0)
  apply = finite & signal
  # Zeroed gradients keep the optimizer arithmetic finite; the result is
  # discarded below anyway when the step is not applied.
  safe_grads = jax.tree_util.tree_map(lambda x: jnp.where(finite, x, 0), grads)
  updates, opt_state = spec.optimizer.update(
      safe_grads, state.opt_state, state.params
  )
  params = optax.apply_updates(state.params, updates)
  keep = lambda new, old: jax.tree_util.tree_map(
      lambda a, b: jnp.where(apply, a, b), new, old
  )
  new_state = TrainState(
      step=state.step + 1,
      params=keep(params, state.params),
      opt_state=keep(opt_state, state.opt_state),
  )
  metrics.update(
      loss=loss,
      l2_grads=grad_norm,
      l2_params=_tree_norm(new_state.params),
      l2_updates=jnp.where(apply, _tree_norm(updates), 0.0),
      nonfinite=1.0 - finite.astype(jnp.float32),
      no_signal=1.0 - signal.astype(jnp.float32),
  )
  return new_state, metrics


# The jitted step. The state lives where `train_state_shardings` puts it (the
# parameters by their logical axes, the AdamW moments like their parameters,
# counters replicated: FSDP shards the optimizer state too) and is donated,
# so the update writes in place; the batch's rows split over the mesh's
# batch axes. The same function is lowered for a TPU slice by jobs/planner/aot.


def train_state_shardings(
    optimizer, params: Any, param_shardings: Any, mesh: jax.sharding.Mesh
) -> TrainState:
  """Where the TrainState of `params` (arrays or shapes) lives on the mesh.

  The optimizer's moments are sharded like their parameters and its step
  counts replicated (`sharding.opt_state_shardings`), so FSDP shards the
  AdamW state too instead of replicating it on every device.
  """
  replicated = NamedSharding(mesh, PartitionSpec())
  return TrainState(
      step=replicated,
      params=param_shardings,
      opt_state=sharding.opt_state_shardings(
          optimizer, params, param_shardings, replicated
      ),
  )


def init_train_state(
    optimizer, params: Any, param_shardings: Any, mesh: jax.sharding.Mesh
) -> tuple[TrainState, Any]:
  """A fresh TrainState on the mesh, and its shardings.

  `params` are donated: their buffers become the state's parameters, so no
  second copy stays allocated for the whole run (what an undonated copy
  held on a GPU: docs/gpu.md).
  """
  shardings = train_state_shardings(optimizer, params, param_shardings, mesh)
  init = jax.jit(
      functools.partial(init_state, optimizer=optimizer),
      out_shardings=shardings,
      donate_argnums=0,
  )
  return init(params), shardings


def jit_train_step(
    config: ml_collections.ConfigDict,
    model,
    mesh: jax.sharding.Mesh,
    rules: sharding.Rules,
    optimizer,
    state_shardings,
    hbm_budget: Optional[float] = None,
):
  """The jitted train step with explicit shardings and a donated state.

  `hbm_budget` holds the compiled step to that many bytes per chip where the
  compiler takes a limit (TPU: `sharding.hbm_budget_options`); None: none.

  Returns:
    (step, batch_shardings): `step(state, batch)`, to be called (or lowered)
    inside `sharding.activate(mesh, rules)`, and the sharding of each batch
    array. `launch/compile.py` lowers this same function for a TPU slice.
  """
  spec = StepSpec.from_config(config, model, optimizer)
  batch_sh = batch_lib.shardings(mesh, rules)
  step = jax.jit(
      functools.partial(train_step, spec=spec),
      in_shardings=(state_shardings, batch_sh),
      out_shardings=(state_shardings, None),
      donate_argnums=0,
      compiler_options=sharding.hbm_budget_options(
          sharding.platform_of(mesh), hbm_budget
      ),
  )
  return step, batch_sh


def host_step(step, batch_shardings, mesh: jax.sharding.Mesh, rules):
  """`jit_train_step`'s `step` taking host batches (`batch.collate`'s).

  Returns `run(state, host_batch) -> (state, metrics)`, which places the
  batch (`batch.place_batch`) and steps under the mesh's rules.
  """
  divisor = sharding.batch_divisor(mesh, rules)

  def run(state, host_batch):
    batch = batch_lib.place_batch(host_batch, batch_shardings, divisor)
    with sharding.activate(mesh, rules):
      return step(state, batch)

  return run
