"""Reading a Hugging Face checkpoint's safetensors files as untrusted input.

Only safetensors files are read, never pickles. Every header is checked
against its file before a tensor is read (size, offsets, dtype), shard names
in the index must be plain names in the directory, and a tensor holding NaN
or Inf is an error. Each error is a `CheckpointError` naming the file.
`hf_io.py` maps the tensors to the model's parameters.

Design: docs/design/models.md.
"""

from __future__ import annotations

import json
import math
import os
import struct
from typing import Any

import numpy as np
from safetensors import SafetensorError
from safetensors import safe_open

# Bytes per element of the safetensors dtypes we cast to the param dtype.
_ITEMSIZE = {"F16": 2, "BF16": 2, "F32": 4, "F64": 8}
_MAX_HEADER_BYTES = 100_000_000  # The safetensors library's own limit.
# A zip (torch.save's format since 1.6) or a pickle (protocol 2 and later).
_PICKLE_MAGIC = (
    b"PK\x03\x04",
    b"\x80\x02",
    b"\x80\x03",
    b"\x80\x04",
    b"\x80\x05",
)
_PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
_CONVERT = (
    "Convert it to safetensors where you trust it (transformers' "
    "AutoModelForCausalLM.from_pretrained(dir).save_pretrained(out) writes "
    "model.safetensors), or fetch the model's .safetensors files instead."
)


class CheckpointError(ValueError):
  """A checkpoint directory is missing a file or holds an unexpected tensor."""


def _check_entry(fn: str, name: str, entry: Any, data_bytes: int) -> None:
  """Checks one tensor entry of a safetensors header against its file."""
  try:
    dtype, shape, (begin, end) = (
        entry["dtype"],
        list(entry["shape"]),
        entry["data_offsets"],
    )
  except (TypeError, KeyError, ValueError):
    raise CheckpointError(
        f"{fn}: tensor {name}: malformed header entry {entry!r}"
    ) from None
  if not isinstance(dtype, str) or dtype not in _ITEMSIZE:
    raise CheckpointError(
        f"{fn}: tensor {name} has dtype {dtype!r}; supported: {', '.join(_ITEMSIZE)} "
        "(quantized or integer checkpoints cannot be loaded)"
    )
  if not all(isinstance(x, int) and x >= 0 for x in shape + [begin, end]):
    raise CheckpointError(
        f"{fn}: tensor {name}: shape {shape} and data_offsets "
        f"{[begin, end]} must be non-negative integers"
    )
  if end > data_bytes:
    raise CheckpointError(
        f"{fn}: tensor {name}: data_offsets [{begin}, {end}] reach past the {data_bytes} "
        "data bytes the file holds (truncated, or a crafted header)"
    )
  if end - begin != math.prod(shape) * _ITEMSIZE[dtype]:
    raise CheckpointError(
        f"{fn}: tensor {name}: {dtype} of shape {shape} needs "
        f"{math.prod(shape) * _ITEMSIZE[dtype]} bytes, its data_offsets span {end - begin}"
    )


def _read_header(fn: str) -> dict[str, Any]:
  """A safetensors file's tensor entries, each checked against the file."""
  size = os.path.getsize(fn)
  with open(fn, "rb") as f:
    head = f.read(8)
    if head.startswith(_PICKLE_MAGIC):
      raise CheckpointError(
          f"{fn}: is a pickled PyTorch file, not safetensors; it is not "
          f"read, as unpickling can run arbitrary code. {_CONVERT}"
      )
    if len(head) < 8:
      raise CheckpointError(f"{fn}: {size} bytes, too short to be safetensors")
    (header_bytes,) = struct.unpack("<Q", head)
    if header_bytes > min(size - 8, _MAX_HEADER_BYTES):
      raise CheckpointError(
          f"{fn}: its header claims {header_bytes} bytes but the file holds {size} "
          f"(safetensors allows at most {_MAX_HEADER_BYTES}); truncated or not safetensors"
      )
    try:
      header = json.loads(f.read(header_bytes))
    except ValueError as e:
      raise CheckpointError(
          f"{fn}: the safetensors header is not JSON ({e})"
      ) from None
  if not isinstance(header, dict):
    raise CheckpointError(f"{fn}: the safetensors header is not a JSON object")
  header.pop("__metadata__", None)
  for name, entry in header.items():
    _check_entry(fn, name, entry, size - 8 - header_bytes)
  return header


