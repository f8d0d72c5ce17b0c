"""Command-line entry points, run from the repository root: `python -m launch.<name>`.

This folder and configs/ stay in the checkout (setup.py installs only
scalerl_jax), so the launchers pass the library the paths that depend on it.
"""

import os

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # Runs start here.
