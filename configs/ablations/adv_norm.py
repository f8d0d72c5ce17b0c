"""Advantage normalisation (PAPER.md §2, §6): prompt-level,
batch-level (ScaleRL), none.

The normalisation moved only the efficiency B / C_mid. Run, then fit:

  python -m launch.sweep --sweep=configs/ablations/adv_norm.py \
      --workdir=/tmp/sweeps/adv_norm --parallel=2
  python -m launch.fit --workdirs=/tmp/sweeps/adv_norm --fit_fraction=0.5

`adv_norm.py:variant=<name>` picks the model size of configs/scalerl.py.
"""

from configs import scalerl


def get_config(arg=None):
  """The ScaleRL base config; `arg` as for configs/scalerl.py."""
  return scalerl.get_config(arg)


def get_sweep(arg=None):
  """One point per normalisation of the group-relative advantages."""
  del arg
  return [
      {"name": f"norm_{norm}", "rl.adv_norm": norm}
      for norm in ("prompt", "batch", "none")
  ]
