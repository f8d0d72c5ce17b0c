"""The search task (data/search_task.py), built so that the recipe can decide
the ceiling, and the pilot that checks whether it does (issue 49).

The warm-started base tries the prompt's digits in a random order until it
finds the odd one; the generation budget admits only two tries, so RL raises
the pass rate only as far as it learns to pick the odd digit, at tokens of
real entropy. Every point of a seed's sweep starts from that seed's one base
policy. The pilot, CISPO against DAPO at k = 8 with the generator running
ahead until k binds (docs/search_task.md), one sweep per seed, then the
verdict from the differences within seeds:

  python -m launch.sweep --sweep=configs/search.py \
      --workdir=/tmp/search/pilot/seed=0 --set=seed=0
  python -m launch.paired --workdirs=/tmp/search/pilot \
      --first=cispo --second=dapo --last=2

`search.py:variant=<name>` picks the model size of configs/scalerl.py.
"""

from configs import scalerl

# Decode steps per train step, in units of sampling.max_new_tokens
# (configs/ablations/off_policy.py): the generator runs ahead until k holds it.
RUN_AHEAD = 4


def get_config(arg=None):
  """configs/scalerl.py's config for `arg` on the search task."""
  c = scalerl.get_config(arg)
  c.data.source = "builtin_search"  # data/search_task.py.
  c.data.builtin_difficulty = (1, 2, 3)  # All three search levels.
  # RL prompts, from the `train` split (it holds 132, 516 and 1,552 of
  # levels 1-3: all of levels 1 and 2, then level 3).
  c.data.builtin_num_train = 2_000
  # Validation prompts, from the `val` split (it holds 20 of level 1: all of
  # them, then 65 of each other level).
  c.data.builtin_num_val = 150
  # "Compute 0 2 8 1 6 4" is 14 tokens with BOS.
  c.sampling.max_prompt_len = 16
  # Room for 2 tries ("<think> 8=0 1=1 </think>\nAnswer: 1" and EOS are 17
  # tokens): the base, picking uniformly, solves 2/3, 1/2 and 1/3 of the
  # problems of levels 1-3.
  c.sampling.max_new_tokens = 18
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
  c.buffer.decode_steps_per_train_step = RUN_AHEAD * c.sampling.max_new_tokens
  return c


def get_sweep(arg=None):
  """The pilot: CISPO (ScaleRL's loss) against DAPO on the same base."""
  del arg
  return [{"name": loss, "rl.loss": loss} for loss in ("cispo", "dapo")]
