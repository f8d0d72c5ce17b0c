"""Leave-one-out (PAPER.md §5, §6): ScaleRL with one of its
choices reverted at a time.

Each point reverts one choice to the DAPO-style baseline it replaced: the loss
to DAPO, the FP32 head off, prompt to token aggregation, batch to prompt-level
advantage normalisation, zero-variance filtering off, No-Positive-Resampling
off, PipelineRL to PPO-off-policy at the same k. The first point is ScaleRL
itself. Run, then fit:

  python -m launch.sweep --sweep=configs/ablations/leave_one_out.py \
      --workdir=/tmp/sweeps/leave_one_out --parallel=2
  python -m launch.fit --workdirs=/tmp/sweeps/leave_one_out --fit_fraction=0.5

`leave_one_out.py:variant=<name>` picks the model size of configs/scalerl.py.
"""

from configs import scalerl

_REVERTS = (
    ("scalerl", {}),
    ("dapo_loss", {"rl.loss": "dapo"}),
    ("no_fp32_head", {"model.fp32_lm_head": False}),
    ("token_avg", {"rl.aggregation": "token"}),
    ("prompt_adv_norm", {"rl.adv_norm": "prompt"}),
    ("no_zero_var_filter", {"rl.zero_variance_filter": False}),
    ("no_npr", {"curriculum.no_positive_resampling": False}),
    ("ppo_off_policy", {"buffer.schedule": "ppo_off_policy"}),
)


def get_config(arg=None):
  """The ScaleRL base config; `arg` as for configs/scalerl.py."""
  return scalerl.get_config(arg)


def get_sweep(arg=None):
  """ScaleRL, then one point per reverted choice."""
  del arg
  return [{"name": name, **overrides} for name, overrides in _REVERTS]
