"""Per-device bytes of the train step's activations and sampler temporaries.

Counted from the shapes and logical axes of what each phase keeps live, with
no device; only the main buffers, so each figure is a floor.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Optional, Sequence

import flax.linen as nn
from jax.sharding import AbstractMesh
import numpy as np

from scalerl_jax import sharding
from scalerl_jax.jobs.planner.layout_bytes import shard_bytes
from scalerl_jax.models import attention as attention_lib
from scalerl_jax.models import model_config
from scalerl_jax.rl import logprobs
from scalerl_jax.sampling import slots

# An activation: shape, logical axis names, bytes per entry.
Residual = tuple[tuple[int, ...], tuple[Optional[str], ...], int]

# Float32 [rows, C, V] logit chunks alive at once at the head's peak, by
# platform; one where absent. On TPU the compiler fuses the head's matmul into
# the log-softmax that reads it, and one chunk is what it keeps
# (launch.compile --check_planner, docs/tpu.md). On GPU the matmul is a cuBLAS
# call that writes its whole float32 output, and the log-softmax, the
# probabilities of the entropy and the logits' gradient are each a buffer of
# the same size. Three, fitted to one H100 measurement of the recipe's train
# step (docs/gpu.md); the next GPU session's remat and microbatch variants
# test it out of sample.
LOGIT_CHUNKS = {"gpu": 3}


def _bytes(
    items: Sequence[Residual],
    mesh: AbstractMesh,
    rules: sharding.Rules,
    platform: str,
) -> int:
  """Per-device bytes of `items` laid out by the logical axis `rules`."""
  return sum(
      shard_bytes(
          shape, nn.logical_to_mesh_axes(axes, rules), mesh, nbytes, platform
      )
      for shape, axes, nbytes in items
  )


def _activations(
    cfg: model_config.ModelConfig, b: int, t: int
) -> dict[str, Residual]:
  """A block's activations by kind: [B, T, D], [B, T, H, E], [B, T, K, E]
  and [B, T, I], in the compute dtype."""
  c = np.dtype(cfg.dtype).itemsize
  h, k, e = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
  tok = ("act_batch", "act_len")
  return {
      "embed": ((b, t, cfg.embed_dim), tok + ("act_embed",), c),
      "heads": ((b, t, h, e), tok + ("act_heads", "head_dim"), c),
      "kv": ((b, t, k, e), tok + ("act_kv_heads", "head_dim"), c),
      "mlp": ((b, t, cfg.mlp_dim), tok + ("act_mlp",), c),
  }


def _block_residuals(
    cfg: model_config.ModelConfig, b: int, t: int, attention: str
) -> list[Residual]:
  """(shape, logical axes, bytes) one block keeps for its backward pass."""
  c = np.dtype(cfg.dtype).itemsize
  a = _activations(cfg, b, t)
  heads, kv, h = a["heads"], a["kv"], cfg.num_heads
  scores = ((b, h, t, t), ("act_batch", "act_heads", "act_len", None), 4)
  # Block input, attention norm output, residual after attention, MLP norm
  # output; q, k, v after rope and the attention output (matmul inputs);
  # gate, up and their product; the float32 softmax output [B, H, T, T].
  out = [a["embed"]] * 4 + [heads, kv, kv, heads] + [a["mlp"]] * 3
  if attention == "plain":
    out.append(scores)
    # The probabilities cast to the compute dtype feed the values product.
    if c != 4:
      out.append(scores[:2] + (c,))
  else:
    out.append(((b, h, t), ("act_batch", "act_heads", "act_len"), 4))
  if cfg.qk_norm:  # q and k before their norms.
    out += [heads, kv]
  return out


def _projections(
    cfg: model_config.ModelConfig, b: int, t: int
) -> list[Residual]:
  """The outputs of q, k, v, o, gate and up: what `save_dots` keeps beyond a
  block's input (down's output is only added to the residual stream, which
  the next block's input holds)."""
  a = _activations(cfg, b, t)
  return [a["heads"], a["kv"], a["kv"], a["embed"], a["mlp"], a["mlp"]]


# `model.remat_policy` -> what a rematerialised block keeps beyond its input;
# one entry per model_config.REMAT_POLICIES name (tests/remat_test.py).
REMAT_SAVES = {
    "full": lambda cfg, b, t: [],
    "save_dots": _projections,
}


@dataclasses.dataclass(frozen=True)
class Unsharded:
  """Per-device bytes of the weights the train step un-shards over fsdp, each
  with its gradient at full size beside it."""

  head: int = 0  # The float32 LM head (the embedding when tied), x 2.
  layer: int = 0  # One layer's kernels in the compute dtype, x 2.
  embedding: int = 0  # An untied float32 embedding table, x 2.


