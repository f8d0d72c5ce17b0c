"""Hugging Face `config.json` <-> our `ModelConfig` (Llama, Qwen2, Qwen3).

`read_config` reads a checkpoint directory's config.json, refusing settings
the model does not implement; `hf_config_dict` writes one that `transformers`
(v4 and v5) and vLLM read alike. Every error names the file.

Design: docs/design/models.md.
"""

from __future__ import annotations

import json
import os
from typing import Any

from scalerl_jax.models.model_config import ModelConfig
from scalerl_jax.models.model_config import RopeScaling
from scalerl_jax.models.safetensors_reader import CheckpointError

ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}
_FAMILY_TO_ARCH = {v: k for k, v in ARCHITECTURES.items()}


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


def check_family(cfg: ModelConfig) -> None:
  """Raises CheckpointError where `cfg` is not its family's layout."""
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
