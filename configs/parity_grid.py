"""The paper's ablation table on the parity task: one grid of leave-one-out
points around ScaleRL's recipe, every point of a seed from one base
(issue 49, docs/ablations.md).

The baseline is configs/parity.py's recipe (ScaleRL's: CISPO, prompt-level
aggregation, batch-level normalisation, zero-variance filtering,
No-Positive-Resampling, PipelineRL-8, FP32 head; constant learning rate) at
the long budget, on a pool of 320 RL prompts, so that 60 steps of 16 prompts
draw each about three times and No-Positive-Resampling has prompts to
retire. Each other point changes one choice; a claim's verdict comes from
the paired differences with the baseline within seeds (`launch.paired`).
Points are listed in the order they run, the cheapest verdicts first. One
sweep per seed:

  python -m launch.sweep --sweep=configs/parity_grid.py \
      --workdir=/tmp/parity/grid/seed=0 --set=seed=0
  python -m launch.paired --workdirs=/tmp/parity/grid \
      --first=scalerl --second=dapo --last=2
"""

from configs import parity
from scalerl_jax.rl import schedules

# RL prompts: 60 steps x 16 draw 960, each prompt about three times.
POOL = 320
# Prompts per step of the small-batch point, which runs twice the steps so
# that it sees the baseline's prompts and samples.
SMALL_BATCH = 8


def get_config(arg=None):
  """configs/parity.py's recipe on the smaller pool."""
  c = parity.get_config(arg)
  c.data.builtin_num_train = POOL
  return c


def get_sweep(arg=None):
  """The baseline, then one point per claim (two for the FP32 head)."""
  config = get_config(arg)
  small_steps = config.trainer.num_steps * config.data.prompts_per_step
  small_steps //= SMALL_BATCH
  bf16 = {"model.compute_dtype": "bfloat16"}
  return [
      {"name": "scalerl"},
      # A: the budget, the loss, the batch, the head under bfloat16 compute.
      {"name": "short", **parity.budget(parity.SHORT)},
      {"name": "dapo", "rl.loss": "dapo"},
      # B: the filters, the schedule, the aggregation.
      {"name": "npr_off", "curriculum.no_positive_resampling": False},
      {"name": "zvf_off", "rl.zero_variance_filter": False},
      {
          "name": "ppo_k8",
          "buffer.schedule": "ppo_off_policy",
          # PipelineRL's slots, so that only the schedule differs.
          "sampling.num_slots": schedules.num_slots(config),
      },
      {"name": "token_avg", "rl.aggregation": "token"},
      {
          "name": f"batch{SMALL_BATCH}",
          "data.prompts_per_step": SMALL_BATCH,
          "trainer.num_steps": small_steps,
          # Validations at the baseline's compute.
          "trainer.eval_every": config.trainer.eval_every
          * config.data.prompts_per_step
          // SMALL_BATCH,
      },
      {"name": "bf16", **bf16},
      {"name": "bf16_head", **bf16, "model.fp32_lm_head": False},
  ]
