"""Math and code in one run (PAPER.md §1, the math+code run):
two built-in domains.

The policy trains on a 50/50 mixture of the arithmetic task (`math`) and the
built-in code domain (`code`: a function body from a spoken recipe, scored by
the sandbox against the record's asserts), starting from one base policy
warm-started on both (docs/multitask.md). Validation logs
`val/math/mean_at_k` and `val/code/mean_at_k` beside the overall one.

  python -m launch.sweep --sweep=configs/multitask.py --workdir=/tmp/multitask
  python -m launch.fit --workdirs=/tmp/multitask --metric=val/math/mean_at_k \
      --fit_fraction=0.5 --x=compute/flops
  python -m launch.fit --workdirs=/tmp/multitask --metric=val/code/mean_at_k \
      --fit_fraction=0.5 --x=compute/flops
"""

import ml_collections

from configs import scalerl

SEEDS = (0, 1, 2)


def _domain(weight, source, levels, num_train, num_val):
  d = ml_collections.ConfigDict()
  d.weight = weight  # Share of the prompt stream.
  d.source = source  # A data.source value.
  d.builtin_difficulty = levels  # Levels (operators / operations per problem).
  d.builtin_num_train = num_train  # Training prompts of this domain.
  d.builtin_num_val = num_val  # Held-out prompts of this domain.
  return d


def get_config(arg=None):
  """configs/scalerl.py's config for `arg` with the math + code mixture."""
  c = scalerl.get_config(arg)
  with c.unlocked():
    c.data.mixture = ml_collections.ConfigDict(
        {
            "math": _domain(0.5, "builtin", (1, 2), 6_000, 200),
            "code": _domain(0.5, "builtin_code", (1, 2, 3), 3_000, 200),
        }
    )
  c.trainer.num_steps = 60  # RL steps, as the default run.
  # Validations: the points of each domain's curve. Every 4 steps puts 7
  # points in the first half, enough to fit a sigmoid and predict the rest.
  c.trainer.eval_every = 4
  # Per domain; 2 x 32 x 16 samples per validation.
  c.trainer.eval_num_prompts = 32
  # One base policy for every seed, as the paper's runs.
  c.trainer.warm_start_seed = 0
  c.trainer.warm_start_steps = 2_000  # Two tasks to learn the formats of.
  # 128 programs a step: each a fork of the worker's warm sandbox, 3 ms, not
  # a fresh sandbox, 20 ms (docs/multitask.md, cost).
  c.rewards.code_fork_server = True
  return c


def get_sweep(arg=None):
  """The three seeds."""
  del arg
  return [{"name": f"seed={s}", "seed": s} for s in SEEDS]
