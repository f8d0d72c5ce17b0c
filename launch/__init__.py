"""Command-line entry points: `python -m launch.<name>`, from the repo root."""

import os

from absl import flags

# Runs start here. configs/ and launch/ stay in the checkout (setup.py installs
# only scalerl_jax), so the launchers pass the library the paths that need it.
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def define_checkpoint_flags() -> tuple[flags.FlagHolder, ...]:
  """--workdir, --step, --process_id of the launchers reading a checkpoint."""
  return (
      flags.DEFINE_string("workdir", None, "The run's workdir.", required=True),
      flags.DEFINE_integer(
          "step", None, "Checkpoint step; default: the latest."
      ),
      flags.DEFINE_integer(
          "process_id",
          None,
          "This process's index when a multi-host run is read on all its "
          "hosts (the recorded config.json holds process 0's "
          "mesh.process_id); default: as recorded.",
      ),
  )
