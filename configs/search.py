"""The search task (data/search_task.py): a built-in task whose ceiling the
recipe decides, and the pilot that checks it (issue 49).

The warm-started base guesses a hidden digit uniformly and checks each
guess; the generation budget admits only a few tries, so RL raises the pass
rate only as far as it learns to guess right, at tokens of real entropy. Every
point of a seed's sweep starts from that seed's one base policy. The pilot,
CISPO against DAPO at k = 8 with the generator running ahead until k binds
(docs/search_task.md), one sweep per seed:

  python -m launch.sweep --sweep=configs/search.py \
      --workdir=/tmp/search/pilot/seed=0 --set=seed=0
  python -m launch.fit --workdirs=/tmp/search/pilot --x=compute/flops

`search.py:variant=<name>` picks the model size of configs/scalerl.py.
"""

from configs import scalerl

# Decode steps per train step, in units of sampling.max_new_tokens
# (configs/ablations/off_policy.py): the generator runs ahead until k holds it.
_RUN_AHEAD = 4


def get_config(arg=None):
  """configs/scalerl.py's config for `arg` on the search task."""
  c = scalerl.get_config(arg)
  c.data.source = "builtin_search"  # data/search_task.py.
  c.data.builtin_difficulty = (1, 2, 3)  # All three search levels.
  # RL prompts, from the `train` split (levels 1 and 2 hold only 391 and
  # 1,196 there, which come back within a run).
  c.data.builtin_num_train = 3_000
  # Validation prompts, from the `val` split: 50 per level.
  c.data.builtin_num_val = 150
  # "Compute ?*11+22=5" is 10 tokens with BOS.
  c.sampling.max_prompt_len = 16
  # Room for 3 tries at level 1 and 2 at levels 2-3: the base, guessing
  # uniformly over 10 digits, solves 3/10 or 2/10 of the problems.
  c.sampling.max_new_tokens = 30
  c.trainer.num_steps = 60  # RL steps.
  c.trainer.eval_every = 10  # Steps between validations.
  c.trainer.eval_num_prompts = 150  # All of data.builtin_num_val.
  # Exact worked targets: the base's only weakness is where it guesses.
  c.trainer.warm_start_answer_slip_prob = 0.0
  # The paper's constant rate after warmup, at the CPU default's peak.
  c.optim.schedule = "constant"
  c.optim.decay_steps = 0  # Unused by the constant schedule.
  c.optim.final_lr_fraction = 0.0  # Unused by the constant schedule.
  c.buffer.max_off_policy = 8  # k, ScaleRL's.
  # The generator runs ahead until k binds, so lags reach k.
  c.buffer.decode_steps_per_train_step = _RUN_AHEAD * c.sampling.max_new_tokens
  return c


def get_sweep(arg=None):
  """The pilot: CISPO (ScaleRL's loss) against DAPO on the same base."""
  del arg
  return [{"name": loss, "rl.loss": loss} for loss in ("cispo", "dapo")]
