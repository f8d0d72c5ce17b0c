"""FP32 LM head on/off (PAPER.md §5, §6): the precision fix moved
A from 0.52 to 0.61.

The switch only bites where the model computes in bfloat16; the CPU variants
compute in float32 throughout, so at tiny_cpu both points train alike. Run a
bfloat16 variant, then fit:

  python -m launch.sweep --sweep=configs/ablations/fp32_head.py:variant=qwen3_0.6b \
      --workdir=/tmp/sweeps/fp32_head --parallel=2
  python -m launch.fit --workdirs=/tmp/sweeps/fp32_head --fit_fraction=0.5
"""  # noqa: W505 (a runnable command whose path cannot break)

from configs import scalerl


def get_config(arg=None):
  """The ScaleRL base config; `arg` as for configs/scalerl.py."""
  return scalerl.get_config(arg)


def get_sweep(arg=None):
  """LM-head logits in float32 (ScaleRL) or in the compute dtype."""
  del arg
  return [
      {"name": "fp32_head", "model.fp32_lm_head": True},
      {"name": "compute_dtype_head", "model.fp32_lm_head": False},
  ]
