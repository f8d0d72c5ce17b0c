"""The default experiment at the paper's constant learning rate, twice as long.

For the half-run prediction (issue "Predict and rank at small scale", README
"Fitting"): 120 RL steps with validation every 5, so that the first half of
the compute holds 11 validations after step 0. The learning rate is constant
after warmup, as in the paper, at half the default's peak (1.5e-4): a fit on
the first half of a run can only predict the second if the recipe does not
change on the way, and a cosine decay does (the schedule depends on the run's
length). Measured: the default's cosine decay stretched to 120 steps rose
again in the second half, 0.07 above what its first half predicted
(docs/prediction.md). Everything else, the warm-started base policy
included, is the default experiment's (configs/scalerl.py).

  python -m launch.train --config=configs/default_long.py \
      --workdir=/tmp/long_seed0
  python -m launch.train --config=configs/default_long.py --config.seed=1 \
      --workdir=/tmp/long_seed1
  python -m launch.fit --workdirs=/tmp/long_seed0,/tmp/long_seed1 \
      --fit_fraction=0.5
"""

from configs import scalerl


def get_config(arg=None):
  """configs/scalerl.py's config for `arg`: 120 steps validated
  every 5, constant LR."""
  c = scalerl.get_config(arg)
  c.trainer.num_steps = 120
  c.trainer.eval_every = 5
  c.optim.schedule = "constant"
  c.optim.learning_rate = c.optim.learning_rate / 2
  return c
