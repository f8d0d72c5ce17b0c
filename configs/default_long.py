"""The default experiment, twice as long and validated twice as often.

For the half-run prediction (issue "Predict and rank at small scale", README
"Fitting"): 120 RL steps with validation every 5, so that the first half of
the compute holds 12 validations after step 0 and the curve has bent inside
it. Everything else, the warm-started base policy included, is the default
experiment's (configs/scalerl.py); the cosine decay stretches to the longer
run, as the default's reaches its floor at its last step.

  python -m launch.train --config=configs/default_long.py --workdir=/tmp/long_seed0
  python -m launch.train --config=configs/default_long.py --config.seed=1 \
      --workdir=/tmp/long_seed1
  python -m launch.fit --workdirs=/tmp/long_seed0,/tmp/long_seed1 --fit_fraction=0.5
"""

from configs import scalerl


def get_config(arg=None):
  """configs/scalerl.py's config for `arg`, with 120 steps validated every 5."""
  c = scalerl.get_config(arg)
  c.trainer.num_steps = 120
  c.trainer.eval_every = 5
  c.optim.decay_steps = c.trainer.num_steps - c.optim.warmup_steps
  return c
