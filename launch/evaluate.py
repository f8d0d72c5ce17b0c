"""mean@k / pass@k of a checkpoint (or the base policy) on held-out prompts.

  python -m launch.evaluate --workdir=/tmp/scalerl_default
  python -m launch.evaluate --workdir=/tmp/scalerl_default \
      --step=20 --num_prompts=200 --samples=16
  python -m launch.evaluate --workdir=/tmp/scalerl_default --repeats=5

Uses the run's recorded config (config.json; fields it predates take
configs/scalerl.py's defaults, with a warning naming them), only the
checkpoint's policy parameters, and the trainer's validation prompts and
sampling key: on the last checkpoint it reproduces the run's last validation
numbers.
"""

import json

from absl import app
from absl import flags

from configs import scalerl
import launch
from scalerl_jax import experiment
from scalerl_jax.checkpoint import policy

_WORKDIR, _STEP, _PROCESS_ID = launch.define_checkpoint_flags()
flags.adopt_module_key_flags(launch)
_NUM_PROMPTS = flags.DEFINE_integer(
    "num_prompts", None, "Default: trainer.eval_num_prompts."
)
_SAMPLES = flags.DEFINE_integer(
    "samples", None, "k of mean@k; default: trainer.eval_samples."
)
_REPEATS = flags.DEFINE_integer(
    "repeats",
    1,
    "Evaluations with different sampling keys (the first is the trainer's); "
    "above 1 the output adds each metric's standard deviation across them, the "
    "sampling noise of one evaluation.",
)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  experiment.configure_logging()
  try:
    result = policy.evaluate_checkpoint(
        _WORKDIR.value,
        _STEP.value,
        _NUM_PROMPTS.value,
        _SAMPLES.value,
        _REPEATS.value,
        process_id=_PROCESS_ID.value,
        defaults=scalerl.get_config,
    )
  except (ValueError, FileNotFoundError) as e:
    raise SystemExit(f"launch.evaluate: {e}") from None
  print(json.dumps(result, indent=2, sort_keys=True))


if __name__ == "__main__":
  app.run(main)
