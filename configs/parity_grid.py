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
      --claims=configs/parity_grid.py --last=2
"""

import dataclasses

from configs import parity
from scalerl_jax.rl import schedules
from scalerl_jax.scaling import compare
from scalerl_jax.scaling import paired

# RL prompts: 60 steps x 16 draw 960, each prompt about three times.
POOL = 320
# A third of configs/parity.py's constant rate: at 3e-4 the first baseline
# collapsed at its last validation on seed 0 (0.65 -> 0.0, every completion
# cut at the budget; records in docs/runs/parity/grid_lr3e-4) and fell back
# from its peak on the others, as the search task's pilot A did before its
# pilot B at 1e-4 (docs/search_task.md).
LEARNING_RATE = 1e-4
# GSPO's clip of the sequence ratio as the ScaleRL paper's appendix ran it
# (configs/scalerl.py holds the GSPO paper's 3e-4 / 4e-4).
GSPO_EPS_LOW, GSPO_EPS_HIGH = 3e-3, 5e-3
# Prompts per step of the small-batch point, which runs twice the steps so
# that it sees the baseline's prompts and samples.
SMALL_BATCH = 8


def get_config(arg=None):
  """configs/parity.py's recipe on the smaller pool, at a third of its
  rate."""
  c = parity.get_config(arg)
  c.data.builtin_num_train = POOL
  c.optim.learning_rate = LEARNING_RATE
  # The bfloat16 points start from the float32 base of the others (a no-op
  # for those), so that the FP32 head's pair differs only in the RL run.
  c.trainer.warm_start_float32 = True
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
      {
          "name": "gspo",
          "rl.loss": "gspo",
          "rl.gspo_eps_low": GSPO_EPS_LOW,
          "rl.gspo_eps_high": GSPO_EPS_HIGH,
      },
      {"name": "bf16", **bf16},
      {"name": "bf16_head", **bf16, "model.fp32_lm_head": False},
  ]


def _claim(first, relation, second, param, paper, *mechanism):
  return paired.GridClaim(
      compare.Claim(first, relation, second, param, "PAPER.md"),
      paper,
      mechanism,
  )


_CLIPPED = (
    ("train/clip_frac_low", "mean"),
    ("train/clip_frac_high", "mean"),
    ("train/capped_frac", "mean"),
)


def _same_a_higher_b(other, choice, *mechanism):
  """ScaleRL's choice against `other`: the same A and a higher B, as
  compare.PAPER_CLAIMS reads "moved only efficiency" (§6) for the grids of
  configs/ablations/."""
  words = choice + "moves only B; ScaleRL's choice (§5, §6)"
  return tuple(
      paired.GridClaim(c, words, mechanism)
      for c in compare.choice_more_efficient("scalerl", (other,), "PAPER.md")
  )


# The paper's claims on this grid's points (PAPER.md §1, §5, §6), each with
# the logged quantity through which the paper says it acts; A is read from
# the end point, B from how soon the curve rises (paired.STATISTICS).
CLAIMS = (
    _claim(
        "scalerl",
        "higher",
        "dapo",
        "A",
        "CISPO over DAPO in A (§6); B 2.01 vs 1.77 leaving one out (§1)",
        *_CLIPPED,
    ),
    _claim(
        "gspo",
        "higher",
        "dapo",
        "A",
        "GSPO over DAPO in A (§6), at the appendix's clip 3e-3 / 5e-3",
        *_CLIPPED,
    ),
    _claim(
        "scalerl",
        "higher",
        "short",
        "A",
        "A 0.645 at 32k tokens vs 0.610 at 14k (§1)",
        ("train/truncation_rate", "mean"),
    ),
    _claim(
        "scalerl",
        "higher",
        f"batch{SMALL_BATCH}",
        "A",
        "A 0.645 / 0.610 / 0.605 at batch 2048 / 768 / 512 (§1)",
        ("train/l2_grads", "mean"),
    ),
    _claim(
        "bf16",
        "higher",
        "bf16_head",
        "A",
        "FP32 head: A 0.52 -> 0.61 (§1)",
        # At the first step no update has reached the sampler: precision alone.
        ("train/train_gen_logp_abs_diff", "first"),
        ("train/train_gen_logp_abs_diff", "mean"),
    ),
    _claim(
        "scalerl",
        "same",
        "ppo_k8",
        "A",
        "PipelineRL-8: the same A as PPO-off-policy-8 (§6)",
        ("staleness/mean", "mean"),
    ),
    _claim(
        "scalerl",
        "higher",
        "ppo_k8",
        "B",
        "PipelineRL-8: a higher B (§6)",
        ("staleness/mean", "mean"),
    ),
    *_same_a_higher_b(
        "token_avg",
        "prompt over token aggregation: ",
        ("train/l2_grads", "mean"),
    ),
    *_same_a_higher_b(
        "zvf_off",
        "zero-variance filtering: ",
        ("train/zero_variance_frac", "mean"),
    ),
    *_same_a_higher_b(
        "npr_off", "No-Positive-Resampling: ", ("prompts_retired", "last")
    ),
)

# The claims checked on the long runs (docs/runs/parity/long): CLAIMS' A
# claims of the baseline against the points that ran longer. scalerl and
# dapo continued to 180 steps, batch8 to 360 (the same samples), where the
# end point is the mean of the validations at steps 170 and 180 (340 and
# 360). Reproduce:
#   python -m launch.sweep --sweep=configs/parity_grid.py \
#       --workdir=/tmp/parity/long/seed=0 --set=seed=0 \
#       --points=scalerl,dapo --set=trainer.num_steps=180
#   (and --points=batch8 --set=trainer.num_steps=360), then
#   python -m launch.paired --workdirs=/tmp/parity/long \
#       --claims=configs/parity_grid.py:LONG_CLAIMS --last=2
LONG_POINTS = ("dapo", f"batch{SMALL_BATCH}")
LONG_CLAIMS = tuple(
    dataclasses.replace(
        gc, paper=f"{gc.paper}; here at 180 steps of 16 (360 of 8)"
    )
    for gc in CLAIMS
    if gc.claim.first == "scalerl"
    and gc.claim.second in LONG_POINTS
    and gc.claim.param == "A"
)
