"""Group-relative advantages (PAPER.md §2) and zero-variance groups (§5).

Shape letters: the package key (scalerl_jax/__init__.py).

The batch is laid out prompt-major: completion b belongs to prompt b // G, so
`adv_PxG.reshape(-1)` is the `adv_B` the losses take and `group_ids(P, G)` is
their `group_B`.

Advantages are group-centred, A_i = r_i - mean_group(r), then divided by a
standard deviation (`config.rl.adv_norm`): `prompt` by the std of the prompt's
own G rewards, `batch` (ScaleRL's choice) by the std of the centred advantages
A over the whole batch, `none` not at all.

A zero-variance group (all G rewards equal) carries no learning signal: its
advantages are exactly 0 and it is flagged in `zero_var_P`. With
`config.rl.zero_variance_filter` the trainer removes such groups from the loss
by zeroing their tokens' mask, `mask_BxS = drop_groups(mask_BxS, zero_var_P)`.
The aggregations in `losses.py` count only unmasked tokens, completions and
groups, so a dropped group enters neither a numerator nor a denominator:
prompt aggregation averages over the remaining prompts only. For the same
reason the batch std is taken over the groups the loss sees: with the filter
on, dropped groups are outside it (their zeros would otherwise shrink the std
and inflate every kept advantage by a factor that depends on how many prompts
happened to be solved or failed by every completion); with the filter off they
are part of the batch and count as the zeros they are.
"""

from typing import Callable, Optional

import jax
import jax.numpy as jnp

# (rewards_PxG, centred adv_PxG, zero_var_P, zero_variance_filter) -> the std
# to divide by ([P, 1] or []), or None to leave the advantages as they are.
NormFn = Callable[[jax.Array, jax.Array, jax.Array, bool], Optional[jax.Array]]
_NORMS: dict[str, NormFn] = {}


def register_norm(name: str) -> Callable[[NormFn], NormFn]:
  """Decorator registering a normalisation under `name` (`config.rl.adv_norm`)."""
  def register(fn: NormFn) -> NormFn:
    if name in _NORMS:
      raise ValueError(f"advantage normalisation {name!r} is already registered")
    _NORMS[name] = fn
    return fn
  return register


def registered_norms() -> tuple[str, ...]:
  """Names of all registered normalisations, sorted."""
  return tuple(sorted(_NORMS))


def get_norm(name: str) -> NormFn:
  """The normalisation registered under `name`; ValueError naming the choices if none."""
  if name not in _NORMS:
    raise ValueError(f"rl.adv_norm: {name!r} is not one of {registered_norms()}")
  return _NORMS[name]


@register_norm("none")
def _no_norm(rewards_PxG, adv_PxG, zero_var_P, zero_variance_filter):
  del rewards_PxG, adv_PxG, zero_var_P, zero_variance_filter
  return None


@register_norm("prompt")
def _prompt_std(rewards_PxG, adv_PxG, zero_var_P, zero_variance_filter):
  """The std of the prompt's own G rewards, [P, 1]."""
  del adv_PxG, zero_var_P, zero_variance_filter
  return jnp.std(rewards_PxG, axis=1, keepdims=True)


@register_norm("batch")
def _batch_std(rewards_PxG, adv_PxG, zero_var_P, zero_variance_filter):
  """The std of the centred advantages over the groups the loss sees, []."""
  # Every group's centred advantages sum to 0, so their batch mean is 0 and
  # the std is their root mean square. Zero-variance groups add nothing to
  # the sum of squares; they only count in the denominator when the loss
  # sees them. With every group dropped the sum is 0, and so is the std.
  num_prompts, num_generations = rewards_PxG.shape
  num_groups = jnp.sum(~zero_var_P) if zero_variance_filter else num_prompts
  num_completions = jnp.maximum(num_groups * num_generations, 1)
  return jnp.sqrt(jnp.sum(jnp.square(adv_PxG)) / num_completions)


def group_ids(num_prompts: int, num_generations: int) -> jax.Array:
  """Prompt index of every completion of a prompt-major batch.

  Args:
    num_prompts: P, prompts in the batch.
    num_generations: G, completions per prompt.

  Returns:
    int32 `group_B` = [0] * G + [1] * G + ... + [P - 1] * G.
  """
  return jnp.repeat(jnp.arange(num_prompts, dtype=jnp.int32), num_generations)


def group_advantages(rewards_PxG: jax.Array, norm: str, *, zero_variance_filter: bool
                     ) -> tuple[jax.Array, jax.Array]:
  """A_i = r_i - mean(group), divided by a standard deviation chosen by `norm`.

  Standard deviations are population ones (ddof = 0), as PAPER.md §2 states
  them: `prompt` divides by the std of the prompt's own G rewards; `batch`
  divides by the std of the centred advantages A over the batch the loss sees
  (zero-variance groups excluded when `zero_variance_filter` drops them from
  the loss, included otherwise); `none` leaves the centred rewards as they
  are. A zero std never divides: zero-variance groups get advantage exactly 0
  under every normalisation, and a batch with no non-zero advantage gets 0
  everywhere, so no reward pattern yields NaN.

  Args:
    rewards_PxG: scalar reward of every completion, grouped by prompt.
    norm: a registered normalisation (`registered_norms()`).
    zero_variance_filter: `config.rl.zero_variance_filter`, whether the loss
      drops zero-variance groups; only `batch` depends on it.

  Returns:
    (adv_PxG, zero_var_P): float32 advantages, and True for every group whose
    G rewards are all equal.
  """
  norm_fn = get_norm(norm)
  rewards_PxG = jnp.asarray(rewards_PxG, jnp.float32)
  # Exact equality rather than std == 0: a float mean of equal rewards need not
  # reproduce them bit for bit, so the centred values could be a tiny non-zero.
  zero_var_P = jnp.all(rewards_PxG == rewards_PxG[:, :1], axis=1)
  adv_PxG = jnp.where(zero_var_P[:, None], 0.0,
                      rewards_PxG - jnp.mean(rewards_PxG, axis=1, keepdims=True))
  std = norm_fn(rewards_PxG, adv_PxG, zero_var_P, zero_variance_filter)
  if std is None:
    return adv_PxG, zero_var_P
  return adv_PxG / jnp.where(std > 0, std, 1.0), zero_var_P


def drop_groups(mask_BxS: jax.Array, drop_P: jax.Array) -> jax.Array:
  """Zeroes the token mask of every completion of the flagged groups.

  Args:
    mask_BxS: token mask of a prompt-major batch (bool or numeric).
    drop_P: True for every group to remove, e.g. `zero_var_P` from
      `group_advantages`.

  Returns:
    The mask, same dtype, with the rows of dropped groups set to zero.
  """
  num_completions, num_groups = mask_BxS.shape[0], drop_P.shape[0]
  if num_completions % num_groups:
    raise ValueError(
        f"mask_BxS has {num_completions} rows, not a multiple of the {num_groups} groups")
  keep_B = ~jnp.repeat(drop_P, num_completions // num_groups)
  return jnp.where(keep_B[:, None], mask_BxS, jnp.zeros_like(mask_BxS))
