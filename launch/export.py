"""Exports a checkpoint's policy as a Hugging Face safetensors directory.

  python -m launch.export --workdir=/tmp/scalerl_default --out=/tmp/scalerl_hf

The result loads with `transformers.AutoModelForCausalLM.from_pretrained`
(Llama, Qwen2 or Qwen3 layout, from model.family), the run's tokenizer file
beside it. The run's recorded config (config.json) is used.
"""

from absl import app
from absl import flags

from scalerl_jax.checkpoint import policy
from scalerl_jax import experiment

_WORKDIR = flags.DEFINE_string(
    "workdir", None, "The run's workdir.", required=True
)
_OUT = flags.DEFINE_string("out", None, "Output directory.", required=True)
_STEP = flags.DEFINE_integer(
    "step", None, "Checkpoint step; default: the latest."
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
    files = policy.export_checkpoint(
        _WORKDIR.value, _OUT.value, _STEP.value, process_id=_PROCESS_ID.value
    )
  except (ValueError, FileNotFoundError) as e:
    raise SystemExit(f"launch.export: {e}") from None
  print(f"wrote {_OUT.value}: {', '.join(files)}")


if __name__ == "__main__":
  app.run(main)
