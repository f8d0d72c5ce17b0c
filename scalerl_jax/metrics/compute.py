"""FLOPs of generation and training, and a run's cumulative compute.

Counted from the model's shape; training is 3 x the forward pass.
`ComputeMeter` sums FLOPs and device-seconds, logged on every metrics line
under `FLOPS_KEY` and `DEVICE_SECONDS_KEY`; `memory_scalars` adds the
devices' allocator peak where the backend reports one (GPU, TPU).
Design: docs/design/compute.md.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Optional, Sequence

import jax

from scalerl_jax.models.model_config import ModelConfig

FLOPS_KEY = "compute/flops"
DEVICE_SECONDS_KEY = "compute/device_seconds"


def matmul_params(cfg: ModelConfig) -> int:
  """Weights used in a matmul per token, the LM head included (tied or not)."""
  d, e = cfg.embed_dim, cfg.head_dim
  per_layer = (
      d * e * (2 * cfg.num_heads + 2 * cfg.num_kv_heads) + 3 * d * cfg.mlp_dim
  )
  return cfg.num_layers * per_layer + d * cfg.vocab_size


def attention_flops(cfg: ModelConfig, num_tokens: int, past: int = 0) -> int:
  """Forward FLOPs of attention alone (scores and weighted values) for
  `num_tokens` causal tokens after `past` cached ones."""
  n = int(num_tokens)
  keys = n * int(past) + n * (n + 1) // 2
  # q.k scores and the probability-weighted values: 2 matmuls x 2 FLOPs.
  return 2 * 2 * cfg.num_layers * cfg.num_heads * cfg.head_dim * keys


def forward_flops(cfg: ModelConfig, num_tokens: int, past: int = 0) -> int:
  """Forward FLOPs of `num_tokens` causal tokens after `past` cached ones."""
  n = int(num_tokens)
  return 2 * matmul_params(cfg) * n + attention_flops(cfg, n, past)


def prefill_flops(cfg: ModelConfig, prompt_lens: Sequence[int]) -> int:
  """FLOPs of prefilling each prompt into the KV cache (a causal pass)."""
  return sum(forward_flops(cfg, int(p)) for p in prompt_lens)


def decode_flops(
    cfg: ModelConfig,
    prompt_lens: Sequence[int],
    start_lens: Sequence[int],
    end_lens: Sequence[int],
) -> int:
  """FLOPs of decoding each sequence from `start_lens` to `end_lens` tokens.

  Lengths count prompt + completion. The first completion token's
  predecessor, the prompt's last token, is counted by `prefill_flops`.
  """
  total = 0
  for p, start, end in zip(prompt_lens, start_lens, end_lens, strict=True):
    # The first token whose predecessor is decoded, not prefilled.
    first = max(int(start), int(p) + 1)
    total += forward_flops(cfg, max(int(end) - first, 0), past=first - 1)
  return total


def generation_flops(
    cfg: ModelConfig, prompt_lens: Sequence[int], completion_lens: Sequence[int]
) -> int:
  """FLOPs of sampling: a causal pass over p + c - 1 tokens per sequence."""
  prompt_lens, completion_lens = list(prompt_lens), list(completion_lens)
  if len(prompt_lens) != len(completion_lens):
    raise ValueError(
        f"{len(prompt_lens)} prompt lengths but {len(completion_lens)} "
        "completion lengths"
    )
  ends = [int(p) + int(c) for p, c in zip(prompt_lens, completion_lens)]
  return prefill_flops(cfg, prompt_lens) + decode_flops(
      cfg, prompt_lens, prompt_lens, ends
  )


def train_flops(cfg: ModelConfig, seq_lens: Sequence[int]) -> int:
  """3 x the causal forward FLOPs of sequences (padded or real lengths)."""
  return 3 * sum(forward_flops(cfg, int(t)) for t in seq_lens)


class ComputeMeter:
  """Cumulative FLOPs and device-seconds of a run, carried across resumes."""

  def __init__(self):
    self.flops: int | float = 0
    self.device_seconds: float = 0.0

  def add(
      self,
      flops: int | float = 0,
      wall_seconds: float = 0.0,
      num_devices: int = 1,
  ) -> None:
    """Adds `flops` done in `wall_seconds` while `num_devices` were occupied."""
    if flops < 0 or wall_seconds < 0 or num_devices < 1:
      raise ValueError(
          f"ComputeMeter.add: need flops >= 0, wall_seconds >= 0 and "
          f"num_devices >= 1; got {flops}, {wall_seconds}, {num_devices}"
      )
    self.flops += flops
    self.device_seconds += wall_seconds * num_devices

  def scalars(self) -> dict[str, float]:
    """The totals under their metric names, for every metrics line."""
    return {
        FLOPS_KEY: float(self.flops),
        DEVICE_SECONDS_KEY: float(self.device_seconds),
    }

  def state_dict(self) -> dict[str, int | float]:
    """JSON-able totals, for the checkpoint's `extra`."""
    return {"flops": self.flops, "device_seconds": self.device_seconds}

  def load_state_dict(self, state: Mapping[str, Any]) -> None:
    """Restores saved totals; ValueError on unknown keys or negative values."""
    if set(state) != {"flops", "device_seconds"}:
      raise ValueError(
          f"ComputeMeter state: keys {sorted(state)} are not "
          "['device_seconds', 'flops']"
      )
    for key in ("flops", "device_seconds"):
      value = state[key]
      if (
          isinstance(value, bool)
          or not isinstance(value, (int, float))
          or not value >= 0
      ):
        raise ValueError(
            f"ComputeMeter state: {key}={value!r} is not a non-negative number"
        )
    self.flops = state["flops"]
    self.device_seconds = float(state["device_seconds"])


# Metric names of `memory_scalars`, in GB (10^9 bytes) as the planner reports.
MEMORY_PEAK_KEY = "memory/peak_gb"
MEMORY_IN_USE_KEY = "memory/in_use_gb"
MEMORY_LIMIT_KEY = "memory/limit_gb"


def memory_scalars(devices: Optional[Iterable[Any]] = None) -> dict[str, float]:
  """The allocator's bytes on this process's devices, largest device first.

  Peak and current bytes in use are the maximum over `devices` (default
  `jax.local_devices()`), the limit the minimum: the device nearest to running
  out. The peak is since the process started (XLA has no reset). {} where the
  backend keeps no statistics (CPU).
  """
  if devices is None:
    devices = jax.local_devices()
  stats = [s for s in (d.memory_stats() for d in devices) if s]
  if not stats:
    return {}
  out = {
      MEMORY_PEAK_KEY: max(s.get("peak_bytes_in_use", 0) for s in stats),
      MEMORY_IN_USE_KEY: max(s.get("bytes_in_use", 0) for s in stats),
  }
  limits = [s["bytes_limit"] for s in stats if s.get("bytes_limit")]
  if limits:
    out[MEMORY_LIMIT_KEY] = min(limits)
  return {k: v / 1e9 for k, v in out.items()}
