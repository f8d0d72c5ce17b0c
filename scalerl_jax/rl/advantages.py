"""Group-relative advantages (PAPER.md §2) and zero-variance groups (§5), pure.

`group_advantages(rewards_PxG, norm)` centres each group's rewards,
A_i = r_i - mean_group(r), and divides them by the std of the normalisation
registered as `norm` (`config.rl.adv_norm`: `prompt`, `batch`, `none`).
Zero-variance groups (all G rewards equal) get advantage exactly 0 and are
flagged in `zero_var_P`; `drop_groups` zeroes their tokens' mask so the loss
neither counts nor averages them. No reward pattern yields NaN. The batch is
prompt-major: `adv_PxG.reshape(-1)` is the losses' `adv_B`.

Shape letters: the package key (scalerl_jax/__init__.py).
Design (why the batch std skips dropped groups): docs/design/rl.md.
"""

from typing import Callable, Optional

import jax
import jax.numpy as jnp

from scalerl_jax import registry

# (rewards_PxG, centred adv_PxG, zero_var_P, zero_variance_filter) -> the std
# to divide by ([P, 1] or []), or None to leave the advantages as they are.
NormFn = Callable[[jax.Array, jax.Array, jax.Array, bool], Optional[jax.Array]]
NORMS: registry.Registry[NormFn] = registry.Registry("rl.adv_norm")


@NORMS.register("none")
def _no_norm(rewards_PxG, adv_PxG, zero_var_P, zero_variance_filter):
  del rewards_PxG, adv_PxG, zero_var_P, zero_variance_filter
  return None


@NORMS.register("prompt")
def _prompt_std(rewards_PxG, adv_PxG, zero_var_P, zero_variance_filter):
  """The std of the prompt's own G rewards, [P, 1]."""
  del adv_PxG, zero_var_P, zero_variance_filter
  return jnp.std(rewards_PxG, axis=1, keepdims=True)


@NORMS.register("batch")
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
  """int32 `group_B` = [0] * G + [1] * G + ... + [P - 1] * G."""
  return jnp.repeat(jnp.arange(num_prompts, dtype=jnp.int32), num_generations)


def group_advantages(
    rewards_PxG: jax.Array, norm: str, *, zero_variance_filter: bool
) -> tuple[jax.Array, jax.Array]:
  """(adv_PxG, zero_var_P): centred rewards over the std `norm` registers.

  Stds are population ones (ddof = 0, PAPER.md §2); a zero std never divides.
  `zero_variance_filter` (whether the loss drops zero-variance groups) decides
  whether `batch` counts those groups.
  """
  norm_fn = NORMS.get(norm)
  rewards_PxG = jnp.asarray(rewards_PxG, jnp.float32)
  # Exact equality rather than std == 0: a float mean of equal rewards need not
  # reproduce them bit for bit, so the centred values could be a tiny non-zero.
  zero_var_P = jnp.all(rewards_PxG == rewards_PxG[:, :1], axis=1)
  adv_PxG = jnp.where(
      zero_var_P[:, None],
      0.0,
      rewards_PxG - jnp.mean(rewards_PxG, axis=1, keepdims=True),
  )
  std = norm_fn(rewards_PxG, adv_PxG, zero_var_P, zero_variance_filter)
  if std is None:
    return adv_PxG, zero_var_P
  return adv_PxG / jnp.where(std > 0, std, 1.0), zero_var_P


def drop_groups(mask_BxS: jax.Array, drop_P: jax.Array) -> jax.Array:
  """`mask_BxS` with every completion of a group in `drop_P` zeroed."""
  num_completions, num_groups = mask_BxS.shape[0], drop_P.shape[0]
  if num_completions % num_groups:
    raise ValueError(
        f"mask_BxS has {num_completions} rows, not a multiple of the {num_groups} groups"
    )
  keep_B = ~jnp.repeat(drop_P, num_completions // num_groups)
  return jnp.where(keep_B[:, None], mask_BxS, jnp.zeros_like(mask_BxS))
