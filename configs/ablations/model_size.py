"""Model size (PAPER.md §1, §6): a larger model raised A
(8B dense 0.610, 17Bx16 MoE 0.710).

The points are the variants of configs/scalerl.py in the base's family: the
CPU sizes (tiny_cpu, small_cpu) by default, the checkpoint-shaped sizes when the
base is one of them. Those start from random weights unless the sweep file is
copied with a model.hf_path per point. Run, then fit:

  python -m launch.sweep --sweep=configs/ablations/model_size.py \
      --workdir=/tmp/sweeps/model_size
  python -m launch.fit --workdirs=/tmp/sweeps/model_size --fit_fraction=0.5

`model_size.py:variant=<name>` picks the family through one of its variants.
"""

from configs import scalerl


def get_config(arg=None):
  """The ScaleRL base config; `arg` as for configs/scalerl.py."""
  return scalerl.get_config(arg)


def get_sweep(arg=None):
  """One point per variant of the base's family (CPU or checkpoint-shaped)."""
  cpu = get_config(arg).variant.endswith("_cpu")
  return [
      {"name": v, "variant": v}
      for v in scalerl.VARIANTS
      if v.endswith("_cpu") == cpu
  ]
