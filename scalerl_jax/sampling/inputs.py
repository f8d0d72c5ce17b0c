"""The sampler's host inputs, checked before anything compiles.

Each check raises ValueError naming the argument and what is wrong with it,
and returns the array as the jitted programs take it (int32, prompts cut or
padded to a power-of-two bucket, so a few widths compile).

Shape letters: the package key (scalerl_jax/__init__.py), and W metadata ints
per sequence.
"""

from __future__ import annotations

from typing import Any

import numpy as np

# Prompt widths are bucketed to a power of two, at least this.
_MIN_PROMPT_BUCKET = 8


def pow2_at_least(n: int) -> int:
  """The smallest power of two >= n (1 for n <= 1)."""
  return 1 << max(n - 1, 0).bit_length()


def check_prompts(
    prompt_tokens: Any,
    prompt_lens: Any,
    max_prompt_len: int,
    vocab_size: int,
    pad_id: int,
) -> tuple[np.ndarray, np.ndarray]:
  """Prompts [B, L] cut or padded to a length bucket, and lengths [B]."""
  prompts = np.asarray(prompt_tokens)
  lens = np.asarray(prompt_lens)
  if prompts.ndim != 2 or not np.issubdtype(prompts.dtype, np.integer):
    raise ValueError(
        f"prompt_tokens: expected a [batch, length] int array, got shape {prompts.shape} "
        f"dtype {prompts.dtype}"
    )
  b, width = prompts.shape
  if b == 0:
    raise ValueError("prompt_tokens: empty batch")
  if lens.shape != (b,) or not np.issubdtype(lens.dtype, np.integer):
    raise ValueError(f"prompt_lens: expected {b} ints, got shape {lens.shape}")
  for i, n in enumerate(lens.tolist()):
    if n < 1:
      raise ValueError(
          f"prompt {i}: length {n}; prompts need at least one token"
      )
    if n > max_prompt_len:
      raise ValueError(
          f"prompt {i}: {n} tokens exceed the prompt budget sampling.max_prompt_len {max_prompt_len}"
      )
    if n > width:
      raise ValueError(
          f"prompt {i}: length {n} exceeds the prompt_tokens width {width}"
      )
  inside = np.arange(width)[None, :] < lens[:, None]
  bad = inside & ((prompts < 0) | (prompts >= vocab_size))
  if bad.any():
    i, j = np.argwhere(bad)[0]
    raise ValueError(
        f"prompt {i}: token id {prompts[i, j]} at position {j} is outside the vocabulary "
        f"[0, {vocab_size})"
    )
  p = min(
      max(pow2_at_least(int(lens.max())), _MIN_PROMPT_BUCKET), max_prompt_len
  )
  prompts = prompts[:, :p]
  if prompts.shape[1] < p:
    prompts = np.pad(prompts, ((0, 0), (0, p - width)), constant_values=pad_id)
  return prompts.astype(np.int32), lens.astype(np.int32)


def check_slot_ids(slot_ids: Any, b: int, active_N: np.ndarray) -> np.ndarray:
  """[B] distinct ids of slots that hold no sequence (`active_N` False)."""
  num_slots = active_N.shape[0]
  slot_ids_B = np.asarray(slot_ids)
  if slot_ids_B.shape != (b,) or not np.issubdtype(
      slot_ids_B.dtype, np.integer
  ):
    raise ValueError(
        f"slot_ids: expected {b} ints, got shape {slot_ids_B.shape}"
    )
  if np.any((slot_ids_B < 0) | (slot_ids_B >= num_slots)):
    raise ValueError(
        f"slot_ids: {slot_ids_B.tolist()} must lie in [0, {num_slots})"
    )
  if len(np.unique(slot_ids_B)) != b:
    raise ValueError(f"slot_ids: {slot_ids_B.tolist()} contains duplicates")
  busy = slot_ids_B[active_N[slot_ids_B]]
  if busy.size:
    raise ValueError(
        f"slot_ids: slots {busy.tolist()} still hold sequences; harvest first"
    )
  return slot_ids_B


def check_meta(meta: Any, b: int, width: int) -> np.ndarray:
  """[B, W] int32 metadata (None: zeros; [B] accepted when W == 1)."""
  if meta is None:
    return np.zeros((b, width), np.int32)
  meta = np.asarray(meta)
  if meta.ndim == 1 and width == 1:
    meta = meta[:, None]
  if meta.shape != (b, width) or not np.issubdtype(meta.dtype, np.integer):
    raise ValueError(
        f"meta: expected a [{b}, {width}] int array, got shape {meta.shape}"
    )
  return meta.astype(np.int32)
