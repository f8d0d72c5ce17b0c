"""Exports a checkpoint's policy as a Hugging Face safetensors directory.

  python -m launch.export --workdir=/tmp/scalerl_default --out=/tmp/scalerl_hf

The result loads with `transformers.AutoModelForCausalLM.from_pretrained`
(Llama, Qwen2 or Qwen3 layout, from model.family), the run's tokenizer file
beside it. The run's recorded config (config.json) is used; fields it
predates take configs/scalerl.py's defaults, with a warning naming them.
"""

from absl import app
from absl import flags

from configs import scalerl
import launch
from scalerl_jax import experiment
from scalerl_jax.checkpoint import policy

_WORKDIR, _STEP, _PROCESS_ID = launch.define_checkpoint_flags()
flags.adopt_module_key_flags(launch)
_OUT = flags.DEFINE_string("out", None, "Output directory.", required=True)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  experiment.configure_logging()
  try:
    files = policy.export_checkpoint(
        _WORKDIR.value,
        _OUT.value,
        _STEP.value,
        process_id=_PROCESS_ID.value,
        defaults=scalerl.get_config,
    )
  except (ValueError, FileNotFoundError) as e:
    raise SystemExit(f"launch.export: {e}") from None
  print(f"wrote {_OUT.value}: {', '.join(files)}")


if __name__ == "__main__":
  app.run(main)
