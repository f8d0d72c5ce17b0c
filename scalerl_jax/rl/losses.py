"""RL objectives (ScaleRL paper §3) and their aggregation (§4), pure.

A loss in `LOSSES` maps `(logp_BxS, ref_logp_BxS, adv_B, mask_BxS,
**hparams)` to the per-token objective `obj_BxS` the policy ascends (0 on
masked tokens) and scalar metrics; rho = pi_train / pi_gen, the reference
being the generator. Its hyperparameters are its keyword-only arguments,
named as the `config.rl` fields that hold them. `compute_loss` averages the
objective by an aggregation in `AGGREGATIONS`, negates it, and applies
truncated IS, sg(min(1, C / rho)), when `rl.tis_cap` C > 0.

Shape letters: the package key (scalerl_jax/__init__.py).
Design (TIS against the generator, the metrics): docs/design/rl.md.
"""

import dataclasses
import inspect
from typing import Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import ml_collections

from scalerl_jax import registry

Metrics = dict[str, jax.Array]
LossFn = Callable[..., tuple[jax.Array, Metrics]]


LOSSES: registry.Registry[LossFn] = registry.Registry("rl.loss")


def _hparams(loss: LossFn) -> tuple[str, ...]:
  """A loss's keyword-only argument names: the `config.rl` fields it reads."""
  params = inspect.signature(loss).parameters.values()
  return tuple(
      p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY
  )


def _token_mean(x_BxS: jax.Array, mask_BxS: jax.Array) -> jax.Array:
  total = jnp.sum(jnp.where(mask_BxS, x_BxS, 0.0))
  return total / jnp.maximum(jnp.sum(mask_BxS), 1)


def _ratio_stats(
    ratio_BxS: jax.Array, mask_BxS: jax.Array, prefix: str = ""
) -> Metrics:
  ratio_BxS = jax.lax.stop_gradient(ratio_BxS)
  return {
      f"{prefix}ratio_mean": _token_mean(ratio_BxS, mask_BxS),
      # Ratios are positive, so 0 stands for "no tokens".
      f"{prefix}ratio_max": jnp.max(jnp.where(mask_BxS, ratio_BxS, 0.0)),
  }


def _log_ratio(
    logp_BxS: jax.Array, ref_logp_BxS: jax.Array, mask_BxS: jax.Array
) -> jax.Array:
  # Padding may hold any log-prob (even -inf); its ratio is pinned to 1.
  return jnp.where(mask_BxS, logp_BxS - ref_logp_BxS, 0.0)


def _ppo_clip(
    ratio_BxS: jax.Array,
    adv_B: jax.Array,
    mask_BxS: jax.Array,
    eps_low: float,
    eps_high: float,
) -> tuple[jax.Array, Metrics]:
  """min(rho A, clip(rho, 1 - eps_low, 1 + eps_high) A) per token."""
  adv_Bx1 = adv_B[:, None]
  clipped_BxS = jnp.clip(ratio_BxS, 1.0 - eps_low, 1.0 + eps_high)
  obj_BxS = jnp.minimum(ratio_BxS * adv_Bx1, clipped_BxS * adv_Bx1)
  low_BxS = (ratio_BxS < 1.0 - eps_low) & (adv_Bx1 < 0)
  high_BxS = (ratio_BxS > 1.0 + eps_high) & (adv_Bx1 > 0)
  metrics = _ratio_stats(ratio_BxS, mask_BxS)
  metrics["clip_frac_low"] = _token_mean(low_BxS, mask_BxS)
  metrics["clip_frac_high"] = _token_mean(high_BxS, mask_BxS)
  metrics["capped_frac"] = jnp.zeros((), jnp.float32)
  return jnp.where(mask_BxS, obj_BxS, 0.0), metrics


@LOSSES.register("grpo")
def grpo(
    logp_BxS: jax.Array,
    ref_logp_BxS: jax.Array,
    adv_B: jax.Array,
    mask_BxS: jax.Array,
    *,
    eps_clip: float,
) -> tuple[jax.Array, Metrics]:
  """GRPO / PPO-clip: rho clipped to [1 - eps_clip, 1 + eps_clip]."""
  ratio_BxS = jnp.exp(_log_ratio(logp_BxS, ref_logp_BxS, mask_BxS))
  return _ppo_clip(ratio_BxS, adv_B, mask_BxS, eps_clip, eps_clip)


@LOSSES.register("dapo")
def dapo(
    logp_BxS: jax.Array,
    ref_logp_BxS: jax.Array,
    adv_B: jax.Array,
    mask_BxS: jax.Array,
    *,
    eps_low: float,
    eps_high: float,
) -> tuple[jax.Array, Metrics]:
  """DAPO's clip-higher, rho in [1 - eps_low, 1 + eps_high] (rest: config)."""
  ratio_BxS = jnp.exp(_log_ratio(logp_BxS, ref_logp_BxS, mask_BxS))
  return _ppo_clip(ratio_BxS, adv_B, mask_BxS, eps_low, eps_high)


