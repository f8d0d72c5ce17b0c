"""What a checkpoint holds besides orbax's arrays, and whether it fits.

JSON layouts of host pytrees (`encode_host`, `decode_host`), the JSON check
of `extra`, and the comparison of a stored state's keys and shapes with the
tree to restore (`check_fits`). Design: docs/design/checkpoints.md.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np


def _key_name(key: Any) -> str:
  for attr in ("key", "name", "idx"):
    if hasattr(key, attr):
      return str(getattr(key, attr))
  return str(key)


def _path_name(path: tuple[Any, ...]) -> str:
  """'params/layers/mlp/up/kernel' from a pytree key path."""
  return "/".join(_key_name(k) for k in path) or "<root>"


def check_json(value: Any, where: str = "extra") -> None:
  """Raises TypeError naming the first value JSON cannot hold."""
  if isinstance(value, dict):
    for k, v in value.items():
      if not isinstance(k, str):
        raise TypeError(
            f"{where}: key {k!r} is not a str; JSON keys must be strings"
        )
      check_json(v, f"{where}[{k!r}]")
  elif isinstance(value, (list, tuple)):
    for i, v in enumerate(value):
      check_json(v, f"{where}[{i}]")
  elif value is not None and not isinstance(value, (str, int, float, bool)):
    raise TypeError(
        f"{where}: {type(value).__name__} is not JSON-serialisable "
        "(convert numpy scalars with int()/float(), bytes to str)"
    )


def _encode_host(tree: Any, arrays: dict[str, np.ndarray], where: str) -> Any:
  """JSON layout of a host pytree; non-empty leaves are copied into `arrays`."""
  if isinstance(tree, dict):
    for k in tree:
      if not isinstance(k, str):
        raise TypeError(f"{where}: key {k!r} is not a str")
    return {
        "dict": {
            k: _encode_host(v, arrays, f"{where}[{k!r}]")
            for k, v in tree.items()
        }
    }
  if isinstance(tree, (list, tuple)):
    kind = "list" if isinstance(tree, list) else "tuple"
    return {
        kind: [
            _encode_host(v, arrays, f"{where}[{i}]") for i, v in enumerate(tree)
        ]
    }
  if tree is None:
    return {"none": None}
  # A copy: the asynchronous write must not see later edits.
  array = np.array(tree, copy=True)
  if array.dtype.kind not in "biufc":
    raise TypeError(
        f"{where}: dtype {array.dtype} cannot be checkpointed; host_state "
        "leaves must be bool, integer, float or complex arrays"
    )
  leaf = {"shape": list(array.shape), "dtype": array.dtype.name}
  if array.size:
    leaf["array"] = f"a{len(arrays)}"
    arrays[leaf["array"]] = array
  return leaf


def decode_host(layout: Any, arrays: dict[str, np.ndarray]) -> Any:
  """The host pytree from its layout and arrays (what `encode_host` made)."""
  if "dict" in layout:
    return {k: decode_host(v, arrays) for k, v in layout["dict"].items()}
  if "list" in layout:
    return [decode_host(v, arrays) for v in layout["list"]]
  if "tuple" in layout:
    return tuple(decode_host(v, arrays) for v in layout["tuple"])
  if "none" in layout:
    return None
  shape, dtype = tuple(layout["shape"]), np.dtype(layout["dtype"])
  if "array" not in layout:
    return np.zeros(shape, dtype)
  array = np.asarray(arrays[layout["array"]])
  if array.shape != shape:
    raise ValueError(
        f"host_state leaf {layout['array']}: stored shape {array.shape} differs "
        f"from its layout {shape}; the checkpoint is corrupt"
    )
  return array.astype(dtype, copy=False)


def encode_host(tree: Any) -> tuple[Any, dict[str, np.ndarray]]:
  """(JSON layout, arrays by name) of a host pytree; the arrays are copies.

  TypeError names the key path of a non-str key or an unstorable dtype.
  """
  arrays: dict[str, np.ndarray] = {}
  return _encode_host(tree, arrays, "host_state"), arrays


def _abstract_leaf(path: tuple[Any, ...], leaf: Any) -> jax.ShapeDtypeStruct:
  sharding = getattr(leaf, "sharding", None)
  if sharding is None:
    raise ValueError(
        f"abstract_state leaf {_path_name(path)!r} has no sharding; build it as "
        "jax.ShapeDtypeStruct(shape, dtype, sharding=...)"
    )
  return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding)


def abstract_tree(abstract_state: Any) -> Any:
  """`abstract_state` with ShapeDtypeStruct leaves; ValueError if unsharded."""
  return jax.tree_util.tree_map_with_path(_abstract_leaf, abstract_state)


def _stored_shape(leaf: jax.ShapeDtypeStruct) -> tuple[int, ...]:
  """The shape orbax stores: a typed PRNG key is stored as its key data."""
  if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
    return tuple(jax.eval_shape(jax.random.key_data, leaf).shape)
  return tuple(leaf.shape)


def check_fits(stored: Any, abstract: Any, partial: bool, where: str) -> None:
  """Raises ValueError unless `stored` (orbax's metadata) fits `abstract`.

  The message starts with `where` and names the first five missing,
  unexpected (unless `partial`: `abstract` is a part of the state) or
  reshaped keys.
  """
  have = {
      _path_name(p): tuple(m.shape)
      for p, m in jax.tree_util.tree_flatten_with_path(stored)[0]
  }
  want = {
      _path_name(p): _stored_shape(leaf)
      for p, leaf in jax.tree_util.tree_flatten_with_path(abstract)[0]
  }
  problems = [
      f"shape of {k!r} is {have[k]} in the checkpoint but {want[k]} in the model"
      for k in want
      if k in have and have[k] != want[k]
  ]
  problems += [
      f"{k!r} is missing from the checkpoint" for k in want if k not in have
  ]
  problems += [
      f"{k!r} is in the checkpoint but not in the model"
      for k in have
      if k not in want and not partial
  ]
  if problems:
    shown = "; ".join(problems[:5])
    more = f"; and {len(problems) - 5} more" if len(problems) > 5 else ""
    raise ValueError(
        f"{where}: the checkpoint does not fit the state to restore "
        f"({len(problems)} problems): {shown}{more}"
    )
