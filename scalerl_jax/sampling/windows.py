"""Attention windows: decode calls that read only a prefix of the KV cache.

A decode step attends over the whole cache unless the call is compiled for a
window w shorter than it: every row the call touches must stay within w
positions. The windows are spaced evenly from `_MIN_WINDOW` to the cache
length, at most `_MAX_WINDOWS` of them (each is one more decode program).
With the Pallas decode kernel, which reads each row's cache only to its
length, there are none. Design: docs/design/sampling.md.
"""

from __future__ import annotations

from scalerl_jax.sampling.settings import SamplingSettings

_MIN_WINDOW = 64
_WINDOW_ALIGN = 32
_MAX_WINDOWS = 4


def attention_windows(settings: SamplingSettings) -> list[int]:
  """Windows shorter than the cache, ascending (window 0: the whole cache)."""
  if settings.decode_attention == "pallas":
    return []
  s = settings.cache_len
  span = s - _MIN_WINDOW
  step = _WINDOW_ALIGN * max(1, -(-span // (_WINDOW_ALIGN * _MAX_WINDOWS)))
  return list(range(_MIN_WINDOW, s, step))


def window_for(windows: list[int], longest: int, num_steps: int) -> int:
  """The smallest window a call of `num_steps` fits in (0: none does).

  `longest` is the longest running row; step j (from 0) processes the token
  at position length - 1 <= longest - 1 + j.
  """
  return next((w for w in windows if longest + num_steps - 1 <= w), 0)


def generate_calls(
    windows: list[int], longest_prompt: int, total: int
) -> list[tuple[int, int]]:
  """(window, steps) of the calls that decode `total` tokens from prompts.

  Before step j (from 0) no row is longer than the longest prompt + j, so the
  early steps run in the shorter windows; the rest in the whole cache.
  """
  calls, done = [], 0
  for window in windows:
    steps = min(window - longest_prompt - done + 1, total - done)
    if steps > 0:
      calls.append((window, steps))
      done += steps
  if done < total:
    calls.append((0, total - done))
  return calls
