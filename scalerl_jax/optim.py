"""The optimizer: an optax chain built from `config.optim`.

Optional global-norm clipping, then AdamW on `make_schedule`'s learning rate
with weight decay masked by `decays`.

Design: docs/design/precision.md.
"""

import math
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import optax

# Learning-rate schedules after warmup, the choices of `config.optim.schedule`.
SCHEDULES = ("constant", "cosine")


def make_schedule(optim: ml_collections.ConfigDict) -> optax.Schedule:
  """Jittable learning rate after `step` updates (optax's count).

  lr(step) = peak * min(1, (step + 1) / warmup_steps) * decay(step): the
  first update already moves the weights. `decay` is 1 (constant) or falls
  by a cosine from 1 at the end of warmup to `final_lr_fraction` over
  `decay_steps` steps, then stays.
  """
  if optim.schedule not in SCHEDULES:
    raise ValueError(
        f"optim.schedule: {optim.schedule!r} is not one of {SCHEDULES}"
    )
  if optim.schedule == "cosine" and optim.decay_steps <= 0:
    raise ValueError("optim.decay_steps: cosine schedule needs decay_steps > 0")
  peak = float(optim.learning_rate)
  warmup = int(optim.warmup_steps)
  cosine = optim.schedule == "cosine"
  decay_steps = int(optim.decay_steps)
  floor = float(optim.final_lr_fraction)

  def schedule(step):
    step = jnp.asarray(step, jnp.float32)
    lr = jnp.full((), peak, jnp.float32)
    if warmup:
      lr = lr * jnp.minimum(1.0, (step + 1.0) / warmup)
    if cosine:
      t = jnp.clip((step - warmup) / decay_steps, 0.0, 1.0)
      lr = lr * (floor + (1.0 - floor) * 0.5 * (1.0 + jnp.cos(math.pi * t)))
    return lr

  return schedule


def decays(path: Sequence[str]) -> bool:
  """Whether the parameter at `path` (dict keys, outermost first) is decayed.

  False if a key contains "norm" (case-insensitive) or equals "bias".
  """
  return not any("norm" in key.lower() or key == "bias" for key in path)


def _key_name(key: Any) -> str:
  if isinstance(key, jax.tree_util.DictKey):
    return str(key.key)
  if isinstance(key, jax.tree_util.GetAttrKey):
    return key.name
  if isinstance(key, jax.tree_util.SequenceKey):
    return str(key.idx)
  return str(key)


def weight_decay_mask(params: Any) -> Any:
  """`decays(path)` for every leaf of `params` (a nested dict)."""
  return jax.tree_util.tree_map_with_path(
      lambda path, _: decays(tuple(_key_name(k) for k in path)), params
  )


def make_optimizer(
    optim: ml_collections.ConfigDict,
) -> optax.GradientTransformation:
  """Global-norm clipping (none at 0) then masked AdamW on the schedule."""
  adamw = optax.adamw(
      learning_rate=make_schedule(optim),
      b1=optim.b1,
      b2=optim.b2,
      eps=optim.eps,
      weight_decay=optim.weight_decay,
      mask=weight_decay_mask,
  )
  if optim.grad_clip_norm > 0:
    return optax.chain(optax.clip_by_global_norm(optim.grad_clip_norm), adamw)
  return adamw
