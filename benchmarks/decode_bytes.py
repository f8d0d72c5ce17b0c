"""Where a decode step's bytes go on a TPU slice, from the TPU compiler.

  python -m benchmarks.decode_bytes \
      --config=configs/scalerl.py:variant=qwen3_0.6b --topology=v5p:4x4x4 \
      --config.trainer.microbatches=12

Compiles the run's decode program (`Sampler.advance` over every slot, as
`launch.compile` builds it) for `--topology` three times: as shipped, and with
the ablations of benchmarks/decode_parts.py (the decode step's attention
replaced by a pass-through; also without its cache writes). For each it
prints `cost_analysis()["bytes accessed"]` of one step and the compiler's
temporaries, beside the floor: the weights each chip multiplies by plus its
slots' cache, read once. The ablated programs are not samplers; their
differences bound what attention and the cache writes cost.
`cost_analysis()` also counts the TPU's copies into on-chip memory as
accesses, so a figure above the floor is not all HBM traffic (docs/tpu.md).
Needs libtpu (`pip install "jax[tpu]==0.10.2"`), not a TPU.
"""

from absl import app
from absl import flags
from ml_collections import config_flags

from benchmarks import decode_parts
from scalerl_jax import config as config_lib
from scalerl_jax import sharding
from scalerl_jax.jobs import aot

_CONFIG = config_flags.DEFINE_config_file(
    "config", "configs/scalerl.py:variant=qwen3_0.6b", "Run config."
)
_TOPOLOGY = flags.DEFINE_string(
    "topology", "v5p:4x4x4", "TPU slice, as launch.compile takes it."
)

GB = 1e9


def main(argv):
  del argv
  config = _CONFIG.value
  devices, chip = aot.slice_devices(_TOPOLOGY.value)
  config_lib.validate(config, num_devices=len(devices))
  mesh = sharding.make_mesh(config.mesh, devices)
  rules = sharding.logical_rules(config.mesh)
  print(f"{_TOPOLOGY.value}: {len(devices)} chips, mesh {dict(mesh.shape)}")
  print("| decode step | bytes accessed GB | / floor | temporaries GB |")
  print("|---|---|---|---|")
  for name, parts in decode_parts.ABLATIONS.items():
    # Programs built anew for each: a jitted function keeps its first trace.
    programs = aot._programs(config, mesh, rules)  # pylint: disable=protected-access
    floor = programs.decode_floor["decode"]
    options = sharding.hbm_budget_options(
        "tpu", chip.hbm_bytes - programs.beside["decode"]
    )
    with decode_parts.substituted(parts):
      compiled = programs.lower["decode"]().compile(options)
    used = compiled.cost_analysis()["bytes accessed"]
    temps = compiled.memory_analysis().temp_size_in_bytes
    print(
        f"| {name} | {used / GB:.2f} | {used / floor:.2f}x | {temps / GB:.2f} |"
    )
  print(f"floor (weights + every slot's cache, read once): {floor / GB:.2f} GB")


if __name__ == "__main__":
  app.run(main)
