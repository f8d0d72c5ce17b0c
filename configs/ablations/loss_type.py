"""Loss type (PAPER.md §3, §6): GRPO, DAPO, GSPO and CISPO
on the ScaleRL recipe.

The loss moved the ceiling A (CISPO and GSPO above DAPO). Run, then fit:

  python -m launch.sweep --sweep=configs/ablations/loss_type.py \
      --workdir=/tmp/sweeps/loss_type --parallel=2
  python -m launch.fit --workdirs=/tmp/sweeps/loss_type --fit_fraction=0.5

`loss_type.py:variant=<name>` picks the model size of configs/scalerl.py.
"""

from configs import scalerl


def get_config(arg=None):
  """The ScaleRL base config; `arg` as for configs/scalerl.py."""
  return scalerl.get_config(arg)


def get_sweep(arg=None):
  """One point per loss; every other choice stays ScaleRL's."""
  del arg
  return [
      {"name": loss, "rl.loss": loss}
      for loss in ("grpo", "dapo", "gspo", "cispo")
  ]