def activation_bytes(
    cfg: model_config.ModelConfig,
    mesh: AbstractMesh,
    rules: sharding.Rules,
    rows: int,
    seq_len: int,
    remat: bool,
    chunk: int = 0,
    platform: str = "tpu",
    weights: Unsharded = Unsharded(),
) -> int:
  """Per-device bytes of the train step's activations over `rows` sequences,
  with the `weights` it un-shards, at the step's peak.

  The most of three phases:
  - the head's: what the layers keep (with `remat` each layer's input and
    what `cfg.remat_policy` saves, else every layer's residuals), the final
    hidden states, `LOGIT_CHUNKS` float32 [rows, C, V] logit chunks (C as
    the head cuts T at `chunk`, `logprobs.evened_chunks`) and
    `weights.head`;
  - a layer's backward: what the layers keep, one layer's residuals and
    `weights.layer`;
  - an untied embedding's gradient, after the layers: the hidden states'
    gradient and `weights.embedding`.
  The model runs on seq_len - 1 tokens; `platform` resolves `auto` attention.

  The phases do not add up: counted as a sum, the train step was well over
  what the TPU compiler needs at least (launch.compile --check_planner;
  docs/design/planner.md has the measurement).
  """
  t = seq_len - 1

  size = functools.partial(_bytes, mesh=mesh, rules=rules, platform=platform)

  block = _block_residuals(cfg, rows, t, _resolve_attention(cfg, platform, t))
  _, positions = logprobs.evened_chunks(t, chunk)
  logits = (
      (rows, positions, cfg.vocab_size),
      ("act_batch", "act_len", "act_vocab"),
      4,
  )
  hidden = size(block[:1])
  saved = hidden + size(REMAT_SAVES[cfg.remat_policy](cfg, rows, t))
  kept = cfg.num_layers * (saved if remat else size(block))
  return max(
      kept
      + hidden
      + LOGIT_CHUNKS.get(platform, 1) * size([logits])
      + weights.head,
      kept + (size(block) if remat else 0) + weights.layer,
      hidden + weights.embedding,
  )


def _resolve_attention(
    cfg: model_config.ModelConfig, platform: str, seq_len: int
) -> str:
  """The attention implementation `cfg.attention` runs as on `platform`."""
  if cfg.attention == attention_lib.AUTO:
    return attention_lib.pick(platform, seq_len, cfg.dtype)
  return cfg.attention


def sampler_temps(
    cfg: model_config.ModelConfig,
    mesh: AbstractMesh,
    rules: sharding.Rules,
    rows: int,
    width: int,
    cache_len: int,
    kv_bytes: int,
    platform: str,
    cache_positions: int,
    decode_kernel: str = "plain",
) -> tuple[int, int]:
  """Temporaries of a prefill of `rows` slots `width` wide, and of a decode.

  `cache_len` positions of records per slot; a decode step's float32 scores
  over the cache's allocated `cache_positions` count with the plain
  `decode_kernel`; the Pallas kernel keeps them on chip.
  """
  c = np.dtype(cfg.dtype).itemsize
  k, e, q = cfg.num_kv_heads, cfg.head_dim, cfg.num_heads // cfg.num_kv_heads

  size = functools.partial(_bytes, mesh=mesh, rules=rules, platform=platform)

  rows_axes = ("act_batch", "act_kv_heads", None, None)
  cache = [((rows, k, e, width), rows_axes, kv_bytes)] * (2 * cfg.num_layers)
  records = [
      ((rows, cache_len), ("act_batch", None), nbytes)
      for nbytes in slots.position_record_bytes()
  ]
  layer = [
      ((rows, width, cfg.embed_dim), ("act_batch", None, "act_embed"), c),
      (
          (rows, width, k, q + 2, e),
          ("act_batch", None, "act_kv_heads", None, None),
          c,
      ),
      # gate and up; their product is written over one of them (qwen2.5_0.5b
      # on v5e 8x8: one [24, 2048, 4864] buffer live at the MLP's peak).
      ((rows, width, 2 * cfg.mlp_dim), ("act_batch", None, "act_mlp"), c),
  ]
  if _resolve_attention(cfg, platform, width) == "plain":
    layer += [
        ((rows, k, width * q, width), rows_axes, 4),
        ((rows, k, width * q, width), rows_axes, c),
    ]
  logits = ((rows, cfg.vocab_size), ("act_batch", "act_vocab"), 4)
  scores = (
      (rows, k, q, cache_positions),
      ("act_batch", "act_kv_heads", None, None),
      4,
  )
  decode = [logits] * 3 + ([scores] if decode_kernel == "plain" else [])
  return size(cache + records + layer), size(decode)
