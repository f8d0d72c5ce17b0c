"""Loss aggregation (PAPER.md §4, §6): sample,
prompt (ScaleRL) and token average.

The aggregation moved only the efficiency B / C_mid. Run, then fit:

  python -m launch.sweep --sweep=configs/ablations/aggregation.py \
      --workdir=/tmp/sweeps/aggregation --parallel=2
  python -m launch.fit --workdirs=/tmp/sweeps/aggregation --fit_fraction=0.5

`aggregation.py:variant=<name>` picks the model size of configs/scalerl.py.
"""

from configs import scalerl


def get_config(arg=None):
  """The ScaleRL base config; `arg` as for configs/scalerl.py."""
  return scalerl.get_config(arg)


def get_sweep(arg=None):
  """One point per aggregation; the loss stays CISPO."""
  del arg
  return [
      {"name": f"{agg}_avg", "rl.aggregation": agg}
      for agg in ("sample", "prompt", "token")
  ]
