"""The supervised warm start's steps: which rows each trains on, at what
learning rate, and the parity task's chain phase run on until it is learned.

The warm start (warm_start.py) draws every example before its first step:
`chain_cap` steps of chain-only rows (the parity task's curriculum,
`trainer.warm_start_chain_first_steps`), then the mixed rows of the
remaining planned steps. Planned, step i trains on rows i with the
schedule's rate at i, as an optimizer whose schedule counts its own updates.

`trainer.warm_start_chain_loss_target` > 0 mends a warm start that misses
the chain. The chain is learned in a sudden drop of its loss at a step that
varies with the seed (docs/parity_task.md): of parity_v1's bases, those that
passed their gate had a chain loss of 0.0001-0.007 by step 2,250, the one
that failed 0.10, still falling. So the chain phase runs on past its planned
steps, 50 at a time, while the mean loss of its last 50 steps is at or above
the target, up to `trainer.warm_start_chain_max_steps` chain steps in all;
the learning rate holds at the schedule's value where the phase was planned
to end, and the mixed phase then follows the schedule as planned. A phase
that reaches the cap goes on to the mixed phase with a warning, and the
base gate decides (warm_start.check_gate).

`trainer.warm_start_chain_rate` chooses the chain phase's learning rate
(CHAIN_RATES). "planned" is the above: one warmup-cosine schedule over the
planned steps, an extension held at the rate where the phase was planned to
end (about a quarter of the peak at parity_v1's 2,250 of 3,000 steps).
"peak" holds the peak rate, after the warmup, through the whole chain phase,
planned steps and extension alike, and decays the mixed phase alone, cosine
from the peak to a tenth of it. Why (issue 58, item 3): under "planned"
with a target, the seeds that passed dropped at steps 1,000-1,750, where the
schedule's rate was 2.3e-3-1.3e-3 (peak 3e-3), while four of the five
extensions, held at 7e-4, ran their 4,500 steps to the cap without meeting
the target (docs/runs/warm_reliability/).
"""

from __future__ import annotations

import collections
import dataclasses
import math
from typing import Any, Callable

from absl import logging
import jax.numpy as jnp
import numpy as np
import optax

from scalerl_jax import optim

# Chain steps checked at a time, and the window the target's mean is over.
WINDOW = 50
# trainer.warm_start_chain_rate's choices; the first is the default.
CHAIN_RATES = ("planned", "peak")
# The schedule's final rate, as a fraction of the peak.
FINAL_RATE = 0.1


@dataclasses.dataclass(frozen=True)
class Phases:
  """The warm start's steps, as planned and as the chain phase may extend."""

  steps: int  # Planned steps (trainer.warm_start_steps).
  chain_first: int  # Planned chain-only steps.
  chain_cap: int  # Chain-only steps drawn: the most the phase may take.
  target: float  # Mean chain loss that ends the phase; 0 = as planned.
  rate: str = CHAIN_RATES[0]  # The chain phase's rate (CHAIN_RATES).

  @property
  def injected(self) -> bool:
    """Whether each step's rate is set from outside the optimizer
    (`with_learning_rate`), rather than by its own schedule."""
    return bool(self.target) or self.rate != CHAIN_RATES[0]

  @property
  def drawn(self) -> int:
    """Steps' worth of rows drawn: every chain step the phase may take, then
    the mixed steps."""
    return self.chain_cap + self.steps - self.chain_first


def phases(trainer_cfg: Any) -> Phases:
  """The `Phases` of trainer.warm_start_*."""
  target = trainer_cfg.warm_start_chain_loss_target
  first = trainer_cfg.warm_start_chain_first_steps
  cap = trainer_cfg.warm_start_chain_max_steps if target else first
  return Phases(
      trainer_cfg.warm_start_steps,
      first,
      cap,
      target,
      trainer_cfg.warm_start_chain_rate,
  )


