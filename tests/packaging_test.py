"""Tests of the packaging: what an install puts on the path,
and the pinned versions."""

import ast
import importlib.metadata
import os
import subprocess
import sys

from packaging import requirements
from packaging import version
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JAX_LIBRARIES = ("jax", "flax", "optax", "orbax-checkpoint", "grain")


def _runtime_requirements():
  """setup.py's `_RUNTIME` list, read from the file
  (running it would install)."""
  with open(os.path.join(REPO, "setup.py")) as f:
    tree = ast.parse(f.read())
  (node,) = [
      n
      for n in tree.body
      if isinstance(n, ast.Assign) and n.targets[0].id == "_RUNTIME"
  ]
  return {
      r.name: r
      for r in map(requirements.Requirement, ast.literal_eval(node.value))
  }


def _constraints():
  with open(os.path.join(REPO, "constraints.txt")) as f:
    pins = [
        line.split("==")
        for line in f.read().splitlines()
        if line and line[0] != "#"
    ]
  return {name.lower(): pinned for name, pinned in pins}


def _imports_outside_the_checkout(module, tmp_path):
  """Whether `import module` works in a fresh interpreter started away
  from the repository."""
  env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
  proc = subprocess.run(
      [sys.executable, "-c", f"import {module}"],
      cwd=tmp_path,
      env=env,
      capture_output=True,
      text=True,
      timeout=120,
      check=False,
  )
  return proc.returncode == 0


@pytest.mark.parametrize("module", ["configs", "launch"])
def test_checkout_folders_are_not_installed(module, tmp_path):
  assert not _imports_outside_the_checkout(module, tmp_path)


def test_library_and_sweep_import_without_the_checkout(tmp_path):
  # scalerl_jax.jobs.sweep is handed the base config;
  # it must not import configs/.
  assert _imports_outside_the_checkout("scalerl_jax.jobs.sweep", tmp_path)


@pytest.mark.parametrize("name", JAX_LIBRARIES)
def test_jax_libraries_are_bounded_below_the_next_minor_version(name):
  requirement = _runtime_requirements()[name]
  specs = {
      s.operator: version.Version(s.version) for s in requirement.specifier
  }
  assert set(specs) == {">=", "<"}, requirement
  low, high = specs[">="], specs["<"]
  assert (high.major, high.minor, high.micro) == (
      low.major,
      low.minor + 1,
      0,
  ), requirement
  # The range holds the version installed here and the one constraints.txt pins.
  assert importlib.metadata.version(name) in requirement.specifier
  assert _constraints()[name] in requirement.specifier


def test_constraints_leave_out_the_package_itself():
  pins = _constraints()
  assert set(name.lower() for name in JAX_LIBRARIES) <= set(pins)
  assert not {"scalerl_jax", "scalerl-jax"} & set(pins)


def test_readme_installs_with_the_constraints_outside_the_two_setup_commands():
  with open(os.path.join(REPO, "README.md")) as f:
    readme = f.read()
  setup = readme.split("```bash\n", 1)[1].split("```", 1)[0]
  commands = [
      line for line in setup.splitlines() if line and not line.startswith("#")
  ]
  assert len(commands) == 2 and "constraints.txt" not in setup
  assert commands[1].endswith("--durations=15")
  assert 'pip install -e ".[test,tasks,hf]" -c constraints.txt' in readme
