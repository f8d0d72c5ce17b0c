"""Compute accounting: FLOPs of generation and training, and a run's cumulative totals.

Compute is counted analytically from the model's shape (PAPER.md §1 measures
compute in GPU-hours; FLOPs are the hardware-independent counterpart):

  * A token's forward pass costs 2 FLOPs per matmul parameter (every
    projection plus the LM head, which is a matmul even when tied to the
    embedding; the embedding lookup is free) plus attention: scores and the
    weighted sum of values, 2 x 2 x context x num_heads x head_dim per layer,
    where context is the number of keys the token attends to (itself included).
  * A causal pass over n tokens after `past` cached ones: token j attends to
    past + j + 1 keys.
  * Generation of c tokens after a p-token prompt: the prompt is prefilled and
    every sampled token but the last is fed back, so p + c - 1 tokens go
    through the model causally (a KV cache makes prefill + decode cost exactly
    one causal pass). The sampler's first decode step reads the prompt's last
    token again (`sampling/slots.py`); that one token per sequence belongs to
    this implementation, not to the cost of generating, and is not counted.
  * Generation is counted as it happens (`prefill_flops` when a prompt starts,
    `decode_flops` after every sampler call), so every generated token counts,
    whether or not its group is ever trained on; `generation_flops` is the sum
    of the two for finished sequences.
  * Training: forward + backward = 3 x the forward pass over the sequences the
    train step computes on.

`ComputeMeter` adds up the FLOPs and device-seconds of a run; every metrics
line carries its totals under `FLOPS_KEY` and `DEVICE_SECONDS_KEY`, the
x-axes that `scalerl_jax.scaling` fits curves against.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from scalerl_jax.models.transformer import ModelConfig

FLOPS_KEY = "compute/flops"
DEVICE_SECONDS_KEY = "compute/device_seconds"


def matmul_params(cfg: ModelConfig) -> int:
  """Parameters that take part in a matmul per token, LM head included.

  Args:
    cfg: the model's shape.

  Returns:
    Projection and MLP weights of every layer plus the D x V head (tied or
    not). Norm scales and biases are left out (O(D) work per token).
  """
  d, e = cfg.embed_dim, cfg.head_dim
  per_layer = d * e * (2 * cfg.num_heads + 2 * cfg.num_kv_heads) + 3 * d * cfg.mlp_dim
  return cfg.num_layers * per_layer + d * cfg.vocab_size


def _attention_flops_per_key(cfg: ModelConfig) -> int:
  # q.k scores and the probability-weighted values: 2 matmuls x 2 FLOPs.
  return 2 * 2 * cfg.num_layers * cfg.num_heads * cfg.head_dim


def forward_flops(cfg: ModelConfig, num_tokens: int, past: int = 0) -> int:
  """Forward FLOPs of a causal pass over `num_tokens` tokens after `past` cached ones.

  Args:
    cfg: the model's shape.
    num_tokens: tokens computed in this pass.
    past: tokens already in the KV cache before them.

  Returns:
    The FLOPs; token j (from 0) attends to past + j + 1 keys.
  """
  n = int(num_tokens)
  keys = n * int(past) + n * (n + 1) // 2
  return 2 * matmul_params(cfg) * n + _attention_flops_per_key(cfg) * keys


def prefill_flops(cfg: ModelConfig, prompt_lens: Sequence[int]) -> int:
  """FLOPs of prefilling prompts into the KV cache.

  Args:
    cfg: the model's shape.
    prompt_lens: prompt tokens of each sequence.

  Returns:
    The sum over sequences of a causal pass over the prompt.
  """
  return sum(forward_flops(cfg, int(p)) for p in prompt_lens)


def decode_flops(cfg: ModelConfig, prompt_lens: Sequence[int], start_lens: Sequence[int],
                 end_lens: Sequence[int]) -> int:
  """FLOPs of decoding sequences from `start_lens` to `end_lens` tokens.

  The completion token at position t (from 0) costs the forward pass of its
  predecessor at t - 1, attending to t keys, except the first one, whose
  predecessor is the prompt's last token (counted by `prefill_flops`).

  Args:
    cfg: the model's shape.
    prompt_lens: prompt tokens of each sequence.
    start_lens: prompt + completion tokens of each before the decoding.
    end_lens: the same after it.

  Returns:
    The sum over sequences of the fed-back tokens' forward passes.
  """
  total = 0
  for p, start, end in zip(prompt_lens, start_lens, end_lens, strict=True):
    first = max(int(start), int(p) + 1)  # First token whose predecessor is decoded.
    total += forward_flops(cfg, max(int(end) - first, 0), past=first - 1)
  return total


def generation_flops(cfg: ModelConfig, prompt_lens: Sequence[int],
                     completion_lens: Sequence[int]) -> int:
  """FLOPs of sampling a batch: prompt prefill plus decoding with a KV cache.

  Args:
    cfg: the model's shape.
    prompt_lens: prompt tokens of each sequence.
    completion_lens: tokens sampled for each sequence (injected interruption
      phrases included).

  Returns:
    The sum over sequences of a causal pass over p + c - 1 tokens (the last
    sampled token is never fed back).
  """
  prompt_lens, completion_lens = list(prompt_lens), list(completion_lens)
  if len(prompt_lens) != len(completion_lens):
    raise ValueError(f"{len(prompt_lens)} prompt lengths but {len(completion_lens)} "
                     "completion lengths")
  ends = [int(p) + int(c) for p, c in zip(prompt_lens, completion_lens)]
  return prefill_flops(cfg, prompt_lens) + decode_flops(cfg, prompt_lens, prompt_lens, ends)


def train_flops(cfg: ModelConfig, seq_lens: Sequence[int]) -> int:
  """FLOPs of one forward + backward pass (3 x forward) over the given sequences.

  Args:
    cfg: the model's shape.
    seq_lens: length of each sequence the train step computes on (prompt and
      completion; padded lengths to count the hardware's work, real lengths
      to count the useful work).

  Returns:
    3 x the sum of causal forward FLOPs.
  """
  return 3 * sum(forward_flops(cfg, int(t)) for t in seq_lens)


class ComputeMeter:
  """Cumulative FLOPs and device-seconds of a run, carried across resumes."""

  def __init__(self):
    self.flops: int | float = 0
    self.device_seconds: float = 0.0

  def add(self, flops: int | float = 0, wall_seconds: float = 0.0, num_devices: int = 1) -> None:
    """Adds work done.

    Args:
      flops: FLOPs of the work (see `generation_flops`, `train_flops`).
      wall_seconds: how long it took.
      num_devices: devices that were busy for that time (occupied, whether or
        not they computed).
    """
    if flops < 0 or wall_seconds < 0 or num_devices < 1:
      raise ValueError(f"ComputeMeter.add: need flops >= 0, wall_seconds >= 0 and "
                       f"num_devices >= 1; got {flops}, {wall_seconds}, {num_devices}")
    self.flops += flops
    self.device_seconds += wall_seconds * num_devices

  def scalars(self) -> dict[str, float]:
    """The totals under their metric names, for every metrics line."""
    return {FLOPS_KEY: float(self.flops), DEVICE_SECONDS_KEY: float(self.device_seconds)}

  def state_dict(self) -> dict[str, int | float]:
    """JSON-able totals, for the checkpoint's `extra`."""
    return {"flops": self.flops, "device_seconds": self.device_seconds}

  def load_state_dict(self, state: Mapping[str, Any]) -> None:
    """Restores totals saved by `state_dict`.

    Raises:
      ValueError: keys other than "flops" and "device_seconds", or values that
        are not non-negative numbers.
    """
    if set(state) != {"flops", "device_seconds"}:
      raise ValueError(f"ComputeMeter state: keys {sorted(state)} are not "
                       "['device_seconds', 'flops']")
    for key in ("flops", "device_seconds"):
      value = state[key]
      if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise ValueError(f"ComputeMeter state: {key}={value!r} is not a non-negative number")
    self.flops = state["flops"]
    self.device_seconds = float(state["device_seconds"])
