"""The half-run prediction experiment: the default, 480 steps, one shared base.

For the issue "Predict and rank at small scale" (docs/prediction.md, README
"Fitting"). It differs from configs/default_long.py (120 steps) in three ways:

- 480 RL steps with validation every 10, four times as long: the 120-step
  runs rose fast to ~0.47 by step 50 and then crept on, so their first half
  held only the fast phase and a sigmoid fitted to it saturated too early.
- every seed starts from one base policy (`trainer.warm_start_seed = 0`), as
  the paper's repeated runs start from one pretrained model; in the 120-step
  runs each seed warm-started its own base, and the bases' step-0 scores
  already differed (0.187, 0.186, 0.201).
- the learning rate is the paper's constant schedule (1.5e-4 after a 10-step
  warmup), so the first N steps of this run are the same whatever num_steps
  is: a run stopped at step 240 is the 240-step run of the same recipe.

  python -m launch.train --config=configs/prediction.py \
      --workdir=/tmp/pred/seed=0
  python -m launch.train --config=configs/prediction.py --config.seed=1 \
      --workdir=/tmp/pred/seed=1
  python -m launch.fit --workdirs=/tmp/pred --fit_fraction=0.5 --x=compute/flops
"""

from configs import scalerl


def get_config(arg=None):
  """configs/scalerl.py's config for `arg`: 480 steps,
  constant LR, base seed 0."""
  c = scalerl.get_config(arg)
  c.trainer.num_steps = 480
  c.trainer.eval_every = 10
  c.trainer.warm_start_seed = 0
  c.optim.schedule = "constant"
  c.optim.learning_rate = c.optim.learning_rate / 2
  return c
