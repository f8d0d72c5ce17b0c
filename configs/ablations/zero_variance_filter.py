"""Zero-variance filtering on/off (PAPER.md §5, §6): drop groups whose
rewards are all equal.

The filter moved only the efficiency B / C_mid. Run, then fit:

  python -m launch.sweep --sweep=configs/ablations/zero_variance_filter.py \
      --workdir=/tmp/sweeps/zero_variance_filter --parallel=2
  python -m launch.fit --workdirs=/tmp/sweeps/zero_variance_filter \
      --fit_fraction=0.5

`zero_variance_filter.py:variant=<name>` picks the model size
of configs/scalerl.py.
"""

from configs import scalerl


def get_config(arg=None):
  """The ScaleRL base config; `arg` as for configs/scalerl.py."""
  return scalerl.get_config(arg)


def get_sweep(arg=None):
  """Filter on (ScaleRL) and off."""
  del arg
  return [
      {"name": "filter_on", "rl.zero_variance_filter": True},
      {"name": "filter_off", "rl.zero_variance_filter": False},
  ]
