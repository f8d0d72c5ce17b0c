"""Hugging Face safetensors checkpoints in and out (Llama, Qwen2, Qwen3).

`load_checkpoint` reads a local directory (`config.json` plus
`model.safetensors` or shards listed in `model.safetensors.index.json`) into
our `ModelConfig` and parameters, placed shard by shard; `save_checkpoint`
writes the same layout back for `transformers`. `_layer_tensors` is the one
table mapping our stacked [layers, ...] parameters to HF's per-layer
[out, in] tensors, used in both directions. The files are untrusted input,
checked by `safetensors_reader.py`; every error names the file.

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
from scalerl_jax.models.safetensors_reader import CheckpointError
from scalerl_jax.models.transformer import ModelConfig, RopeScaling, Transformer

ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}
_FAMILY_TO_ARCH = {v: k for k, v in ARCHITECTURES.items()}
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
_NP_DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16}


def _config_path(path: str) -> str:
  if not os.path.isdir(path):
    raise CheckpointError(f"{path}: checkpoint directory does not exist")
  config_path = os.path.join(path, "config.json")
  if not os.path.isfile(config_path):
    raise CheckpointError(
        f"{config_path}: missing (a Hugging Face checkpoint needs config.json)"
    )
  return config_path


def _rope_from_hf(hf: dict, config_path: str) -> dict:
  """Reads the rotary settings from either the v5 or the v4 config layout."""
  params = hf.get("rope_parameters") or {}
  theta = params.get("rope_theta", hf.get("rope_theta", 10_000.0))
  scaling = hf.get("rope_scaling") or params
  kind = (
      scaling.get("rope_type", scaling.get("type", "default"))
      if scaling
      else "default"
  )
  out = {"rope_theta": float(theta), "rope_scaling": RopeScaling()}
  if kind in (None, "default"):
    return out
  if kind != "llama3":
    raise CheckpointError(
        f"{config_path}: rope type {kind!r} is not supported (default, llama3)"
    )
  out["rope_scaling"] = RopeScaling(
      type="llama3",
      factor=float(scaling["factor"]),
      low_freq_factor=float(scaling["low_freq_factor"]),
      high_freq_factor=float(scaling["high_freq_factor"]),
      original_max_position=int(scaling["original_max_position_embeddings"]),
  )
  return out


def read_config(path: str, **overrides: Any) -> ModelConfig:
  """Our ModelConfig from `<path>/config.json`; `overrides` set dtypes etc."""
  config_path = _config_path(path)
  with open(config_path) as f:
    hf = json.load(f)
  archs = hf.get("architectures") or []
  arch = next((a for a in archs if a in ARCHITECTURES), None)
  if arch is None:
    raise CheckpointError(
        f"{config_path}: unsupported architecture {archs}; supported: {sorted(ARCHITECTURES)}"
    )
  family = ARCHITECTURES[arch]
  for key, ok in (
      ("hidden_act", "silu"),
      ("attention_bias", False),
      ("mlp_bias", False),
      ("use_sliding_window", False),
  ):
    if (
        key in hf
        and hf[key] != ok
        and not (family == "qwen2" and key == "attention_bias")
    ):
      raise CheckpointError(
          f"{config_path}: {key}={hf[key]!r} is not supported (need {ok!r})"
      )
  heads = hf["num_attention_heads"]
  fields = dict(
      family=family,
      vocab_size=hf["vocab_size"],
      embed_dim=hf["hidden_size"],
      num_layers=hf["num_hidden_layers"],
      num_heads=heads,
      num_kv_heads=hf.get("num_key_value_heads") or heads,
      head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
      mlp_dim=hf["intermediate_size"],
      norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
      tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
      qkv_bias=family == "qwen2",
      qk_norm=family == "qwen3",
      max_seq_len=int(hf.get("max_position_embeddings", 2048)),
      **_rope_from_hf(hf, config_path),
  )
  fields.update(overrides)
  return ModelConfig(**fields)


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


def hf_config_dict(cfg: ModelConfig) -> dict:
  """config.json contents for `cfg` in its family's Hugging Face layout."""
  rope = {"rope_type": "default", "rope_theta": cfg.rope_theta}
  scaling = cfg.rope_scaling
  if scaling.type == "llama3":
    rope.update(
        rope_type="llama3",
        factor=scaling.factor,
        low_freq_factor=scaling.low_freq_factor,
        high_freq_factor=scaling.high_freq_factor,
        original_max_position_embeddings=scaling.original_max_position,
    )
  hf = {
      "architectures": [_FAMILY_TO_ARCH[cfg.family]],
      "model_type": cfg.family,
      "vocab_size": cfg.vocab_size,
      "hidden_size": cfg.embed_dim,
      "intermediate_size": cfg.mlp_dim,
      "num_hidden_layers": cfg.num_layers,
      "num_attention_heads": cfg.num_heads,
      "num_key_value_heads": cfg.num_kv_heads,
      "head_dim": cfg.head_dim,
      "hidden_act": "silu",
      "rms_norm_eps": cfg.norm_eps,
      "max_position_embeddings": cfg.max_seq_len,
      "tie_word_embeddings": cfg.tie_embeddings,
      # Both rotary layouts, so transformers v4 and v5 (and vLLM) read it alike.
      "rope_theta": cfg.rope_theta,
      "rope_parameters": rope,
      "dtype": cfg.param_dtype,
      "torch_dtype": cfg.param_dtype,
  }
  if scaling.type != "none":
    hf["rope_scaling"] = {k: v for k, v in rope.items() if k != "rope_theta"}
  if cfg.family in ("llama", "qwen3"):
    hf["attention_bias"] = False
  if cfg.family == "llama":
    hf["mlp_bias"] = False
  if cfg.family in ("qwen2", "qwen3"):
    hf.update(
        use_sliding_window=False,
        sliding_window=None,
        max_window_layers=cfg.num_layers,
    )
  return hf


def _check_family(cfg: ModelConfig) -> None:
  want = {
      "llama": (False, False),
      "qwen2": (True, False),
      "qwen3": (False, True),
  }[cfg.family]
  if (cfg.qkv_bias, cfg.qk_norm) != want:
    raise CheckpointError(
        f"model.family={cfg.family!r} needs qkv_bias={want[0]} and qk_norm={want[1]}; "
        f"got qkv_bias={cfg.qkv_bias}, qk_norm={cfg.qk_norm}"
    )


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
  _check_family(cfg)
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