def _sequence_log_ratio(
    logp_BxS: jax.Array, ref_logp_BxS: jax.Array, mask_BxS: jax.Array
) -> jax.Array:
  """log s_i: the mean of log rho over completion i's tokens (0 if none)."""
  total_B = jnp.sum(_log_ratio(logp_BxS, ref_logp_BxS, mask_BxS), axis=1)
  return total_B / jnp.maximum(jnp.sum(mask_BxS, axis=1), 1)


@LOSSES.register("gspo")
def gspo(
    logp_BxS: jax.Array,
    ref_logp_BxS: jax.Array,
    adv_B: jax.Array,
    mask_BxS: jax.Array,
    *,
    gspo_eps_low: float,
    gspo_eps_high: float,
) -> tuple[jax.Array, Metrics]:
  """GSPO: PPO-clip of s_i = exp(mean_t log rho_it), on each token of i."""
  seq_ratio_B = jnp.exp(_sequence_log_ratio(logp_BxS, ref_logp_BxS, mask_BxS))
  ratio_BxS = jnp.broadcast_to(seq_ratio_B[:, None], mask_BxS.shape)
  return _ppo_clip(ratio_BxS, adv_B, mask_BxS, gspo_eps_low, gspo_eps_high)


@LOSSES.register("gspo_token")
def gspo_token(
    logp_BxS: jax.Array,
    ref_logp_BxS: jax.Array,
    adv_B: jax.Array,
    mask_BxS: jax.Array,
    *,
    gspo_eps_low: float,
    gspo_eps_high: float,
) -> tuple[jax.Array, Metrics]:
  """GSPO-token: ratio sg(s_i) pi / sg(pi); gspo's value, per-token grads."""
  seq_log_ratio_B = jax.lax.stop_gradient(
      _sequence_log_ratio(logp_BxS, ref_logp_BxS, mask_BxS)
  )
  own_BxS = jnp.where(mask_BxS, logp_BxS - jax.lax.stop_gradient(logp_BxS), 0.0)
  ratio_BxS = jnp.exp(seq_log_ratio_B[:, None] + own_BxS)
  return _ppo_clip(ratio_BxS, adv_B, mask_BxS, gspo_eps_low, gspo_eps_high)


@LOSSES.register("cispo")
def cispo(
    logp_BxS: jax.Array,
    ref_logp_BxS: jax.Array,
    adv_B: jax.Array,
    mask_BxS: jax.Array,
    *,
    cispo_eps_max: float,
) -> tuple[jax.Array, Metrics]:
  """CISPO: sg(min(rho, eps_max)) A log pi; no token's gradient is clipped."""
  ratio_BxS = jnp.exp(_log_ratio(logp_BxS, ref_logp_BxS, mask_BxS))
  weight_BxS = jax.lax.stop_gradient(jnp.minimum(ratio_BxS, cispo_eps_max))
  obj_BxS = weight_BxS * adv_B[:, None] * logp_BxS
  metrics = _ratio_stats(ratio_BxS, mask_BxS)
  metrics["clip_frac_low"] = jnp.zeros((), jnp.float32)
  metrics["clip_frac_high"] = jnp.zeros((), jnp.float32)
  metrics["capped_frac"] = _token_mean(ratio_BxS > cispo_eps_max, mask_BxS)
  return jnp.where(mask_BxS, obj_BxS, 0.0), metrics


class Counts(NamedTuple):
  """The denominators of the aggregations, counted over a whole batch."""

  tokens: jax.Array  # Unmasked tokens.
  samples: jax.Array  # Completions with at least one unmasked token.
  len_P: jax.Array  # [P] unmasked tokens of each prompt's completions.
  prompts: jax.Array  # Prompts with at least one unmasked token.


def batch_counts(
    mask_BxS: jax.Array, group_B: jax.Array, num_groups: int
) -> Counts:
  """The denominators of `aggregate` on a batch's mask.

  Counted on the whole batch and handed to every microbatch's `aggregate`,
  the microbatches' averages sum to the whole batch's.
  """
  len_B = jnp.sum(mask_BxS.astype(bool), axis=1).astype(jnp.float32)
  len_P = jax.ops.segment_sum(len_B, group_B, num_segments=num_groups)
  return Counts(jnp.sum(len_B), jnp.sum(len_B > 0), len_P, jnp.sum(len_P > 0))


# (sum_B of each completion's unmasked objective, mask_BxS, group_B,
# num_groups, whole-batch counts) -> the scalar average.
AggregationFn = Callable[
    [jax.Array, jax.Array, jax.Array, int, Counts], jax.Array
]
AGGREGATIONS: registry.Registry[AggregationFn] = registry.Registry(
    "rl.aggregation"
)


