"""mean@k / pass@k of a checkpoint (or the base policy) on held-out prompts.

  python -m launch.evaluate --workdir=/tmp/scalerl_default
  python -m launch.evaluate --workdir=/tmp/scalerl_default \
      --step=20 --num_prompts=200 --samples=16
  python -m launch.evaluate --workdir=/tmp/scalerl_default --repeats=5

Uses the run's recorded config (config.json), only the checkpoint's policy
parameters, and the trainer's validation prompts and sampling key: on the
last checkpoint it reproduces the run's last validation numbers.
"""

import json

from absl import app
from absl import flags

from scalerl_jax.checkpoint import policy
from scalerl_jax import experiment

_WORKDIR = flags.DEFINE_string(
    "workdir", None, "The run's workdir.", required=True
)
_STEP = flags.DEFINE_integer(
    "step", None, "Checkpoint step; default: the latest."
)
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
_PROCESS_ID = flags.DEFINE_integer(
    "process_id",
    None,
    "This process's index when a multi-host run is read on all its hosts "
    "(the recorded config.json holds process 0's mesh.process_id); default: as recorded.",
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
    )
  except (ValueError, FileNotFoundError) as e:
    raise SystemExit(f"launch.evaluate: {e}") from None
  print(json.dumps(result, indent=2, sort_keys=True))


if __name__ == "__main__":
  app.run(main)
