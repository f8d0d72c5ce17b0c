"""A run's workdir: the names of its files, its lock, its recorded config.

Every file name inside a workdir is defined here. Resuming with a config that
differs from the recorded one warns, naming each changed field, and records
the new one (extending `trainer.num_steps` is normal; a change that cannot
work fails at restore, naming the array).
"""

from __future__ import annotations

import fcntl
import json
import os
from typing import IO, Any, Callable, Optional

from absl import logging
import jax
import ml_collections

DONE_FILE = "DONE"  # Written when a run has finished all its steps.
LOCK_FILE = ".lock"  # Held by the process that trains in a workdir.
CONFIG_FILE = "config.json"  # The resolved config the run trains with.
CHECKPOINTS_DIR = "checkpoints"  # orbax's directory of step checkpoints.
METRICS_FILE = "metrics.jsonl"  # One JSON object per written step.
TB_DIR = "tb"  # TensorBoard event files.
BASE_POLICY_DIR = "base_policy"  # Warm-start results, one per fingerprint.
TOKENIZER_FILE = "tokenizer.model"  # The built-in SentencePiece tokenizer.

# configs/scalerl.py's get_config: "variant=<name>" -> that variant's config.
BaseConfig = Callable[[str], ml_collections.ConfigDict]


def is_finished(workdir: str) -> bool:
  """Whether the run in `workdir` finished all its steps (DONE_FILE there)."""
  return os.path.exists(os.path.join(workdir, DONE_FILE))


def mark_finished(workdir: str) -> None:
  """Records that the run in `workdir` finished all its steps."""
  open(os.path.join(workdir, DONE_FILE), "w").close()


def lock_workdir(workdir: str) -> IO[str]:
  """The open lock file of `workdir`, held until closed or the process ends.

  RuntimeError (naming its pid) if another process trains there.
  """
  os.makedirs(workdir, exist_ok=True)
  handle = open(os.path.join(workdir, LOCK_FILE), "a+")
  try:
    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except BlockingIOError:
    handle.seek(0)
    owner = handle.read().strip() or "unknown"
    handle.close()
    raise RuntimeError(
        f"{workdir}: another process (pid {owner}) is training in this workdir; "
        "two runs must not share one"
    ) from None
  handle.seek(0)
  handle.truncate()
  handle.write(str(os.getpid()))
  handle.flush()
  return handle


def _tuples(value: Any) -> Any:
  """JSON lists back to the tuples the config holds (configs use no lists)."""
  if isinstance(value, dict):
    return {k: _tuples(v) for k, v in value.items()}
  if isinstance(value, list):
    return tuple(_tuples(v) for v in value)
  return value


def config_leaves(tree: Any, prefix: str = "") -> dict[str, Any]:
  """Dotted field name -> value of every leaf of a config (or plain dict)."""
  out = {}
  for key, value in tree.items():
    if isinstance(value, (dict, ml_collections.ConfigDict)):
      out.update(config_leaves(value, f"{prefix}{key}."))
    else:
      out[f"{prefix}{key}"] = value
  return out


def _plain(config: ml_collections.ConfigDict) -> dict:
  """The config as JSON would give it back (tuples, no ConfigDicts)."""
  return _tuples(json.loads(config.to_json()))


def load_config(
    workdir: str,
    process_id: Optional[int] = None,
    defaults: Optional[BaseConfig] = None,
) -> ml_collections.ConfigDict:
  """The config recorded in `workdir` (locked), or FileNotFoundError.

  `process_id` replaces the recorded `mesh.process_id` (process 0's) in a
  multi-controller job; None keeps it. `defaults` (configs/scalerl.py's
  get_config, called with "variant=<the recorded variant>") fills in the
  fields a run recorded before they existed, with a warning naming them: a
  new field's default keeps what earlier runs did, so the run is read as it
  ran.
  """
  path = os.path.join(workdir, CONFIG_FILE)
  if not os.path.isfile(path):
    raise FileNotFoundError(
        f"{path}: no recorded config; is {workdir} the workdir of a run?"
    )
  with open(path) as f:
    recorded = _tuples(json.load(f))
  if defaults is not None:
    reference = _plain(defaults(f"variant={recorded.get('variant')}"))
    added = sorted(config_leaves(reference).keys() - config_leaves(recorded))
    if added:
      logging.warning(
          "%s records no %s (it predates them); read with today's defaults",
          path,
          ", ".join(added),
      )
      recorded = _merged(reference, recorded)
  config = ml_collections.ConfigDict(recorded)
  if process_id is not None:
    config.mesh.process_id = process_id
  config.lock()
  return config


def _merged(reference: dict, recorded: dict) -> dict:
  """`recorded`, with every field only `reference` has added."""
  out = dict(recorded)
  for key, value in reference.items():
    if key not in out:
      out[key] = value
    elif isinstance(value, dict) and isinstance(out[key], dict):
      out[key] = _merged(value, out[key])
  return out


def config_differences(
    recorded: ml_collections.ConfigDict, config: ml_collections.ConfigDict
) -> list[str]:
  """Sorted 'field: recorded -> new' of every field whose value differs."""
  old, new = config_leaves(_plain(recorded)), config_leaves(_plain(config))
  show = lambda leaves, k: repr(leaves[k]) if k in leaves else "(absent)"
  return [
      f"{k}: {show(old, k)} -> {show(new, k)}"
      for k in sorted(old.keys() | new.keys())
      if k not in old or k not in new or old[k] != new[k]
  ]


def record_config(config: ml_collections.ConfigDict, workdir: str) -> list[str]:
  """Records `config` (process 0 only); the differences from the last record."""
  if jax.process_index() != 0:
    return []
  path = os.path.join(workdir, CONFIG_FILE)
  changed = (
      config_differences(load_config(workdir), config)
      if os.path.isfile(path)
      else []
  )
  if changed:
    logging.warning(
        "%s: resuming with a config that differs from the recorded one in %d "
        "fields: %s. The new config is recorded.",
        workdir,
        len(changed),
        "; ".join(changed),
    )
  os.makedirs(workdir, exist_ok=True)
  with open(path + ".tmp", "w") as f:
    f.write(config.to_json(indent=2, sort_keys=True) + "\n")
  # A kill mid-write leaves the previous record.
  os.replace(path + ".tmp", path)
  return changed