@AGGREGATIONS.register("token")
def _token_aggregation(sum_B, mask_BxS, group_B, num_groups, counts):
  """Mean over all tokens of the batch."""
  del mask_BxS, group_B, num_groups
  return jnp.sum(sum_B) / jnp.maximum(counts.tokens, 1.0)


@AGGREGATIONS.register("sample")
def _sample_aggregation(sum_B, mask_BxS, group_B, num_groups, counts):
  """Mean over each completion's tokens, then over completions."""
  del group_B, num_groups
  # A completion is never split between microbatches: its own length is here.
  len_B = jnp.sum(mask_BxS, axis=1).astype(sum_B.dtype)
  mean_B = sum_B / jnp.maximum(len_B, 1.0)
  return jnp.sum(mean_B) / jnp.maximum(counts.samples, 1)


@AGGREGATIONS.register("prompt")
def _prompt_aggregation(sum_B, mask_BxS, group_B, num_groups, counts):
  """Mean over all tokens of each prompt's completions, then over prompts."""
  del mask_BxS
  sum_P = jax.ops.segment_sum(sum_B, group_B, num_segments=num_groups)
  mean_P = sum_P / jnp.maximum(counts.len_P, 1.0)
  return jnp.sum(mean_P) / jnp.maximum(counts.prompts, 1)


def aggregate(
    obj_BxS: jax.Array,
    mask_BxS: jax.Array,
    group_B: jax.Array,
    num_groups: int,
    aggregation: str,
    counts: Optional[Counts] = None,
) -> jax.Array:
  """The scalar average of `obj_BxS` by `aggregation` (PAPER.md §4).

  Completions and prompts without unmasked tokens are left out of the outer
  means (0 if none at all). Given the whole batch's `counts`, a microbatch's
  result is its share of the batch's average.
  """
  aggregation_fn = AGGREGATIONS.get(aggregation)
  mask_BxS = mask_BxS.astype(bool)
  if counts is None:
    counts = batch_counts(mask_BxS, group_B, num_groups)
  sum_B = jnp.sum(jnp.where(mask_BxS, obj_BxS, 0.0), axis=1)
  return aggregation_fn(sum_B, mask_BxS, group_B, num_groups, counts)


@dataclasses.dataclass(frozen=True)
class LossParams:
  """Static choice of loss, aggregation and hyperparameters (hashable)."""

  loss: str  # Registered loss name.
  aggregation: str  # A registered aggregation.
  hparams: tuple[tuple[str, float], ...]  # The loss's keyword arguments.
  # C: TIS scales each token by sg(min(1, C / rho)); 0 disables.
  tis_cap: float = 0.0

  @classmethod
  def from_config(cls, rl: ml_collections.ConfigDict) -> "LossParams":
    """From `config.rl`: loss, aggregation, tis_cap, the loss's fields."""
    # Raises for an unknown loss, naming the choices.
    loss = LOSSES.get(rl.loss)
    AGGREGATIONS.get(rl.aggregation)  # Likewise.
    hparams = tuple((name, float(rl[name])) for name in _hparams(loss))
    return cls(rl.loss, rl.aggregation, hparams, float(rl.tis_cap))


def compute_loss(
    params: LossParams,
    logp_BxS: jax.Array,
    gen_logp_BxS: jax.Array,
    adv_B: jax.Array,
    mask_BxS: jax.Array,
    group_B: jax.Array,
    num_groups: int,
    counts: Optional[Counts] = None,
) -> tuple[jax.Array, Metrics]:
  """(loss, metrics): -aggregate(objective of `params.loss`), to minimise.

  `gen_logp_BxS` are the generator's log-probs, which every ratio is taken
  against; `counts` are the whole batch's `batch_counts` when these rows are
  a microbatch. With `params.tis_cap` C > 0 each token's objective is scaled
  by sg(min(1, C / rho)).
  """
  mask_BxS = mask_BxS.astype(bool)
  obj_BxS, metrics = LOSSES.get(params.loss)(
      logp_BxS, gen_logp_BxS, adv_B, mask_BxS, **dict(params.hparams)
  )
  if params.tis_cap > 0:
    log_ratio_BxS = _log_ratio(logp_BxS, gen_logp_BxS, mask_BxS)
    factor_BxS = jnp.exp(
        jnp.minimum(0.0, jnp.log(params.tis_cap) - log_ratio_BxS)
    )
    obj_BxS = obj_BxS * jax.lax.stop_gradient(factor_BxS)
    tis_ratio_BxS = jnp.exp(log_ratio_BxS)
    metrics.update(_ratio_stats(tis_ratio_BxS, mask_BxS, prefix="tis_"))
    metrics["tis_capped_frac"] = _token_mean(
        tis_ratio_BxS > params.tis_cap, mask_BxS
    )
  loss = -aggregate(
      obj_BxS, mask_BxS, group_B, num_groups, params.aggregation, counts
  )
  return loss, metrics
