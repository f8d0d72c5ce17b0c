"""No-Positive-Resampling on/off (PAPER.md §5, §6): retire prompts whose
pass rate reaches 0.9.

The curriculum moved only the efficiency B / C_mid. Run, then fit:

  python -m launch.sweep --sweep=configs/ablations/no_positive_resampling.py \
      --workdir=/tmp/sweeps/no_positive_resampling --parallel=2
  python -m launch.fit --workdirs=/tmp/sweeps/no_positive_resampling \
      --fit_fraction=0.5

`no_positive_resampling.py:variant=<name>` picks the model size
of configs/scalerl.py.
"""

from configs import scalerl


def get_config(arg=None):
  """The ScaleRL base config; `arg` as for configs/scalerl.py."""
  return scalerl.get_config(arg)


def get_sweep(arg=None):
  """Retirement on (ScaleRL) and off."""
  del arg
  return [
      {"name": "npr_on", "curriculum.no_positive_resampling": True},
      {"name": "npr_off", "curriculum.no_positive_resampling": False},
  ]
