"""Prompt records read from outside formats: JSONL, TFDS and reasoning-gym.

Each reader returns records with `RECORD_FIELDS` (described in sources.py)
and, where rows can be malformed, the `MalformedRow`s it skipped.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import json
from typing import Any, Optional

from absl import logging
from etils import epath

RECORD_FIELDS = ("id", "prompt", "answer", "source", "verifier", "metadata")
_JSONL_OWN_FIELDS = ("id", "verifier")  # Besides the prompt and answer fields.
# Legacy TFDS builders (gsm8k, ...) register only when their package is
# imported; `import tensorflow_datasets` alone skips them.
_TFDS_BUILDER_PACKAGES = ("text", "question_answering", "summarization")


@dataclasses.dataclass(frozen=True)
class MalformedRow:
  """A row that could not become a prompt record, and why."""

  location: str  # "path:line" for JSONL, "name/split[index]" for TFDS.
  reason: str

  def __str__(self) -> str:
    return f"{self.location}: {self.reason}"


def _text_id(prefix: str, text: str) -> str:
  return f"{prefix}:{hashlib.sha256(text.encode('utf-8', 'surrogatepass')).hexdigest()[:16]}"


def _record(
    id_: str,
    prompt: str,
    answer: str,
    source: str,
    verifier: str,
    metadata: dict[str, Any],
) -> dict[str, str]:
  return dict(
      zip(
          RECORD_FIELDS,
          (id_, prompt, answer, source, verifier, json.dumps(metadata)),
      )
  )


def _final_answer(
    answer: Any, delimiter: str
) -> tuple[Optional[str], Optional[str]]:
  """(reference answer, None), or (None, why not) for a row's answer value.

  The answer is the text after `delimiter`'s last occurrence ("": all of it).
  """
  if isinstance(answer, bool) or not isinstance(answer, (str, int, float)):
    return None, "is missing or not a string or number"
  if not isinstance(answer, str):
    return str(answer), None  # A number is a final answer already.
  if delimiter:
    at = answer.rfind(delimiter)
    if at < 0:
      return (
          None,
          f"has no {delimiter!r} before its final answer (data.answer_delimiter)",
      )
    answer = answer[at + len(delimiter) :]
  if not answer.strip():
    return None, "is empty"
  return answer.strip() if delimiter else answer, None


def _check_row(row: Any, prompt_field: str) -> Optional[str]:
  """Why a parsed JSONL row is not a prompt row, or None if it is one."""
  if not isinstance(row, dict):
    return f"expected a JSON object, got {type(row).__name__}"
  prompt = row.get(prompt_field)
  if not isinstance(prompt, str) or not prompt.strip():
    return f"field {prompt_field!r} is missing or not a non-empty string"
  for field in ("id", "verifier"):
    if field in row and (not isinstance(row[field], str) or not row[field]):
      return f"field {field!r} must be a non-empty string"
  return None


def read_jsonl(
    path: str,
    prompt_field: str = "prompt",
    answer_field: str = "answer",
    answer_delimiter: str = "",
) -> tuple[list[dict[str, str]], list[MalformedRow]]:
  """Prompt records of a JSONL file, and its malformed rows with their lines.

  Rows may set "id" and "verifier"; other fields go to the metadata.

  Raises:
    FileNotFoundError: `path` does not exist.
  """
  p = epath.Path(path)
  if not p.exists():
    raise FileNotFoundError(f"{path}: no such JSONL file")
  records, malformed, first_line = [], [], {}
  for number, raw in enumerate(p.read_bytes().splitlines(), start=1):
    location = f"{path}:{number}"
    try:
      line = raw.decode("utf-8")
    except UnicodeDecodeError as e:
      malformed.append(
          MalformedRow(
              location, f"invalid UTF-8 ({e.reason} at byte {e.start})"
          )
      )
      continue
    if not line.strip():
      continue
    try:
      row = json.loads(line)
    except json.JSONDecodeError as e:
      malformed.append(
          MalformedRow(location, f"invalid JSON ({e.msg} at column {e.colno})")
      )
      continue
    reason = _check_row(row, prompt_field)
    if reason is None:
      answer, why = _final_answer(row.get(answer_field), answer_delimiter)
      if why is not None:
        reason = f"field {answer_field!r} {why}"
    if reason is None:
      id_ = row.get("id") or _text_id("jsonl", row[prompt_field])
      if id_ in first_line:
        reason = f"duplicate id {id_!r} (first on line {first_line[id_]})"
    if reason is not None:
      malformed.append(MalformedRow(location, reason))
      continue
    first_line[id_] = number
    own = (prompt_field, answer_field) + _JSONL_OWN_FIELDS
    extra = {k: v for k, v in row.items() if k not in own}
    records.append(
        _record(
            id_,
            row[prompt_field],
            answer,
            "jsonl",
            row.get("verifier", "math"),
            extra,
        )
    )
  return records, malformed


def _tfds_value(example: dict[str, Any], field: str) -> Any:
  value = example
  for key in field.split("/"):
    value = value[key]
  if isinstance(value, bytes):
    value = value.decode("utf-8")
  # A NumPy scalar becomes a Python one.
  if hasattr(value, "item") and getattr(value, "ndim", None) == 0:
    value = value.item()
  return value


def tfds_prompts(
    name: str,
    split: str,
    data_dir: str,
    prompt_field: str,
    answer_field: str,
    answer_delimiter: str = "",
) -> tuple[list[dict[str, str]], list[MalformedRow]]:
  """Prompt records of a TFDS split (array_record format), and malformed ones.

  Fields "a/b" name nested features; `data_dir` "" is TFDS's default.

  Raises:
    ValueError: a field is not a feature of the dataset.
  """
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  for package in _TFDS_BUILDER_PACKAGES:
    importlib.import_module(f"tensorflow_datasets.{package}")
  source = tfds.data_source(name, split=split, data_dir=data_dir or None)
  records, malformed = [], []
  for index in range(len(source)):
    example = source[index]
    location = f"{name}/{split}[{index}]"
    values = {}
    for config_field, field in (
        ("tfds_prompt_field", prompt_field),
        ("tfds_answer_field", answer_field),
    ):
      try:
        values[config_field] = _tfds_value(example, field)
      except (KeyError, TypeError):
        raise ValueError(
            f"data.{config_field}: {field!r} is not a feature of {name}; "
            f"features: {sorted(example)}"
        ) from None
    prompt = values["tfds_prompt_field"]
    answer, why = _final_answer(values["tfds_answer_field"], answer_delimiter)
    if not isinstance(prompt, str) or not prompt.strip():
      malformed.append(
          MalformedRow(location, f"{prompt_field!r} is not non-empty text")
      )
    elif why is not None:
      malformed.append(MalformedRow(location, f"{answer_field!r} {why}"))
    else:
      records.append(
          _record(
              f"tfds:{name}:{split}:{index}", prompt, answer, "tfds", "math", {}
          )
      )
  return records, malformed


def reasoning_gym_prompts(
    name: str, split: str, size: int, val_size: int, seed: int
) -> list[dict[str, str]]:
  """Prompt records of a reasoning-gym dataset; metadata holds each entry.

  Training drops questions repeated or shared with validation.

  Raises:
    ImportError: reasoning-gym is not installed.
    ValueError: unknown dataset, or an entry that is not JSON-serialisable.
  """
  try:
    import reasoning_gym  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise ImportError(
        "data.source='reasoning_gym' needs the reasoning-gym package "
        "(pip install 'scalerl_jax[tasks]')"
    ) from None

  def entries(split_seed, split_size):
    try:
      return list(
          reasoning_gym.create_dataset(name, size=split_size, seed=split_seed)
      )
    except (ValueError, KeyError, AssertionError) as e:
      raise ValueError(
          f"data.reasoning_gym_name: cannot create {name!r} ({e})"
      ) from None

  taken = set()
  if split == "train":
    taken = {e["question"] for e in entries(2 * seed + 1, val_size)}
  records, duplicates = [], 0
  for entry in entries(
      2 * seed + (split == "val"), size if split == "train" else val_size
  ):
    if entry["question"] in taken:
      duplicates += 1
      continue
    taken.add(entry["question"])
    answer = "" if entry.get("answer") is None else str(entry["answer"])
    try:
      records.append(
          _record(
              _text_id(f"reasoning_gym:{name}", entry["question"]),
              entry["question"],
              answer,
              "reasoning_gym",
              f"reasoning_gym:{name}",
              entry,
          )
      )
    except TypeError as e:
      raise ValueError(
          f"data.reasoning_gym_name: {name!r} entries are not "
          f"JSON-serialisable ({e})"
      ) from None
  if duplicates:
    logging.info(
        "reasoning_gym %s/%s: dropped %d questions repeated within the split or "
        "shared with validation",
        name,
        split,
        duplicates,
    )
  return records