def _shard_path(path: str, index_path: str, tensor: str, shard: Any) -> str:
  """`<path>/<shard>` for a weight_map entry naming a safetensors file there."""
  if (
      not isinstance(shard, str)
      or os.path.basename(shard) != shard
      or shard in ("", ".", "..")
  ):
    raise CheckpointError(
        f"{index_path}: tensor {tensor} maps to {shard!r}, outside the checkpoint directory; "
        f"shards must be plain file names in {path}"
    )
  if not shard.endswith(".safetensors"):
    raise CheckpointError(
        f"{index_path}: tensor {tensor} maps to {shard!r}, not a .safetensors "
        f"file; pickled weights are never read. {_CONVERT}"
    )
  return os.path.join(path, shard)


class TensorIndex:
  """Which safetensors file holds which tensor; opens each file lazily."""

  def __init__(self, path: str):
    index_path = os.path.join(path, "model.safetensors.index.json")
    single = os.path.join(path, "model.safetensors")
    if os.path.isfile(index_path):
      with open(index_path) as f:
        weight_map = json.load(f).get("weight_map")
      if not isinstance(weight_map, dict):
        raise CheckpointError(f"{index_path}: has no 'weight_map'")
      self.files = {
          name: _shard_path(path, index_path, name, shard)
          for name, shard in weight_map.items()
      }
      headers = {}
      for fn in sorted(set(self.files.values())):
        if not os.path.isfile(fn):
          raise CheckpointError(f"{fn}: listed in {index_path} but missing")
        headers[fn] = _read_header(fn)
      for name, fn in self.files.items():
        if name not in headers[fn]:
          raise CheckpointError(
              f"{index_path}: maps tensor {name} to {fn}, which lacks it"
          )
    elif os.path.isfile(single):
      self.files = {name: single for name in _read_header(single)}
    else:
      # Weights first, ahead of e.g. training_args.bin.
      pickled = sorted(
          (n for n in os.listdir(path) if n.endswith(_PICKLE_SUFFIXES)),
          key=lambda n: (not n.startswith(("pytorch_model", "model")), n),
      )
      if pickled:
        raise CheckpointError(
            f"{os.path.join(path, pickled[0])}: a pickled PyTorch checkpoint where safetensors "
            f"is expected; it is not read, as unpickling can run arbitrary code. {_CONVERT}"
        )
      raise CheckpointError(
          f"{path}: no model.safetensors or model.safetensors.index.json found"
      )
    self._handles = {}
    self.used = set()

  def get(self, name: str, expected_shape: tuple[int, ...]) -> np.ndarray:
    """Tensor `name`, checked for shape and NaN or Inf; recorded in `used`."""
    if name not in self.files:
      raise CheckpointError(f"tensor {name}: missing from the checkpoint")
    fn = self.files[name]
    try:
      if fn not in self._handles:
        self._handles[fn] = safe_open(fn, "np")
      array = self._handles[fn].get_tensor(name)
    except SafetensorError as e:
      raise CheckpointError(
          f"{fn}: cannot be read as safetensors ({e})"
      ) from None
    if tuple(array.shape) != tuple(expected_shape):
      raise CheckpointError(
          f"tensor {name} in {os.path.basename(fn)}: shape {tuple(array.shape)}, "
          f"expected {tuple(expected_shape)}"
      )
    finite = np.isfinite(array)
    if not finite.all():
      raise CheckpointError(
          f"{fn}: tensor {name} holds {array.size - np.count_nonzero(finite)} NaN or Inf "
          f"values (of {array.size}); a policy with such weights computes NaN everywhere"
      )
    self.used.add(name)
    return array
