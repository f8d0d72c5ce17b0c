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


def _constraint_files():
  """constraints/<python line>_jax<version>.txt -> {package: pinned version}:
  one tested environment per Python line, named for what it pins."""
  folder = os.path.join(REPO, "constraints")
  files = {}
  for name in sorted(os.listdir(folder)):
    with open(os.path.join(folder, name)) as f:
      pins = [
          line.split("==")
          for line in f.read().splitlines()
          if line and line[0] != "#"
      ]
    files[name] = {name.lower(): pinned for name, pinned in pins}
  return files


def _python_line(name):
  """'python3.12_jax0.12.0.1.txt' -> (3, 12)."""
  major, minor = name.split("_")[0].removeprefix("python").split(".")
  return int(major), int(minor)


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


def test_each_constraints_file_is_named_for_its_python_and_jax():
  files = _constraint_files()
  assert len(files) >= 2, files.keys()
  for name, pins in files.items():
    line = _python_line(name)
    jax_version = name.removesuffix(".txt").split("_jax")[1]
    assert pins["jax"] == pins["jaxlib"] == jax_version, name
    with open(os.path.join(REPO, "constraints", name)) as f:
      assert f"Python {line[0]}.{line[1]}" in f.read(), name
  # The file for the Python running the tests pins what is installed here.
  mine = [
      pins
      for name, pins in files.items()
      if _python_line(name) == sys.version_info[:2]
  ]
  if mine:
    (pins,) = mine
    for name in JAX_LIBRARIES:
      assert importlib.metadata.version(name) == pins[name], name


@pytest.mark.parametrize("name", JAX_LIBRARIES)
def test_jax_libraries_are_bounded_by_the_tested_versions(name):
  # From the oldest tested version (the lowest pin among the constraints
  # files) up to, not including, the minor version after the newest one.
  requirement = _runtime_requirements()[name]
  specs = {
      s.operator: version.Version(s.version) for s in requirement.specifier
  }
  assert set(specs) == {">=", "<"}, requirement
  pinned = sorted(
      version.Version(pins[name]) for pins in _constraint_files().values()
  )
  assert specs[">="] == pinned[0], (requirement, pinned)
  newest = pinned[-1]
  assert specs["<"] == version.Version(f"{newest.major}.{newest.minor + 1}")
  assert importlib.metadata.version(name) in requirement.specifier


def test_constraints_leave_out_the_package_itself():
  for pins in _constraint_files().values():
    assert set(name.lower() for name in JAX_LIBRARIES) <= set(pins)
    assert not {"scalerl_jax", "scalerl-jax"} & set(pins)


def test_readme_installs_with_the_constraints_outside_the_two_setup_commands():
  with open(os.path.join(REPO, "README.md")) as f:
    readme = f.read()
  setup = readme.split("```bash\n", 1)[1].split("```", 1)[0]
  commands = [
      line for line in setup.splitlines() if line and not line.startswith("#")
  ]
  assert len(commands) == 2 and "constraints" not in setup
  assert commands[1].endswith("--durations=15")
  for name in _constraint_files():
    assert f'pip install -e ".[test,tasks,hf]" -c constraints/{name}' in readme
