"""Batch size (PAPER.md §1, §6): 512, 768 (ScaleRL) and 2048
completions per step.

A larger batch raised A (0.605 at 512, 0.610 at 768, 0.645 at 2048) at a larger
C_mid. The paper's batches are 2/3, 1 and 8/3 of ScaleRL's 48 prompts at 16
generations each; other variants scale their own prompts per step alike. Run,
then fit:

  python -m launch.sweep --sweep=configs/ablations/batch_size.py \
      --workdir=/tmp/sweeps/batch_size --parallel=2
  python -m launch.fit --workdirs=/tmp/sweeps/batch_size --fit_fraction=0.5

`batch_size.py:variant=<name>` picks the model size of configs/scalerl.py.
"""

from configs import scalerl

_FACTORS = (2 / 3, 1, 8 / 3)


def get_config(arg=None):
  """The ScaleRL base config; `arg` as for configs/scalerl.py."""
  return scalerl.get_config(arg)


def get_sweep(arg=None):
  """Prompts per step scaled by each factor; generations per prompt fixed."""
  data = get_config(arg).data
  points = []
  for factor in _FACTORS:
    prompts = max(1, round(data.prompts_per_step * factor))
    points.append(
        {
            "name": f"batch{prompts * data.generations_per_prompt}",
            "data.prompts_per_step": prompts,
        }
    )
  return points