def _warmup_steps(steps: int) -> int:
  """The warmup's steps in a warm start of `steps`."""
  return min(20, steps // 2)


def schedule(peak: float, steps: int) -> Callable[[int], float]:
  """The planned schedule over `steps`: a linear warmup to `peak`, then a
  cosine decay to FINAL_RATE of it."""
  return optax.warmup_cosine_decay_schedule(
      0.0, peak, _warmup_steps(steps), steps, peak * FINAL_RATE
  )


@dataclasses.dataclass(frozen=True)
class Rates:
  """Each step's learning rate: chain step i (planned or extension), mixed
  step j (counted from the mixed phase's first)."""

  chain: Callable[[int], float]
  mixed: Callable[[int], float]


def rates(plan: Phases, peak: float) -> Rates:
  """The `Rates` of `plan`'s chain rate at peak rate `peak`."""
  first = plan.chain_first
  if plan.rate == CHAIN_RATES[0]:
    planned = schedule(peak, plan.steps)
    return Rates(
        chain=lambda i: planned(min(i, first)),
        mixed=lambda j: planned(first + j),
    )
  warmup = optax.linear_schedule(0.0, peak, _warmup_steps(plan.steps))
  decay = optax.cosine_decay_schedule(
      peak, max(plan.steps - first, 1), FINAL_RATE
  )
  return Rates(chain=warmup, mixed=decay)


def optimizer(
    t: Any, plan: Phases, rate: Rates
) -> optax.GradientTransformation:
  """The warm start's AdamW (trainer config `t`) after clipping at norm 1.

  With a chain loss target or a held peak (`plan.injected`) `run` sets the
  rate per step; otherwise the planned schedule counts updates. Decay is
  masked as the RL optimizer's (optim.weight_decay_mask); none by default.
  """
  wd = t.warm_start_weight_decay
  decay = dict(weight_decay=wd, mask=optim.weight_decay_mask if wd else None)
  adamw = (
      optax.inject_hyperparams(optax.adamw, static_args="mask")(
          rate.chain(0), **decay
      )
      if plan.injected
      else optax.adamw(schedule(t.warm_start_lr, t.warm_start_steps), **decay)
  )
  return optax.chain(optax.clip_by_global_norm(1.0), adamw)


def with_learning_rate(opt_state: Any, lr: float) -> Any:
  """`opt_state` of `optax.chain(clip, inject_hyperparams(adamw))` with its
  learning rate set to `lr`."""
  clip, inject = opt_state
  hyper = {**inject.hyperparams, "learning_rate": jnp.asarray(lr, jnp.float32)}
  return clip, inject._replace(hyperparams=hyper)


def run(
    step: Callable,
    params: Any,
    opt_state: Any,
    tokens: np.ndarray,
    mask: np.ndarray,
    batch: int,
    plan: Phases,
    rate: Rates,
) -> tuple[Any, dict[str, float]]:
  """Trains `params` through the phases; (params, what the chain phase did).

  `step(params, opt_state, tokens, mask)` is the jitted supervised step;
  where `plan.injected`, its optimizer takes each step's rate from
  `with_learning_rate` (`rate`), else from its own schedule (which must be
  `rate`'s). Raises FloatingPointError on a non-finite loss.
  """
  taken = 0
  # The last WINDOW chain-only steps' losses (device scalars).
  recent: collections.deque = collections.deque(maxlen=WINDOW)

  def take(row: int, lr: float, total: int):
    nonlocal params, opt_state, taken
    if plan.injected:
      opt_state = with_learning_rate(opt_state, lr)
    rows = slice(row * batch, (row + 1) * batch)
    params, opt_state, loss = step(params, opt_state, tokens[rows], mask[rows])
    taken += 1
    if taken % WINDOW == 0 or taken == total:
      logging.info(
          "warm start step %d/%d: loss %.4f", taken, total, float(loss)
      )
      if not np.isfinite(float(loss)):
        raise FloatingPointError(
            f"warm start diverged at step {taken} (loss {float(loss)})"
        )
    return loss

  for i in range(plan.chain_first):
    recent.append(take(i, rate.chain(i), plan.steps))
  chain = plan.chain_first

  def chain_loss() -> float:
    return float(jnp.mean(jnp.stack(list(recent)))) if recent else math.inf

  if plan.target:
    while chain < plan.chain_cap and chain_loss() >= plan.target:
      for _ in range(min(WINDOW, plan.chain_cap - chain)):
        extra = chain - plan.chain_first + 1
        recent.append(take(chain, rate.chain(chain), plan.steps + extra))
        chain += 1
  loss = chain_loss()
  if plan.target:
    reached = loss < plan.target
    (logging.info if reached else logging.warning)(
        "warm start: the chain phase took %d steps (%d planned, at most %d): "
        "mean loss of its last %d %.4f, target %g%s",
        chain,
        plan.chain_first,
        plan.chain_cap,
        len(recent),
        loss,
        plan.target,
        "" if reached else " NOT reached; the base gate decides",
    )
  info = {"chain_steps": chain, "chain_loss": loss if recent else None}
  total = plan.steps + chain - plan.chain_first
  for j in range(plan.steps - plan.chain_first):
    take(plan.chain_cap + j, rate.mixed(j), total)
  return params, info
