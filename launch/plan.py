"""Prints memory and FLOPs per device for a config, and where it fits.

  python -m launch.plan --config=configs/scalerl.py:variant=qwen3_0.6b \
      --num_devices=64
  python -m launch.plan --config=configs/scalerl.py:variant=llama3_8b \
      --config.mesh.shape='(1,8,1)' --accelerators=tpu_v5p,h200 --margin=0.15

The mesh is the config's, overridable like any field. --num_devices fills
its -1 axis; without it a mesh with no -1 plans for its own size, else for
the local devices. Nothing is allocated (docs/design/planner.md).
"""

from absl import app
from absl import flags
from ml_collections import config_flags

from scalerl_jax import config as config_lib
from scalerl_jax.jobs.planner import accelerators
from scalerl_jax.jobs.planner import plan
from scalerl_jax.jobs.planner import plan_report

_CONFIG = config_flags.DEFINE_config_file(
    "config",
    None,
    "Experiment config file (e.g. configs/scalerl.py:variant=qwen3_0.6b).",
    lock_config=True,
)
_NUM_DEVICES = flags.DEFINE_integer(
    "num_devices",
    None,
    "Devices to plan for; default: the mesh's size, or the local count.",
)
_ACCELERATORS = flags.DEFINE_list(
    "accelerators",
    list(accelerators.ACCELERATORS),
    f"Chips to check, from {sorted(accelerators.ACCELERATORS)}.",
)
_PLATFORM = flags.DEFINE_enum(
    "platform",
    "tpu",
    ["tpu", "gpu", "cpu"],
    "Where it runs: picks model.attention=auto's kernel, and on TPU pads arrays to its tiles.",
)
_MARGIN = flags.DEFINE_float(
    "margin",
    0.1,
    "Fraction of HBM kept free for XLA scratch space and fragmentation.",
)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  if _CONFIG.value is None:
    raise app.UsageError(
        "--config is required, e.g. --config=configs/scalerl.py"
    )
  if not 0 <= _MARGIN.value < 1:
    raise app.UsageError(f"--margin must be in [0, 1); got {_MARGIN.value}")
  if _NUM_DEVICES.value is not None and _NUM_DEVICES.value < 1:
    raise app.UsageError(
        f"--num_devices must be >= 1; got {_NUM_DEVICES.value}"
    )
  try:
    chips = accelerators.accelerators_named(_ACCELERATORS.value)
    num_devices = plan.resolve_num_devices(
        _CONFIG.value.mesh, _NUM_DEVICES.value
    )
    result = plan.make_plan(_CONFIG.value, num_devices, _PLATFORM.value)
  except (config_lib.ConfigError, ValueError) as e:
    raise SystemExit(f"launch.plan: {e}") from None
  print(plan_report.format_report(result, chips, _MARGIN.value), end="")


if __name__ == "__main__":
  app.run(main)
