"""Generations per prompt at a fixed batch (PAPER.md §1): 8,
16 (ScaleRL), 24 and 32 of 768.

The split of a batch between prompts and generations barely moved A (0.585 to
0.595). Other variants scale their own generations per prompt by 1/2, 1, 3/2
and 2, keeping prompts x generations as close to the base batch as integers
allow. Run, then fit:

  python -m launch.sweep --sweep=configs/ablations/generations_per_prompt.py \
      --workdir=/tmp/sweeps/generations_per_prompt --parallel=2
  python -m launch.fit --workdirs=/tmp/sweeps/generations_per_prompt \
      --fit_fraction=0.5

`generations_per_prompt.py:variant=<name>` picks the model size
of configs/scalerl.py.
"""

from configs import scalerl

_FACTORS = (1 / 2, 1, 3 / 2, 2)


def get_config(arg=None):
  """The ScaleRL base config; `arg` as for configs/scalerl.py."""
  return scalerl.get_config(arg)


def get_sweep(arg=None):
  """Generations per prompt scaled by each factor;
  prompts per step rebalanced."""
  data = get_config(arg).data
  batch = data.prompts_per_step * data.generations_per_prompt
  points = []
  for factor in _FACTORS:
    generations = max(2, round(data.generations_per_prompt * factor))
    points.append(
        {
            "name": f"gen{generations}",
            "data.generations_per_prompt": generations,
            "data.prompts_per_step": max(1, round(batch / generations)),
        }
    )
  return points
