"""The parity task (data/parity_task.py) and its pilot: generation length
(issue 49, docs/parity_task.md).

The warm-started base answers the parity of the odd digits either through a
chain that reads one digit per step (rarely taken, right when it fits) or
directly at one token (right only as far as the model computes parity in one
pass). The pilot compares two generation budgets from one base: a long one
that fits the chain of every level and a short one that fits levels 1-2
only. One sweep per seed, then the verdict from the differences within
seeds:

  python -m launch.sweep --sweep=configs/parity.py \
      --workdir=/tmp/parity/pilot/seed=0 --set=seed=0
  python -m launch.paired --workdirs=/tmp/parity/pilot \
      --first=long --second=short --last=2
"""

from configs import search
from scalerl_jax.data import parity_task

# Budgets, in completion tokens with EOS: the chain of the longest level (8
# digits) and of level 2 (4 digits).
LONG = parity_task.chain_tokens(parity_task.DIGITS_PER_LEVEL[4])
SHORT = parity_task.chain_tokens(parity_task.DIGITS_PER_LEVEL[2])


def budget(max_new_tokens):
  """The overrides that give a point `max_new_tokens`, the generator still
  running ahead until k binds (configs/search.py)."""
  return {
      "sampling.max_new_tokens": max_new_tokens,
      "buffer.decode_steps_per_train_step": search.RUN_AHEAD * max_new_tokens,
  }


def get_config(arg=None):
  """configs/search.py's recipe (constant LR, k = 8) on the parity task."""
  c = search.get_config(arg)
  c.data.source = parity_task.SOURCE
  c.data.builtin_difficulty = parity_task.LEVELS
  # RL prompts from the `train` split: level 1 holds only ~44, so its
  # prompts come back; the other levels give ~650 each.
  c.data.builtin_num_train = 2_000
  c.data.builtin_num_val = 150  # ~6 of level 1, 48 of each other level.
  # "Compute 3 7 2 8 4 1 0 6" is 18 tokens with BOS.
  c.sampling.max_prompt_len = 18
  c.update_from_flattened_dict(budget(LONG))
  # Every point warm-starts on chains cut to the long budget, so points that
  # differ only in their budget share one base.
  c.trainer.warm_start_max_new_tokens = LONG
  # Every seed starts from seed 0's base, as the paper's repeated runs share
  # one pretrained model: the 1,500-step warm start learns the chain on some
  # seeds only (final loss 0.08 on seed 0, 0.37 and 0.16 on seeds 1 and 2,
  # whose bases RL could not lift: docs/parity_task.md).
  c.trainer.warm_start_seed = 0
  return c


def get_sweep(arg=None):
  """The pilot: the long budget against the short one, on the same base."""
  del arg
  return [
      {"name": "long", **budget(LONG)},
      {"name": "short", **budget(SHORT)},
  ]
