"""Off-policy schedule (PAPER.md §5, §6): PPO-off-policy-k vs
PipelineRL-k for several k.

PipelineRL reached the same A as PPO-off-policy with a higher B; k = 8 is
ScaleRL's choice and k = 4 was as good. Both schedules run on the same number
of sampler slots (PipelineRL's default), so the grid compares schedules, not
generation batch sizes. Every point lets the generator run ahead:
`buffer.decode_steps_per_train_step` (the stand-in for the paper's ratio of
generator to trainer speed) is `_RUN_AHEAD` x `sampling.max_new_tokens`, so
PipelineRL-k's lag reaches k, as PPO-off-policy-k's reaches k - 1 (PPO decodes
each set to the end whatever the field says). At the default 16 the generator
is the slower side and k = 4, 8 and 16 behave alike (docs/ablations.md). Run,
then fit:

  python -m launch.sweep --sweep=configs/ablations/off_policy.py \
      --workdir=/tmp/sweeps/off_policy --parallel=2
  python -m launch.fit --workdirs=/tmp/sweeps/off_policy --fit_fraction=0.5

`off_policy.py:variant=<name>` picks the model size of configs/scalerl.py.
"""

from configs import scalerl
from scalerl_jax.rl import schedules

_SCHEDULES = {"ppo_off_policy": "ppo", "pipeline_rl": "pipeline"}
_MAX_OFF_POLICY = (4, 8, 16)
# Decode steps per train step, in units of sampling.max_new_tokens.
_RUN_AHEAD = 4


def get_config(arg=None):
  """The ScaleRL base config; `arg` as for configs/scalerl.py."""
  return scalerl.get_config(arg)


def get_sweep(arg=None):
  """Both schedules at each staleness bound k, on PipelineRL's default slots."""
  config = get_config(arg)
  slots = schedules.num_slots(config)
  decode_steps = _RUN_AHEAD * config.sampling.max_new_tokens
  return [
      {
          "name": f"{short}_k{k}",
          "buffer.schedule": schedule,
          "buffer.max_off_policy": k,
          "sampling.num_slots": slots,
          "buffer.decode_steps_per_train_step": decode_steps,
      }
      for schedule, short in _SCHEDULES.items()
      for k in _MAX_OFF_POLICY
  ]
