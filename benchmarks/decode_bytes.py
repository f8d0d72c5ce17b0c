"""Where a decode step's bytes go on a TPU slice, from the TPU compiler.

  python -m benchmarks.decode_bytes \
      --config=configs/scalerl.py:variant=qwen3_0.6b --topology=v5p:4x4x4 \
      --config.trainer.microbatches=12

Compiles the run's decode program (`Sampler.advance` over every slot, as
`launch.compile` builds it) for `--topology`: as configured, then with plain
attention (`sampling.decode_attention=plain`) as is and with the ablations
of benchmarks/decode_parts.py (the decode step's attention replaced by a
pass-through; also without its cache writes). For each it prints
`cost_analysis()["bytes accessed"]` of one step and the compiler's
temporaries (read as the planner reads them, `aot.compiled_memory`), beside
the floor: the weights each chip multiplies by plus its
slots' cache, read once. The cost analysis does not see inside Pallas
kernels, so the Pallas decode kernel's reads (the cache at full length,
once, by its block specs) are added to its row. The ablated programs are not
samplers; their differences bound what attention and the cache writes cost.
`cost_analysis()` also counts the TPU's copies into on-chip memory as
accesses, so a figure above the floor is not all HBM traffic (docs/tpu.md).
Needs libtpu (`pip install -e ".[tpu]"`), not a TPU.
"""

from absl import app
from absl import flags
from ml_collections import config_flags

from benchmarks import decode_parts
from scalerl_jax import config as config_lib
from scalerl_jax import sharding
from scalerl_jax.jobs.planner import aot
from scalerl_jax.jobs.planner import aot_programs
from scalerl_jax.jobs.planner import topology

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
  devices, chip = topology.slice_devices(_TOPOLOGY.value)
  config_lib.validate(config, num_devices=len(devices))
  mesh = sharding.make_mesh(config.mesh, devices)
  rules = sharding.logical_rules(config.mesh)
  print(f"{_TOPOLOGY.value}: {len(devices)} chips, mesh {dict(mesh.shape)}")
  print("| decode step | bytes accessed GB | / floor | temporaries GB |")
  print("|---|---|---|---|")
  configured = config.sampling.decode_attention
  runs = [(f"sampler (decode_attention={configured})", configured, {})] + [
      (f"{name}, plain attention", "plain", parts)
      for name, parts in decode_parts.ABLATIONS.items()
  ]
  for name, kernel, parts in runs:
    config.sampling.decode_attention = kernel
    # Programs built anew for each: a jitted function keeps its first trace.
    programs = aot_programs.build_programs(config, mesh, rules)
    floor = programs.decode_floor["decode"]
    options = sharding.hbm_budget_options(
        "tpu", chip.hbm_bytes - programs.beside["decode"]
    )
    with decode_parts.substituted(parts):
      compiled = programs.lower["decode"]().compile(options)
    used = compiled.cost_analysis()["bytes accessed"]
    used += programs.kernel_reads.get("decode", 0)
    temps = aot.compiled_memory(compiled, "tpu").temporaries
    print(
        f"| {name} | {used / GB:.2f} | {used / floor:.2f}x | {temps / GB:.2f} |"
    )
  print(f"floor (weights + every slot's cache, read once): {floor / GB:.2f} GB")


if __name__ == "__main__":
  app.run(main)
