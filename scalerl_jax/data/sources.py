"""Prompt sources: the built-in tasks, reasoning-gym, TFDS and JSONL files.

`load_prompts(config, split)` returns the records of data.source or of every
domain of a mixture: dicts of strings `id` (unique, stable), `prompt`,
`answer`, `source`, `verifier` (a spec, rewards/registry.py) and `metadata`
(JSON text). Malformed rows are skipped, counted and logged where they are.
The readers of outside formats are in readers.py.
Design: docs/design/prompt_sources.md.
"""

from __future__ import annotations

from typing import Callable

from absl import logging
import ml_collections

from scalerl_jax import registry
from scalerl_jax.data import builtin_code
from scalerl_jax.data import builtin_task
from scalerl_jax.data import mixture
from scalerl_jax.data import parity_task
from scalerl_jax.data import readers
from scalerl_jax.data import search_task

SPLITS = builtin_task.SPLITS
# Seed of the built-in validation prompts, whatever config.seed is, unless
# data.builtin_val_seed says otherwise.
VAL_SEED = 0


def val_seed(config: ml_collections.ConfigDict) -> int:
  """Seed of the built-in validation draw: data.builtin_val_seed, or VAL_SEED
  when that is -1."""
  seed = config.data.builtin_val_seed
  return VAL_SEED if seed < 0 else seed


_MAX_LOGGED_ROWS = 20


def _report(what: str, malformed: list[readers.MalformedRow]) -> None:
  if not malformed:
    return
  lines = [str(row) for row in malformed[:_MAX_LOGGED_ROWS]]
  if len(malformed) > _MAX_LOGGED_ROWS:
    lines.append(f"... and {len(malformed) - _MAX_LOGGED_ROWS} more")
  logging.warning(
      "%s: skipped %d malformed rows:\n  %s",
      what,
      len(malformed),
      "\n  ".join(lines),
  )


# A split's (records, malformed rows, the config field that names the split's
# prompts, where they come from), as each source's loader below returns it;
# `load_prompts` logs the malformed rows and refuses an empty split for all.
_Loaded = tuple[list[dict[str, str]], list[readers.MalformedRow], str, str]
Loader = Callable[[ml_collections.ConfigDict, str], _Loaded]


def _builtin_split(config: ml_collections.ConfigDict, split: str) -> _Loaded:
  d = config.data
  # Validation ignores config.seed, so runs that differ only in seed are
  # measured on the same held-out set (as the paper's fixed 1,000 prompts).
  seed = config.seed if split == "train" else val_seed(config)
  field = f"builtin_num_{split}"
  records = builtin_task.builtin_prompts(
      d.builtin_difficulty, d[field], seed, split
  )
  return records, [], field, "builtin"


def _reasoning_gym_split(
    config: ml_collections.ConfigDict, split: str
) -> _Loaded:
  d, field = config.data, "reasoning_gym_name"
  if not d[field]:
    raise ValueError(
        f"data.{field}: must be set when data.source='reasoning_gym'"
    )
  records = readers.reasoning_gym_prompts(
      d[field],
      split,
      d.reasoning_gym_size,
      d.reasoning_gym_val_size,
      config.seed,
  )
  return records, [], field, "reasoning_gym"


def _tfds_split(config: ml_collections.ConfigDict, split: str) -> _Loaded:
  d = config.data
  field = "tfds_split" if split == "train" else "tfds_val_split"
  for required in ("tfds_name", field):
    if not d[required]:
      raise ValueError(
          f"data.{required}: must be set for the {split} split of "
          "data.source='tfds'"
      )
  records, malformed = readers.tfds_prompts(
      d.tfds_name,
      d[field],
      d.tfds_data_dir,
      d.tfds_prompt_field,
      d.tfds_answer_field,
      d.answer_delimiter,
  )
  return records, malformed, field, f"tfds {d.tfds_name}/{d[field]}"


def _jsonl_split(config: ml_collections.ConfigDict, split: str) -> _Loaded:
  d = config.data
  field = "jsonl_train" if split == "train" else "jsonl_val"
  if not d[field]:
    raise ValueError(
        f"data.{field}: must be set for the {split} split of data.source='jsonl'"
    )
  records, malformed = readers.read_jsonl(
      d[field], d.jsonl_prompt_field, d.jsonl_answer_field, d.answer_delimiter
  )
  return records, malformed, field, d[field]


def _generated(prompts, name: str):
  """The loader of a built-in task that draws its problems:
  `prompts(levels, num, seed, split)` with data.builtin_difficulty and
  data.builtin_num_<split>; validation is drawn with `val_seed`."""

  def load(config: ml_collections.ConfigDict, split: str) -> _Loaded:
    d = config.data
    seed = config.seed if split == "train" else val_seed(config)
    field = f"builtin_num_{split}"
    records = prompts(tuple(d.builtin_difficulty), d[field], seed, split)
    return records, [], field, name

  return load


# The values `data.source` allows, each with its loader, listed in this order.
SOURCES: registry.Registry[Loader] = registry.Registry(
    "data.source", sort=False
)
SOURCES.register(builtin_task.SOURCE, _builtin_split)
SOURCES.register(
    builtin_code.SOURCE,
    _generated(builtin_code.code_prompts, builtin_code.SOURCE),
)
SOURCES.register(
    search_task.SOURCE,
    _generated(search_task.search_prompts, search_task.SOURCE),
)
SOURCES.register(
    parity_task.SOURCE,
    _generated(parity_task.parity_prompts, parity_task.SOURCE),
)
SOURCES.register("reasoning_gym", _reasoning_gym_split)
SOURCES.register("tfds", _tfds_split)
SOURCES.register("jsonl", _jsonl_split)


def load_prompts(
    config: ml_collections.ConfigDict, split: str
) -> list[dict[str, str]]:
  """The non-empty prompt records of `split` ('train' or 'val').

  Raises:
    ValueError: unknown split or source, an unset field, or no usable prompt.
    FileNotFoundError: a JSONL file does not exist.
  """
  if split not in SPLITS:
    raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
  if mixture.names(config):
    mixture.weights(config)  # Checks them.
    return [
        record
        for name in mixture.names(config)
        for record in mixture.tag(
            load_prompts(mixture.domain_config(config, name), split),
            name,
            config.data.mixture[name].get("verifier", ""),
        )
    ]
  load = SOURCES.get(config.data.source)  # ValueError naming the choices.
  records, malformed, field, where = load(config, split)
  _report(where, malformed)
  if not records:
    detail = ""
    if malformed:
      detail = (
          f"; all {len(malformed)} rows are malformed, first: {malformed[0]}"
      )
    raise ValueError(
        f"data.{field}: {where} has no usable {split} prompts{detail}"
    )
  return records
