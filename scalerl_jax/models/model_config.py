"""The model's configuration: `ModelConfig`, the schema of `config.model`.

Hashable (a static argument of every jitted program), read from
`config.model` (`from_config`) or from a checkpoint's config.json
(models/hf_config.py). The network (models/transformer.py), the KV-cache
path (models/decode.py), the planner and the FLOP counts all take it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from scalerl_jax.models import attention as attention_lib

# The choices of `config.model.param_dtype` / `compute_dtype`, and of
# `config.model.rope_scaling.type`.
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
ROPE_SCALINGS = ("none", "llama3")
# The choices of `config.model.remat_policy`: what a rematerialised block keeps
# for its backward pass beyond its input (None: nothing, all recomputed).
REMAT_POLICIES = {
    "full": None,
    # The projections' outputs (matmuls without batch dimensions); norms,
    # rope, attention and the SwiGLU product are recomputed.
    "save_dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


@dataclasses.dataclass(frozen=True)
class RopeScaling:
  """Llama 3.1 frequency scaling of the rotary embedding."""

  type: str = "none"  # One of ROPE_SCALINGS.
  factor: float = 8.0
  low_freq_factor: float = 1.0
  high_freq_factor: float = 4.0
  original_max_position: int = 8192


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """`config.model`'s fields (configs/scalerl.py) but `hf_path`; hashable.

  The network's shape has no defaults: configs/scalerl.py gives it
  (`from_config`), or a checkpoint's config.json (`hf_io.read_config`). The
  run-time choices a checkpoint does not hold default to configs/scalerl.py's
  values, which tests/transformer_test.py holds them to.
  """

  family: str
  vocab_size: int
  embed_dim: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  mlp_dim: int
  rope_theta: float
  rope_scaling: RopeScaling
  norm_eps: float
  tie_embeddings: bool
  qkv_bias: bool
  qk_norm: bool
  max_seq_len: int
  param_dtype: str = "float32"
  compute_dtype: str = "float32"
  fp32_lm_head: bool = True
  lm_head_algorithm: str = "auto"  # One of models/lm_head.ALGORITHMS.
  remat: bool = False
  remat_policy: str = "full"  # One of REMAT_POLICIES.
  attention: str = attention_lib.AUTO
  # Layers per iteration of the layer scan; 0 = `scan_layers_unroll`'s pick.
  scan_unroll: int = 0

  @classmethod
  def from_config(cls, m: Any) -> "ModelConfig":
    names = [
        f.name for f in dataclasses.fields(cls) if f.name != "rope_scaling"
    ]
    return cls(
        **{name: m[name] for name in names},
        rope_scaling=RopeScaling(**m.rope_scaling),
    )

  @property
  def dtype(self):
    return DTYPES[self.compute_dtype]

  @property
  def pdtype(self):
    return DTYPES[self.param_dtype]

  def num_params(self) -> int:
    """Parameter count (embedding and LM head counted once each)."""
    d, e = self.embed_dim, self.head_dim
    attn = d * e * (2 * self.num_heads + 2 * self.num_kv_heads)
    if self.qkv_bias:
      attn += e * (self.num_heads + 2 * self.num_kv_heads)
    if self.qk_norm:
      attn += 2 * e
    block = attn + 3 * d * self.mlp_dim + 2 * d
    head = 0 if self.tie_embeddings else d * self.vocab_size
    return self.vocab_size * d + self.num_layers * block + d + head


def run_time_fields() -> tuple[str, ...]:
  """The fields a checkpoint's config.json does not hold: the run's choices.

  Those with a default; `hf_io.read_config` takes them from `config.model`.
  """
  return tuple(
      f.name
      for f in dataclasses.fields(ModelConfig)
      if f.default is not dataclasses.MISSING
  )


def scan_layers_unroll(cfg: ModelConfig, platform: str) -> int:
  """How many layers one iteration of the layer scan runs.

  `cfg.scan_unroll`; for 0, one on accelerators with `cfg.remat` (each
  layer's weight gradient is then reduced before the next layer's is made),
  else all of them (no loop). Why, measured: docs/tpu.md and
  docs/cpu_speed.md.
  """
  if cfg.scan_unroll:
    return min(cfg.scan_unroll, cfg.num_layers)
  return 1 if cfg.remat and platform != "cpu" else cfg.num_layers
