"""Ablation grids: load a sweep file, build each point's config and command.

A sweep file (`configs/ablations/*.py`) defines `get_config(arg)`, its base
config, and `get_sweep(arg)`: points, each a dict of dotted config overrides
plus a "name". A point runs in `<sweep_dir>/<name>` and is finished iff its
`DONE` file exists, so rerunning a sweep resumes it.

Design: docs/design/sweeps.md.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import os
import re
import shlex
import subprocess
import sys
import time
from typing import Any, Callable, Optional, Sequence

from absl import logging
import ml_collections

from scalerl_jax import config as config_lib
from scalerl_jax import workdir as workdir_lib

# As the training launcher sees it from the repository root.
BASE_CONFIG = "configs/scalerl.py"
LOG = "log.txt"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.=+-]*$")


@dataclasses.dataclass(frozen=True)
class Point:
  """One run of a grid."""

  name: str  # Also the name of its workdir.
  variant: str  # configs/scalerl.py variant.
  overrides: dict[str, Any]  # Dotted field -> value, on top of the variant.


@dataclasses.dataclass(frozen=True)
class Outcome:
  """What happened to one point in a local sweep."""

  # "skipped" (already finished), "finished", "failed" or "incomplete".
  state: str
  returncode: Optional[int]
  log: str  # Path of the point's log.txt.
  tail: str = ""  # Last lines of the log, for failed and incomplete points.


def load_module(path):
  """The sweep file at `path` as a module; it must define get_config and
  get_sweep."""
  if not os.path.isfile(path):
    raise FileNotFoundError(f"{path}: no such sweep file")
  name = "_sweep_" + re.sub(
      r"\W", "_", os.path.splitext(os.path.basename(path))[0]
  )
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  for fn in ("get_config", "get_sweep"):
    if not callable(getattr(module, fn, None)):
      raise ValueError(f"{path}: a sweep file must define {fn}(arg=None)")
  return module


def load_sweep(spec: str, base_config: workdir_lib.BaseConfig) -> list[Point]:
  """The points of a sweep file, validated, in the file's order.

  `spec` is "path/to/sweep.py[:arg]", `arg` going to the file's get_config
  and get_sweep; `base_config` is BASE_CONFIG's get_config. Raises ValueError
  for a point without a unique usable name or whose config does not build or
  validate, naming the file, point and field.
  """
  path, _, arg = spec.partition(":")
  module = load_module(path)
  base = module.get_config(arg or None)
  reference = workdir_lib.config_leaves(base_config(f"variant={base.variant}"))
  shared = {
      k: v
      for k, v in workdir_lib.config_leaves(base).items()
      if reference.get(k) != v and k != "variant"
  }
  points, names = [], set()
  for i, raw in enumerate(module.get_sweep(arg or None)):
    raw = dict(raw)
    name = raw.pop("name", None)
    if not isinstance(name, str) or not _NAME.match(name) or name in names:
      raise ValueError(
          f"{path}: point {i} needs a unique 'name' of letters, digits and "
          f"'_.=+-' (it names the workdir); got {name!r}"
      )
    names.add(name)
    point = Point(name, raw.pop("variant", base.variant), {**shared, **raw})
    try:
      build_config(point, base_config)
    except (ValueError, TypeError) as e:
      raise ValueError(f"{path}: {e}") from None
    points.append(point)
  if not points:
    raise ValueError(f"{path}: get_sweep returned no points")
  return points


def build_config(
    point: Point, base_config: workdir_lib.BaseConfig
) -> ml_collections.ConfigDict:
  """The validated config of `point`: its variant with its overrides applied.

  ValueError (or ConfigError) names the point and the override or field.
  """
  config = base_config(f"variant={point.variant}")
  for key, value in point.overrides.items():
    *parents, leaf = key.split(".")
    node = config
    for part in parents:
      node = (
          node.get(part)
          if isinstance(node, ml_collections.ConfigDict)
          else None
      )
    if (
        not isinstance(node, ml_collections.ConfigDict)
        or leaf not in node
        or isinstance(node[leaf], ml_collections.ConfigDict)
    ):
      raise ValueError(
          f"point {point.name!r}: {key!r} is not a field of {BASE_CONFIG}"
      )
    try:
      node[leaf] = value
    except TypeError as e:
      raise ValueError(f"point {point.name!r}: {key}={value!r}: {e}") from None
  try:
    config_lib.validate(config)
  except config_lib.ConfigError as e:
    raise config_lib.ConfigError(f"point {point.name!r}: {e}") from None
  return config


def format_value(value: Any) -> str:
  """A bool, int, float, str or tuple as config_flags parses it, unquoted."""
  if isinstance(value, bool):
    return "True" if value else "False"
  if isinstance(value, (int, str)):
    return str(value)
  if isinstance(value, float):
    return repr(value)
  if isinstance(value, (tuple, list)):
    return repr(tuple(value))
  raise TypeError(
      f"cannot pass a {type(value).__name__} ({value!r}) as a config flag"
  )


def train_command(
    point: Point, workdir: str, python: str = "python"
) -> list[str]:
  """The argv that trains `point` in `workdir`, run from the repository root.

  `launch.train` with `--config=configs/scalerl.py:variant=...`, then one
  `--config.<field>=<value>` per override, sorted by field.
  """
  return [
      python,
      "-m",
      "launch.train",
      f"--config={BASE_CONFIG}:variant={point.variant}",
      f"--workdir={workdir}",
  ] + [
      f"--config.{k}={format_value(v)}"
      for k, v in sorted(point.overrides.items())
  ]


def parse_overrides(items: Sequence[str]) -> dict[str, Any]:
  """['rl.loss=dapo', ...] -> {field: value}: Python literals, else strings."""
  overrides = {}
  for item in items:
    field, sep, text = item.partition("=")
    if not sep or not field:
      raise ValueError(f"override {item!r}: expected field=value")
    try:
      overrides[field] = ast.literal_eval(text)
    except (ValueError, SyntaxError):
      overrides[field] = text
  return overrides


def with_overrides(
    points: Sequence[Point],
    overrides: dict[str, Any],
    base_config: workdir_lib.BaseConfig,
) -> list[Point]:
  """Every point with `overrides` applied on top, validated like the points."""
  out = [
      dataclasses.replace(p, overrides={**p.overrides, **overrides})
      for p in points
  ]
  for p in out:
    build_config(p, base_config)
  return out


def select(points: Sequence[Point], names: Sequence[str]) -> list[Point]:
  """The points named in `names`, in the grid's order; all when it is empty.

  Raises ValueError naming every unknown name and the grid's names.
  """
  if not names:
    return list(points)
  known = [p.name for p in points]
  unknown = [n for n in names if n not in known]
  if unknown:
    raise ValueError(
        f"no point named {', '.join(map(repr, unknown))}; the grid has "
        f"{', '.join(known)}"
    )
  return [p for p in points if p.name in names]


def share_warm_start(points: Sequence[Point], sweep_dir: str) -> list[Point]:
  """Points sharing `<sweep_dir>/base_policy` as their warm-start cache.

  Points that set `trainer.warm_start_dir` themselves keep it; the others with
  the same model and warm-start settings then train the base policy once.
  """
  shared = os.path.join(os.path.abspath(sweep_dir), workdir_lib.BASE_POLICY_DIR)
  return [
      p
      if "trainer.warm_start_dir" in p.overrides
      else dataclasses.replace(
          p, overrides={**p.overrides, "trainer.warm_start_dir": shared}
      )
      for p in points
  ]


def write_commands(
    points: Sequence[Point],
    sweep_dir: str,
    path: str,
    repo_root: str,
    python: str = "python",
) -> list[str]:
  """Writes each point's shell command line to `path`; returns the lines.

  They are to be run from `repo_root` (e.g. by a cluster scheduler).
  """
  sweep_dir = os.path.abspath(sweep_dir)
  lines = [
      shlex.join(train_command(p, os.path.join(sweep_dir, p.name), python))
      for p in points
  ]
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, "w") as f:
    f.write(
        f"# {len(lines)} runs; run each line from {repo_root}. A run is finished when "
        f"<workdir>/{workdir_lib.DONE_FILE} exists.\n"
    )
    f.write("\n".join(lines) + "\n")
  return lines


def _tail(path, lines=5):
  with open(path, "rb") as f:
    f.seek(max(0, os.path.getsize(path) - 4096))
    return b"\n".join(f.read().splitlines()[-lines:]).decode(errors="replace")


def run_local(
    points: Sequence[Point],
    sweep_dir: str,
    repo_root: str,
    *,
    parallel: int = 1,
    python: str = sys.executable,
    poll_s: float = 1.0,
    command: Optional[Callable[[Point, str], list[str]]] = None,
) -> dict[str, Outcome]:
  """Runs the unfinished points as local processes, `parallel` at a time.

  Each runs from `repo_root`, its output appended to `<workdir>/log.txt`. A
  failing point does not stop the others; on an interrupt the running ones
  are terminated (rerunning resumes). `command(point, workdir)` gives the
  argv (default: `train_command`). Returns point name -> Outcome, in order.
  """
  if parallel < 1:
    raise ValueError(f"parallel must be >= 1; got {parallel}")
  command = command or (lambda p, w: train_command(p, w, python))
  outcomes, pending, running = {}, [], {}
  for p in points:
    workdir = os.path.abspath(os.path.join(sweep_dir, p.name))
    if workdir_lib.is_finished(workdir):
      outcomes[p.name] = Outcome("skipped", None, os.path.join(workdir, LOG))
      logging.info("%s: already finished, skipped", p.name)
    else:
      pending.append((p, workdir))
  try:
    while pending or running:
      while pending and len(running) < parallel:
        p, workdir = pending.pop(0)
        os.makedirs(workdir, exist_ok=True)
        argv = command(p, workdir)
        log = open(os.path.join(workdir, LOG), "ab")
        log.write(
            f"=== {time.strftime('%Y-%m-%d %H:%M:%S')} {shlex.join(argv)}\n".encode()
        )
        log.flush()
        running[p.name] = (
            subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, cwd=repo_root
            ),
            log,
            workdir,
        )
        logging.info("%s: started in %s", p.name, workdir)
      time.sleep(poll_s)
      for name, (proc, log, workdir) in list(running.items()):
        if proc.poll() is None:
          continue
        log.close()
        del running[name]
        done = workdir_lib.is_finished(workdir)
        state = (
            "failed"
            if proc.returncode
            else ("finished" if done else "incomplete")
        )
        outcomes[name] = Outcome(
            state,
            proc.returncode,
            log.name,
            "" if state == "finished" else _tail(log.name),
        )
        logging.info("%s: %s (exit code %d)", name, state, proc.returncode)
  finally:
    for proc, log, _ in running.values():
      proc.terminate()
      proc.wait()
      log.close()
  return {p.name: outcomes[p.name] for p in points}
