"""Runs (or resumes) an RL experiment.

  python -m launch.train --config=configs/scalerl.py \
      --workdir=/tmp/scalerl_default
  python -m launch.train --config=configs/scalerl.py:variant=qwen3_0.6b \
      --config.model.hf_path=/ckpts/Qwen3-0.6B --workdir=/tmp/qwen3 \
      --config.rl.loss=dapo

A workdir that holds a checkpoint resumes from its latest one. On a
multi-host cluster run the same command on every host with
--config.mesh.distributed=true (see README.md, "Scaling out").
"""

from absl import app
from absl import flags
from ml_collections import config_flags

from scalerl_jax import config as config_lib
from scalerl_jax import experiment
from scalerl_jax import trainer

_CONFIG = config_flags.DEFINE_config_file(
    "config",
    None,
    "Experiment config file (e.g. configs/scalerl.py:variant=tiny_cpu).",
    lock_config=True,
)
_WORKDIR = flags.DEFINE_string(
    "workdir", None, "Directory for checkpoints, metrics, logs.", required=True
)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  if _CONFIG.value is None:
    raise app.UsageError(
        "--config is required, e.g. --config=configs/scalerl.py"
    )
  experiment.configure_logging()
  try:
    last = trainer.train_and_evaluate(_CONFIG.value, _WORKDIR.value)
  except (
      config_lib.ConfigError,
      ValueError,
      OSError,
      FloatingPointError,
      RuntimeError,
  ) as e:
    raise SystemExit(f"launch.train: {e}") from None
  if "val/mean_at_k" in last:
    print(
        f"final validation mean@k: {last['val/mean_at_k']:.3f} (metrics in "
        f"{_WORKDIR.value}/metrics.jsonl)"
    )


if __name__ == "__main__":
  app.run(main)
