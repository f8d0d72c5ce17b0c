"""Group-relative advantages (PAPER.md §2) and zero-variance groups (§5).

Shapes: P prompts in the batch, G completions per prompt, B = P * G
completions, T completion tokens.

The batch is laid out prompt-major: completion b belongs to prompt b // G, so
`adv_PxG.reshape(-1)` is the `adv_B` the losses take and `group_ids(P, G)` is
their `group_B`.

A zero-variance group (all G rewards equal) carries no learning signal: its
advantages are exactly 0 and it is flagged in `zero_var_P`. With
`config.rl.zero_variance_filter` the trainer removes such groups from the loss
by zeroing their tokens' mask, `mask_BxT = drop_groups(mask_BxT, zero_var_P)`.
The aggregations in `losses.py` count only unmasked tokens, completions and
groups, so a dropped group enters neither a numerator nor a denominator:
prompt aggregation averages over the remaining prompts only.
"""

import jax
import jax.numpy as jnp

# Advantage normalisations, the choices of `config.rl.adv_norm`.
NORMS = ("prompt", "batch", "none")


def group_ids(num_prompts: int, num_generations: int) -> jax.Array:
  """Prompt index of every completion of a prompt-major batch.

  Args:
    num_prompts: P, prompts in the batch.
    num_generations: G, completions per prompt.

  Returns:
    int32 `group_B` = [0] * G + [1] * G + ... + [P - 1] * G.
  """
  return jnp.repeat(jnp.arange(num_prompts, dtype=jnp.int32), num_generations)


def group_advantages(rewards_PxG: jax.Array, norm: str) -> tuple[jax.Array, jax.Array]:
  """A_i = r_i - mean(group), divided by a standard deviation chosen by `norm`.

  Standard deviations are population ones (ddof = 0), as PAPER.md §2 states
  them: `prompt` divides by the std of the prompt's own G rewards; `batch`
  divides by the std of all P * G rewards of the batch (zero-variance groups
  included, since they are part of the sampled batch); `none` leaves the
  centred rewards as they are. A zero std never divides: zero-variance groups
  get advantage exactly 0 under every normalisation, and a batch whose
  rewards are all equal gets 0 everywhere, so no reward pattern yields NaN.

  Args:
    rewards_PxG: scalar reward of every completion, grouped by prompt.
    norm: one of `NORMS`.

  Returns:
    (adv_PxG, zero_var_P): float32 advantages, and True for every group whose
    G rewards are all equal.
  """
  if norm not in NORMS:
    raise ValueError(f"rl.adv_norm: {norm!r} is not one of {NORMS}")
  rewards_PxG = jnp.asarray(rewards_PxG, jnp.float32)
  # Exact equality rather than std == 0: a float mean of equal rewards need not
  # reproduce them bit for bit, so the centred values could be a tiny non-zero.
  zero_var_P = jnp.all(rewards_PxG == rewards_PxG[:, :1], axis=1)
  adv_PxG = rewards_PxG - jnp.mean(rewards_PxG, axis=1, keepdims=True)
  if norm != "none":
    if norm == "prompt":
      std = jnp.std(rewards_PxG, axis=1, keepdims=True)  # [P, 1]
    else:
      std = jnp.std(rewards_PxG, keepdims=True)  # [1, 1]
    adv_PxG = adv_PxG / jnp.where(std > 0, std, 1.0)
  adv_PxG = jnp.where(zero_var_P[:, None], 0.0, adv_PxG)
  return adv_PxG, zero_var_P


def drop_groups(mask_BxT: jax.Array, drop_P: jax.Array) -> jax.Array:
  """Zeroes the token mask of every completion of the flagged groups.

  Args:
    mask_BxT: token mask of a prompt-major batch (bool or numeric).
    drop_P: True for every group to remove, e.g. `zero_var_P` from
      `group_advantages`.

  Returns:
    The mask, same dtype, with the rows of dropped groups set to zero.
  """
  num_completions, num_groups = mask_BxT.shape[0], drop_P.shape[0]
  if num_completions % num_groups:
    raise ValueError(
        f"mask_BxT has {num_completions} rows, not a multiple of the {num_groups} groups")
  keep_B = ~jnp.repeat(drop_P, num_completions // num_groups)
  return jnp.where(keep_B[:, None], mask_BxT, jnp.zeros_like(mask_BxT))
