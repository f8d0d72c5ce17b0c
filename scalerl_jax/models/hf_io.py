"""Hugging Face safetensors checkpoints in and out (Llama, Qwen2, Qwen3).

`load_checkpoint` reads a local directory (`config.json`, read by
hf_config.py, plus `model.safetensors` or shards listed in
`model.safetensors.index.json`) into our `ModelConfig` and parameters, placed
shard by shard; `save_checkpoint` writes the same layout back for
`transformers`. `_layer_tensors` is the one table mapping our stacked
[layers, ...] parameters to HF's per-layer [out, in] tensors, used in both
directions. The files are untrusted input, checked by `safetensors_reader.py`;
every error names the file.

Design: docs/design/models.md.
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable, Iterator, Optional

from absl import logging
import flax.linen as nn
import jax
from jax.experimental import multihost_utils
import ml_dtypes
import numpy as np
from safetensors.numpy import save_file

from scalerl_jax import sharding
from scalerl_jax.models import safetensors_reader
from scalerl_jax.models.hf_config import check_family
from scalerl_jax.models.hf_config import hf_config_dict
from scalerl_jax.models.hf_config import read_config
from scalerl_jax.models.model_config import ModelConfig
from scalerl_jax.models.safetensors_reader import CheckpointError
from scalerl_jax.models.transformer import Transformer

_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
_NP_DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16}


def _layer_tensors(
    cfg: ModelConfig,
) -> dict[tuple[str, ...], tuple[str, Callable, Callable]]:
  """Our per-layer param path -> (HF name pattern, hf->ours, ours->hf)."""
  d, h, k, e = cfg.embed_dim, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim

  def proj_in(n):  # [n*E, D] -> [D, n, E]
    return (lambda w: w.T.reshape(d, n, e), lambda w: w.reshape(d, n * e).T)

  def bias(n):  # [n*E] -> [n, E]
    return (lambda b: b.reshape(n, e), lambda b: b.reshape(n * e))

  ident = (lambda x: x, lambda x: x)
  transpose = (lambda w: w.T, lambda w: w.T)
  table = {
      ("attn_norm", "scale"): ("input_layernorm.weight",) + ident,
      ("mlp_norm", "scale"): ("post_attention_layernorm.weight",) + ident,
      ("attn", "q", "kernel"): ("self_attn.q_proj.weight",) + proj_in(h),
      ("attn", "k", "kernel"): ("self_attn.k_proj.weight",) + proj_in(k),
      ("attn", "v", "kernel"): ("self_attn.v_proj.weight",) + proj_in(k),
      # o_proj: [D, H*E] -> [H, E, D]
      ("attn", "o", "kernel"): (
          "self_attn.o_proj.weight",
          lambda w: w.T.reshape(h, e, d),
          lambda w: w.reshape(h * e, d).T,
      ),
      ("mlp", "gate", "kernel"): ("mlp.gate_proj.weight",) + transpose,
      ("mlp", "up", "kernel"): ("mlp.up_proj.weight",) + transpose,
      ("mlp", "down", "kernel"): ("mlp.down_proj.weight",) + transpose,
  }
  if cfg.qkv_bias:
    table[("attn", "q", "bias")] = ("self_attn.q_proj.bias",) + bias(h)
    table[("attn", "k", "bias")] = ("self_attn.k_proj.bias",) + bias(k)
    table[("attn", "v", "bias")] = ("self_attn.v_proj.bias",) + bias(k)
  if cfg.qk_norm:
    table[("attn", "q_norm", "scale")] = ("self_attn.q_norm.weight",) + ident
    table[("attn", "k_norm", "scale")] = ("self_attn.k_norm.weight",) + ident
  return table


def _top_tensors(
    cfg: ModelConfig,
) -> dict[tuple[str, ...], tuple[str, Callable, Callable]]:
  ident = (lambda x: x, lambda x: x)
  table = {
      ("embedding",): ("model.embed_tokens.weight",) + ident,
      ("final_norm", "scale"): ("model.norm.weight",) + ident,
  }
  if not cfg.tie_embeddings:
    table[("lm_head",)] = ("lm_head.weight", lambda w: w.T, lambda w: w.T)
  return table


def _expected_hf_shape(
    to_hf: Callable, our_shape: tuple[int, ...]
) -> tuple[int, ...]:
  return tuple(
      jax.eval_shape(to_hf, jax.ShapeDtypeStruct(our_shape, np.float32)).shape
  )


def _param_shapes(cfg: ModelConfig) -> dict[tuple[str, ...], tuple[int, ...]]:
  """Our parameter paths and shapes, from the model itself (no allocation)."""
  abstract = jax.eval_shape(
      lambda: nn.unbox(
          Transformer(cfg).init(jax.random.key(0), np.zeros((1, 1), np.int32))
      )
  )
  flat = jax.tree_util.tree_flatten_with_path(abstract["params"])[0]
  return {tuple(p.key for p in path): tuple(leaf.shape) for path, leaf in flat}


def _place(
    array: np.ndarray, target: Optional[jax.sharding.Sharding]
) -> jax.Array:
  return (
      jax.numpy.asarray(array)
      if target is None
      else sharding.place_global(array, target)
  )


def _set(tree: dict, path: tuple[str, ...], value: Any) -> None:
  for key in path[:-1]:
    tree = tree.setdefault(key, {})
  tree[path[-1]] = value


def _get(tree: Any, path: tuple[str, ...]) -> Any:
  for key in path:
    tree = tree[key]
  return tree


def load_checkpoint(
    path: str,
    shardings: Any = None,
    cfg: Optional[ModelConfig] = None,
    **overrides: Any,
) -> tuple[ModelConfig, dict]:
  """Loads a Llama / Qwen2 / Qwen3 checkpoint directory.

  `shardings` (like `sharding.param_shardings`) places each array shard by
  shard; without it, on the default device. `cfg` defaults to config.json
  with `overrides`. Returns (ModelConfig, params in `cfg.param_dtype`).

  Raises:
    CheckpointError: naming the file, for a missing or malformed file, a
      pickle where safetensors belong, a shard outside `path`, a dtype other
      than F16/BF16/F32/F64, NaN or Inf values, or tensors that do not fit.
  """
  cfg = cfg or read_config(path, **overrides)
  index = safetensors_reader.TensorIndex(path)
  dtype = _NP_DTYPES[cfg.param_dtype]
  shapes = _param_shapes(cfg)
  params: dict = {}
  for our_path, (hf_name, from_hf, to_hf) in _top_tensors(cfg).items():
    array = from_hf(
        index.get(hf_name, _expected_hf_shape(to_hf, shapes[our_path]))
    )
    target = _get(shardings, our_path) if shardings is not None else None
    _set(params, our_path, _place(np.asarray(array, dtype), target))
  for sub_path, (pattern, from_hf, to_hf) in _layer_tensors(cfg).items():
    our_path = ("layers",) + sub_path
    hf_shape = _expected_hf_shape(to_hf, shapes[our_path][1:])
    stacked = np.stack(
        [
            np.asarray(
                from_hf(index.get(f"model.layers.{i}.{pattern}", hf_shape)),
                dtype,
            )
            for i in range(cfg.num_layers)
        ]
    )
    target = _get(shardings, our_path) if shardings is not None else None
    _set(params, our_path, _place(stacked, target))
  unused = sorted(
      n
      for n in set(index.files) - index.used
      if not n.endswith(_IGNORED_SUFFIXES)
      and not (cfg.tie_embeddings and n == "lm_head.weight")
  )
  if unused:
    raise CheckpointError(
        f"{path}: tensors the model does not use (wrong architecture settings?): "
        f"{unused[:5]}{' ...' if len(unused) > 5 else ''}"
    )
  logging.info("Loaded %d tensors from %s", len(index.used), path)
  return cfg, params


def _hf_tensors(
    params: dict, cfg: ModelConfig
) -> Iterator[tuple[str, np.ndarray]]:
  """(HF name, host array) for every tensor, gathered from the mesh."""
  dtype = _NP_DTYPES[cfg.param_dtype]

  def host(x):
    if not x.is_fully_addressable:
      x = multihost_utils.process_allgather(x, tiled=True)
    return np.asarray(x).astype(dtype)

  for our_path, (hf_name, _, to_hf) in _top_tensors(cfg).items():
    yield hf_name, np.ascontiguousarray(to_hf(host(_get(params, our_path))))
  for sub_path, (pattern, _, to_hf) in _layer_tensors(cfg).items():
    stacked = host(_get(params, ("layers",) + sub_path))
    for i in range(cfg.num_layers):
      yield f"model.layers.{i}.{pattern}", np.ascontiguousarray(
          to_hf(stacked[i])
      )


def save_checkpoint(
    params: dict, cfg: ModelConfig, path: str, max_shard_bytes: int = 4 << 30
) -> list[str]:
  """Writes params as a Hugging Face checkpoint directory.

  Shards (plus `model.safetensors.index.json`) past `max_shard_bytes`. Every
  process gathers; only process 0 writes. Returns the safetensors file names
  (relative to `path`).
  """
  check_family(cfg)
  shards: list[dict[str, np.ndarray]] = [{}]
  size = total = 0
  for name, array in _hf_tensors(params, cfg):
    if shards[-1] and size + array.nbytes > max_shard_bytes:
      shards.append({})
      size = 0
    shards[-1][name] = array
    size += array.nbytes
    total += array.nbytes
  if len(shards) == 1:
    names = ["model.safetensors"]
  else:
    names = [
        f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        for i in range(len(shards))
    ]
  if jax.process_index() != 0:
    return names
  os.makedirs(path, exist_ok=True)
  for fname, shard in zip(names, shards):
    save_file(shard, os.path.join(path, fname), metadata={"format": "pt"})
  if len(shards) > 1:
    weight_map = {
        t: fname for fname, shard in zip(names, shards) for t in shard
    }
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
      json.dump(
          {"metadata": {"total_size": total}, "weight_map": weight_map},
          f,
          indent=2,
      )
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(hf_config_dict(cfg), f, indent=2)
  return names
