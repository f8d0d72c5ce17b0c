"""The resolved config a run records in its workdir, and what a resume changed in it.

The trainer writes `<workdir>/config.json` when a run starts (process 0), after
the experiment is built, so the model fields read from `model.hf_path` are in
it. `launch/evaluate` and `launch/export` read the run's config from there and
need no `--config`.

Resuming a workdir with a config that differs from the recorded one warns,
naming every differing field with both values, and then records the new
config. It warns instead of refusing because some changes are how runs are
used (more `trainer.num_steps` to extend a run, another `eval_every`, a moved
`warm_start_dir`), while a change that cannot work (a model shape) already
fails when the checkpoint is restored, naming the array. The warning stays in
the run's log, so a curve bent by a changed recipe can be traced to it.
"""

from __future__ import annotations

import json
import os
from typing import Any, Optional

from absl import logging
import jax
import ml_collections

FILE = "config.json"


def _tuples(value: Any) -> Any:
  """JSON lists back to the tuples the config holds (configs use no lists)."""
  if isinstance(value, dict):
    return {k: _tuples(v) for k, v in value.items()}
  if isinstance(value, list):
    return tuple(_tuples(v) for v in value)
  return value


def _leaves(tree: dict, prefix: str = "") -> dict[str, Any]:
  out = {}
  for key, value in tree.items():
    if isinstance(value, dict):
      out.update(_leaves(value, f"{prefix}{key}."))
    else:
      out[f"{prefix}{key}"] = value
  return out


def _plain(config: ml_collections.ConfigDict) -> dict:
  """The config as JSON would give it back (tuples, no ConfigDicts)."""
  return _tuples(json.loads(config.to_json()))


def load(workdir: str, process_id: Optional[int] = None) -> ml_collections.ConfigDict:
  """The config recorded in `workdir`, locked like a config from a file.

  Args:
    workdir: the run's workdir.
    process_id: this process's index in a multi-controller job, replacing the
      recorded `mesh.process_id` (process 0 records the file, so it holds
      process 0's index when the run set one); None keeps the recorded value.

  Raises:
    FileNotFoundError: the workdir holds no config.json (not a run's workdir,
      or a run started before runs recorded their config).
  """
  path = os.path.join(workdir, FILE)
  if not os.path.isfile(path):
    raise FileNotFoundError(f"{path}: no recorded config; is {workdir} the workdir of a run?")
  with open(path) as f:
    config = ml_collections.ConfigDict(_tuples(json.load(f)))
  if process_id is not None:
    config.mesh.process_id = process_id
  config.lock()
  return config


def differences(recorded: ml_collections.ConfigDict,
                config: ml_collections.ConfigDict) -> list[str]:
  """'field: recorded -> new' for every dotted field whose value differs, sorted."""
  old, new = _leaves(_plain(recorded)), _leaves(_plain(config))
  show = lambda leaves, k: repr(leaves[k]) if k in leaves else "(absent)"
  return [f"{k}: {show(old, k)} -> {show(new, k)}" for k in sorted(old.keys() | new.keys())
          if k not in old or k not in new or old[k] != new[k]]


def record(config: ml_collections.ConfigDict, workdir: str) -> list[str]:
  """Writes `config` to `<workdir>/config.json`, warning on a changed resume.

  Only process 0 reads and writes the file.

  Args:
    config: the resolved config the run trains with.
    workdir: the run's workdir.

  Returns:
    The differences from the config recorded before (empty for a new run or
    an unchanged one, and on processes other than 0).
  """
  if jax.process_index() != 0:
    return []
  path = os.path.join(workdir, FILE)
  changed = differences(load(workdir), config) if os.path.isfile(path) else []
  if changed:
    logging.warning("%s: resuming with a config that differs from the recorded one in %d "
                    "fields: %s. The new config is recorded.", workdir, len(changed),
                    "; ".join(changed))
  os.makedirs(workdir, exist_ok=True)
  with open(path + ".tmp", "w") as f:
    f.write(config.to_json(indent=2, sort_keys=True) + "\n")
  os.replace(path + ".tmp", path)  # A kill mid-write leaves the previous record.
  return changed
