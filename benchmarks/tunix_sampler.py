"""Tunix's native JAX sampler on our weights, the Tunix column of
benchmarks/sampler.py.

Tunix (PyPI `google-tunix`, in the `bench` extra) is optional. Its 0.1.7
pins `safetensors<0.8` and pulls older `transformers`, `tokenizers` and
`huggingface_hub` than constraints/, so install it in a venv of its own
(it runs on jax 0.10.2 and flax 0.12.8 as they are):

  python3.11 -m venv /tmp/venv_tunix && . /tmp/venv_tunix/bin/activate
  pip install -c constraints/python3.11_jax0.10.2.txt -e .
  pip install -e ".[bench]"

The policy is Tunix's `models.qwen3.Qwen3` of our shape, loaded with Tunix's
own loader from the Hugging Face checkpoint `hf_io.save_checkpoint` wrote of
our parameters, in our dtypes. Tunix's Qwen3 always has per-head q/k RMSNorms
and applies RoPE with base 1e6 whatever its config says: on a checkpoint
without those norms (the llama-family variants) it runs with scales of one
there, two small norms per layer more than our model, and its tokens differ
(the speed comparison holds: RoPE's base costs nothing). On
`tiny_cpu:family=qwen3;qk_norm=True;rope_theta=1e6` it is the same network:
logits agree to 1e-6 and greedy tokens are equal. The prompts reach Tunix's
`Sampler` as text through a tokenizer whose text is the token ids in decimal,
and no token ends a sequence, so every row makes exactly the tokens asked for.
"""

import os
from typing import Optional

import jax.numpy as jnp
import numpy as np
from safetensors.numpy import load_file
from safetensors.numpy import save_file

from scalerl_jax.models.model_config import ModelConfig


def unavailable() -> Optional[str]:
  """Why Tunix cannot run here, or None when it can."""
  try:
    import tunix.generate.sampler  # noqa: F401  # pylint: disable=g-import-not-at-top,unused-import
    import tunix.models.qwen3.params  # noqa: F401  # pylint: disable=g-import-not-at-top,unused-import
  except ImportError as e:
    return f"n/a (google-tunix: {e.msg}; see benchmarks/tunix_sampler.py)"
  return None


class _IdTokenizer:
  """Text is the token ids in decimal, space-separated;
  -1 (never sampled) is the EOS."""

  def encode(self, text: str, **kwargs) -> list[int]:
    del kwargs
    return [int(t) for t in text.split()]

  def decode(self, ids: list[int], **kwargs) -> str:
    del kwargs
    return " ".join(map(str, ids))

  def bos_id(self) -> None:
    return None

  def eos_id(self) -> int:
    return -1

  def pad_id(self) -> int:
    return 0


def _tunix_checkpoint(hf_dir: str, cfg: ModelConfig) -> str:
  """`hf_dir`'s tensors plus q/k norm scales of one where it has none;
  returns the new dir."""
  tensors = load_file(os.path.join(hf_dir, "model.safetensors"))
  for i in range(cfg.num_layers):
    for name in ("q_norm", "k_norm"):
      key = f"model.layers.{i}.self_attn.{name}.weight"
      tensors.setdefault(
          key, np.ones((cfg.head_dim,), tensors["model.norm.weight"].dtype)
      )
  out = os.path.join(hf_dir, "tunix")
  os.makedirs(out, exist_ok=True)
  save_file(tensors, os.path.join(out, "model.safetensors"))
  return out


class TunixSampler:
  """Tunix's `Sampler` over Tunix's Qwen3 holding our
  weights (module docstring).

  Args:
    hf_dir: our parameters as a Hugging Face checkpoint
      (`hf_io.save_checkpoint`).
    cfg: their shape.
    cache_size: prompt length + new tokens (Tunix's KV cache length).
  """

  def __init__(self, hf_dir: str, cfg: ModelConfig, cache_size: int):
    from tunix.generate import (
        sampler as sampler_lib,  # pylint: disable=g-import-not-at-top
    )
    from tunix.models.qwen3 import (
        model as model_lib,  # pylint: disable=g-import-not-at-top
    )
    from tunix.models.qwen3 import (
        params as params_lib,  # pylint: disable=g-import-not-at-top
    )

    if cfg.rope_scaling.type != "none" or cfg.qkv_bias:
      raise ValueError("Tunix's Qwen3 has no RoPE scaling and no q/k/v biases")
    tunix_cfg = model_lib.ModelConfig(
        num_layers=cfg.num_layers,
        vocab_size=cfg.vocab_size,
        embed_dim=cfg.embed_dim,
        hidden_dim=cfg.mlp_dim,
        num_heads=cfg.num_heads,
        head_dim=cfg.head_dim,
        num_kv_heads=cfg.num_kv_heads,
        rope_theta=cfg.rope_theta,
        norm_eps=cfg.norm_eps,
        use_tied_embedding=cfg.tie_embeddings,
        dtype=jnp.dtype(cfg.compute_dtype),
        param_dtype=jnp.dtype(cfg.param_dtype),
    )
    model = params_lib.create_model_from_safe_tensors(
        _tunix_checkpoint(hf_dir, cfg), tunix_cfg
    )
    self._sampler = sampler_lib.Sampler(
        model,
        _IdTokenizer(),
        sampler_lib.CacheConfig(
            cache_size=cache_size,
            num_layers=cfg.num_layers,
            num_kv_heads=cfg.num_kv_heads,
            head_dim=cfg.head_dim,
        ),
    )

  def generate(
      self,
      prompts_BxL: np.ndarray,
      new: int,
      seed: int,
      temperature: float = 1.0,
  ) -> list[np.ndarray]:
    """`new` tokens after every prompt, at `temperature` without
    top-k/top-p (0: greedy)."""
    sampling = dict(temperature=temperature, top_p=1.0) if temperature else {}
    out = self._sampler(
        [" ".join(map(str, row)) for row in prompts_BxL],
        max_generation_steps=new,
        max_prompt_length=prompts_BxL.shape[1],
        eos_tokens=[-1],
        seed=seed,
        **sampling,
    )
    return out.tokens
