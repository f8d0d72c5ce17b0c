"""Command-line entry points: `python -m launch.<name>`, from the repo root."""

import os

# Runs start here. configs/ and launch/ stay in the checkout (setup.py installs
# only scalerl_jax), so the launchers pass the library the paths that need it.
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
