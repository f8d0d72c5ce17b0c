"""Off-policy schedule (PAPER.md §5, §6): PPO-off-policy-k vs PipelineRL-k for several k.

PipelineRL reached the same A as PPO-off-policy with a higher B; k = 8 is
ScaleRL's choice and k = 4 was as good. Both schedules run on the same number
of sampler slots (PipelineRL's default), so the grid compares schedules, not
generation batch sizes. Run, then fit:

  python -m launch.sweep --sweep=configs/ablations/off_policy.py \
      --workdir=/tmp/sweeps/off_policy --parallel=2
  python -m launch.fit --workdirs=/tmp/sweeps/off_policy --fit_fraction=0.5

`off_policy.py:variant=<name>` picks the model size of configs/scalerl.py.
"""

from configs import scalerl
from scalerl_jax.rl import schedules

_SCHEDULES = {"ppo_off_policy": "ppo", "pipeline_rl": "pipeline"}
_MAX_OFF_POLICY = (4, 8, 16)


def get_config(arg=None):
  """The ScaleRL base config; `arg` as for configs/scalerl.py."""
  return scalerl.get_config(arg)


def get_sweep(arg=None):
  """Both schedules at each staleness bound k, on PipelineRL's default slots."""
  slots = schedules.num_slots(get_config(arg))
  return [{"name": f"{short}_k{k}", "buffer.schedule": schedule, "buffer.max_off_policy": k,
           "sampling.num_slots": slots}
          for schedule, short in _SCHEDULES.items() for k in _MAX_OFF_POLICY]
