"""Runs an ablation grid, or writes its per-run commands for a cluster.

Locally, two runs at a time, resuming whatever an earlier call left unfinished:

  python -m launch.sweep --sweep=configs/ablations/loss_type.py \
      --workdir=/tmp/sweeps/loss_type --parallel=2

For a cluster, one command line per grid point into <workdir>/commands.sh:

  python -m launch.sweep \
      --sweep=configs/ablations/loss_type.py:variant=qwen3_0.6b \
      --workdir=/shared/sweeps/loss_type --mode=commands

Then `python -m launch.fit --workdirs=<workdir>` fits and plots the grid.
"""

import os
import sys

from absl import app
from absl import flags

from configs import scalerl
from launch import REPO_ROOT
from scalerl_jax.jobs import registration
from scalerl_jax.jobs import sweep

_SWEEP = flags.DEFINE_string(
    "sweep",
    None,
    "Sweep file, optionally with ':arg' for its get_config/get_sweep.",
    required=True,
)
_WORKDIR = flags.DEFINE_string(
    "workdir", None, "Sweep directory; one workdir per point.", required=True
)
_MODE = flags.DEFINE_enum(
    "mode",
    "local",
    ["local", "commands"],
    "local: run the points here; commands: write their command lines.",
)
_PARALLEL = flags.DEFINE_integer("parallel", 1, "local: runs at a time.")
_PYTHON = flags.DEFINE_string(
    "python",
    None,
    "Interpreter in the commands; default: this one locally, 'python' in files.",
)
_SET = flags.DEFINE_multi_string(
    "set",
    [],
    "field=value applied to every point, e.g. --set=trainer.eval_every=5.",
)
_POINTS = flags.DEFINE_list(
    "points",
    [],
    "Run only these points of the grid (by name), e.g. "
    "--points=pipeline_k8,ppo_k8; default: all.",
)
_COMMANDS_FILE = flags.DEFINE_string(
    "commands_file",
    None,
    "commands: output file; default <workdir>/commands.sh.",
)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  try:
    points = sweep.with_overrides(
        sweep.select(
            sweep.load_sweep(_SWEEP.value, scalerl.get_config), _POINTS.value
        ),
        sweep.parse_overrides(_SET.value),
        scalerl.get_config,
    )
  except (OSError, ValueError, TypeError) as e:
    raise SystemExit(f"launch.sweep: {e}") from None
  points = sweep.share_warm_start(points, _WORKDIR.value)
  # A plan's runs record when and from which code they first started
  # (jobs/registration.py), before any of them runs.
  plan_path = _SWEEP.value.partition(":")[0]
  if registration.defines_plan(plan_path):
    for p in points:
      try:
        registration.record_start(
            os.path.join(_WORKDIR.value, p.name), plan_path, REPO_ROOT
        )
      except ValueError as e:
        raise SystemExit(f"launch.sweep: {e}") from None
  if _MODE.value == "commands":
    path = _COMMANDS_FILE.value or os.path.join(_WORKDIR.value, "commands.sh")
    lines = sweep.write_commands(
        points, _WORKDIR.value, path, REPO_ROOT, _PYTHON.value or "python"
    )
    print("\n".join(lines))
    print(f"wrote {len(lines)} commands to {path}", file=sys.stderr)
    return
  outcomes = sweep.run_local(
      points,
      _WORKDIR.value,
      REPO_ROOT,
      parallel=_PARALLEL.value,
      python=_PYTHON.value or sys.executable,
  )
  width = max(len(name) for name in outcomes)
  for name, outcome in outcomes.items():
    code = (
        ""
        if outcome.returncode is None
        else f" (exit code {outcome.returncode})"
    )
    print(f"{name.ljust(width)}  {outcome.state}{code}  {outcome.log}")
    for line in outcome.tail.splitlines():
      print(f"{'':{width}}  | {line}")
  bad = [n for n, o in outcomes.items() if o.state in ("failed", "incomplete")]
  if bad:
    raise SystemExit(
        f"launch.sweep: {len(bad)} of {len(outcomes)} runs did not finish: "
        f"{', '.join(bad)}; see their log.txt, then rerun to resume"
    )


if __name__ == "__main__":
  app.run(main)
