"""Compiles a run's programs for a TPU slice with the TPU compiler, no TPU.

  pip install "jax[tpu]==0.10.2"   # libtpu 0.0.42.1, the TPU compiler
  python -m launch.compile --config=configs/scalerl.py:variant=qwen3_0.6b \
      --topology=v5p:4x4x4
  python -m launch.compile --config=configs/scalerl.py:variant=llama3_8b \
      --config.mesh.shape='(1,-1,4)' --topology=v5e:16x16 \
      --programs=train_step,decode
  python -m launch.compile --config=... --topology=local   # this machine's GPU

Prints, per chip, the compiler's bytes of every program a run executes, the
planner's estimate beside each, what the rest of the run holds meanwhile,
and whether it fits, with the compiler's message when it refuses. On TPU
each program is compiled within the HBM the rest of the run leaves it;
`--check_planner` compiles again within 1.2x the planner's figure.

Then each program's roofline time from the compiler's cost analysis, and
from them the estimated time of one RL step and of the whole run
(`--completion_len`): estimates, not measurements.

With --config.mesh.layout=disaggregated the slice is split between the
roles (--config.mesh.generator_devices; 0: half): the train step compiled
for the trainer's devices, the sampler's programs for the generator's, each
role's bytes per device, and the weight sync's bytes and roofline per step
beside published syncs (docs/design/disaggregated.md).
"""

import json

from absl import app
from absl import flags
from ml_collections import config_flags

from scalerl_jax import config as config_lib
from scalerl_jax import sharding
from scalerl_jax.jobs.planner import aot
from scalerl_jax.jobs.planner import aot_report
from scalerl_jax.jobs.planner import aot_roles
from scalerl_jax.jobs.planner import roles_report
from scalerl_jax.jobs.planner import step_estimate
from scalerl_jax.jobs.planner import topology

_CONFIG = config_flags.DEFINE_config_file(
    "config",
    None,
    "Experiment config file (e.g. configs/scalerl.py:variant=qwen3_0.6b).",
    lock_config=True,
)
_TOPOLOGY = flags.DEFINE_string(
    "topology", None, f"TPU slice: {topology.TOPOLOGY_FORMS}."
)
_PROGRAMS = flags.DEFINE_list(
    "programs", [], "Programs to compile (default all)."
)
_CHECK_PLANNER = flags.DEFINE_bool(
    "check_planner",
    False,
    "TPU: compile again, within 1.2x the planner's peak, each program that "
    "took more when given the chip (the compiler fills the HBM it is given).",
)
_COMPLETION_LEN = flags.DEFINE_integer(
    "completion_len",
    0,
    "Tokens of every completion in the step estimate; 0 = "
    "sampling.max_new_tokens (every completion at the full budget).",
)
_JSON = flags.DEFINE_string(
    "json", "", "Also write the results to this JSON file."
)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  if _CONFIG.value is None or not _TOPOLOGY.value:
    raise app.UsageError("--config and --topology are required")
  try:
    counts = step_estimate.step_counts(_CONFIG.value, _COMPLETION_LEN.value)
  except ValueError as e:
    raise app.UsageError(f"--{e}") from None
  disaggregated = sharding.layout_of(_CONFIG.value.mesh) == "disaggregated"
  compile_fn = (
      aot_roles.compile_roles_for_slice
      if disaggregated
      else aot.compile_for_slice
  )
  try:
    compiled = compile_fn(
        _CONFIG.value,
        _TOPOLOGY.value,
        _PROGRAMS.value or None,
        progress=lambda line: print(line, flush=True),
        check_planner=_CHECK_PLANNER.value,
    )
  except (topology.CompileError, config_lib.ConfigError) as e:
    raise SystemExit(f"launch.compile: {e}") from None
  if disaggregated:
    report = roles_report.format_roles_report(compiled, _TOPOLOGY.value, counts)
    data = roles_report.roles_json(compiled, _TOPOLOGY.value, counts)
  else:
    report = aot_report.format_report(*compiled, _TOPOLOGY.value, counts)
    data = aot_report.results_json(*compiled, _TOPOLOGY.value, counts)
  print(report, end="")
  if _JSON.value:
    with open(_JSON.value, "w") as f:
      json.dump(data, f, indent=1)


if __name__ == "__main__":
  app.run(main)
