"""Static sampler settings: `config.sampling` plus the token ids it needs.

The sampler takes token ids, never a tokenizer. `SamplingSettings` is frozen
and hashable, a compile-time constant of the jitted functions: changing it
means a new `Sampler`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, Sequence

from scalerl_jax.models import decode_attention
from scalerl_jax.models import kv_cache
from scalerl_jax.models.model_config import ModelConfig
from scalerl_jax.sampling.interruptions import InterruptionSettings


@dataclasses.dataclass(frozen=True)
class SamplingSettings:
  """Everything that shapes the compiled sampler."""

  temperature: float = 1.0  # 0 = greedy.
  top_k: int = 0  # 0 disables.
  top_p: float = 1.0  # 1.0 disables.
  max_prompt_len: int = 64  # Prompt budget; the KV cache holds this
  max_new_tokens: int = 96  # plus the completion budget.
  # Default slot count of `Sampler.init_state`; 0 = must be given.
  num_slots: int = 0
  decode_steps_per_call: int = 16  # Default `num_steps` of `Sampler.advance`.
  # Decode steps between the loop's checks of whether to go on (decode_loop).
  decode_steps_per_check: int = 1
  # Tokens that end a sequence (kept, mask 1); () = none.
  eos_ids: tuple[int, ...] = ()
  pad_id: int = 0  # Fills positions after a sequence's end.
  kv_cache_dtype: str = "float32"  # A key of model_config.DTYPES.
  # One of sharding.WEIGHT_LAYOUTS: where the regrouped weights live.
  weight_layout: str = "sharded"
  # A key of kv_cache.VALUE_LAYOUTS, set for the platform by `for_platform`,
  # so it is not a config field.
  value_layout: str = "SE"
  # One of decode_attention.KERNELS; `for_platform` resolves "auto".
  decode_attention: str = "plain"
  # The cache's positions are allocated in multiples of this
  # (`cache_positions`); `for_platform` sets kv_cache.cache_align's on TPU.
  cache_align: int = 1
  interruption: InterruptionSettings = InterruptionSettings()

  @classmethod
  def from_config(
      cls,
      s: Any,
      *,
      eos_ids: Sequence[int],
      pad_id: int,
      think_close_id: Optional[int] = None,
      phrase_ids: Sequence[int] = (),
  ) -> "SamplingSettings":
    """From `config.sampling` (`s`) and the tokenizer's ids.

    `eos_ids` are all the ids that end a sequence (stop tokens too);
    `think_close_id` and `phrase_ids` (`s.interruption.phrase` tokenized) are
    needed for interruptions.
    """
    return cls(
        temperature=float(s.temperature),
        top_k=int(s.top_k),
        top_p=float(s.top_p),
        max_prompt_len=int(s.max_prompt_len),
        max_new_tokens=int(s.max_new_tokens),
        num_slots=int(s.num_slots),
        decode_steps_per_call=int(s.decode_steps_per_call),
        decode_steps_per_check=int(s.decode_steps_per_check),
        eos_ids=tuple(int(t) for t in eos_ids),
        pad_id=int(pad_id),
        kv_cache_dtype=str(s.kv_cache_dtype),
        weight_layout=str(s.weight_layout),
        decode_attention=str(s.decode_attention),
        interruption=InterruptionSettings.from_config(
            s.interruption, tuple(phrase_ids), think_close_id
        ),
    )

  def for_platform(
      self, model_cfg: ModelConfig, platform: str
  ) -> "SamplingSettings":
    """These settings as they run on `platform` ('tpu', 'gpu' or 'cpu'): its
    value-cache layout, its cache alignment and its decode kernel. Raises
    ValueError for `decode_attention="pallas"` on a cache no block tiles."""
    aligned = dataclasses.replace(
        self,
        value_layout=kv_cache.value_layout(platform, model_cfg.head_dim),
        cache_align=max(self.cache_align, kv_cache.cache_align(platform)),
    )
    return dataclasses.replace(
        aligned,
        decode_attention=decode_attention.choose(
            self.decode_attention, platform, aligned.cache_positions
        ),
    )

  @property
  def cache_len(self) -> int:
    """Positions per slot: the prompt budget plus the completion budget."""
    return self.max_prompt_len + self.max_new_tokens

  @property
  def cache_positions(self) -> int:
    """Positions the KV cache allocates per slot: `cache_len` rounded up to
    a multiple of `cache_align`."""
    return kv_cache.allocated_length(self.cache_len, self.cache_align)

  def validate(self, model_cfg: ModelConfig) -> None:
    """Raises ValueError naming the first setting the model cannot work with."""
    vocab = model_cfg.vocab_size
    if self.temperature < 0:
      raise ValueError(f"sampling.temperature: {self.temperature} must be >= 0")
    if not 0 <= self.top_k <= vocab:
      raise ValueError(
          f"sampling.top_k: {self.top_k} must be in [0, vocab_size={vocab}]"
      )
    if not 0 < self.top_p <= 1:
      raise ValueError(f"sampling.top_p: {self.top_p} must be in (0, 1]")
    if self.max_prompt_len <= 0 or self.max_new_tokens <= 0:
      raise ValueError(
          f"sampling.max_prompt_len / max_new_tokens: {self.max_prompt_len} / "
          f"{self.max_new_tokens} must both be > 0"
      )
    if self.cache_len > model_cfg.max_seq_len:
      raise ValueError(
          f"sampling.max_new_tokens: max_prompt_len {self.max_prompt_len} + max_new_tokens "
          f"{self.max_new_tokens} = {self.cache_len} exceeds the KV cache limit "
          f"model.max_seq_len {model_cfg.max_seq_len}"
      )
    if self.num_slots < 0:
      raise ValueError(f"sampling.num_slots: {self.num_slots} must be >= 0")
    if self.decode_steps_per_call <= 0:
      raise ValueError(
          f"sampling.decode_steps_per_call: {self.decode_steps_per_call} must be > 0"
      )
    if self.decode_steps_per_check <= 0:
      raise ValueError(
          f"sampling.decode_steps_per_check: {self.decode_steps_per_check} must be > 0"
      )
    bad = [t for t in self.eos_ids + (self.pad_id,) if not 0 <= t < vocab]
    if bad:
      raise ValueError(
          f"sampler eos/pad ids {bad} are outside the vocabulary [0, {vocab})"
      )
    self.interruption.validate(self.max_new_tokens, vocab)
