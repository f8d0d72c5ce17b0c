"""Metric writers, compute accounting, the NaN guard and the terminal progress line.

A run's workdir receives `metrics.jsonl` (one JSON object per line: an int
"step" and scalar metrics) and TensorBoard event files under `tb/`, written by
process 0 only. Validation lines carry `VAL_KEY`; every line carries the
cumulative `FLOPS_KEY` and `DEVICE_SECONDS_KEY`, the x-axes that
`scalerl_jax.scaling` fits curves against.

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
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import tempfile
import time
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence, TextIO

from absl import logging
import jax
import numpy as np
import tensorboardX

from scalerl_jax.models.transformer import ModelConfig

METRICS_FILE = "metrics.jsonl"
TB_DIR = "tb"
VAL_KEY = "val/mean_at_k"
FLOPS_KEY = "compute/flops"
DEVICE_SECONDS_KEY = "compute/device_seconds"


def _plain(value: Any) -> int | float:
  """A Python int or float from a Python/numpy/JAX scalar."""
  array = np.asarray(value)
  if array.shape != ():
    raise ValueError(f"metric value of shape {array.shape} is not a scalar")
  if np.issubdtype(array.dtype, np.integer):
    return int(array)
  return float(array)


class MetricWriter:
  """Appends scalar metrics to `<workdir>/metrics.jsonl` and TensorBoard files.

  Each `write` is flushed before it returns, so a killed run keeps every line
  written. Non-primary processes write nothing.
  """

  def __init__(self, workdir: str, is_primary: Optional[bool] = None):
    """Creates the writer; files are opened on the first write.

    Args:
      workdir: the run's directory (created if missing, on the primary only).
      is_primary: whether this process writes; None means `jax.process_index() == 0`
        (decided here, not at import, so it follows `jax.distributed.initialize`).
    """
    self.workdir = workdir
    self.is_primary = jax.process_index() == 0 if is_primary is None else is_primary
    self.path = os.path.join(workdir, METRICS_FILE)
    self._jsonl: Optional[TextIO] = None
    self._tb: Optional[tensorboardX.SummaryWriter] = None
    self._purge_step: Optional[int] = None
    if self.is_primary:
      os.makedirs(workdir, exist_ok=True)

  def write(self, step: int, scalars: Mapping[str, Any]) -> None:
    """Writes one line `{"step": step, **scalars}` and the same TensorBoard scalars.

    Args:
      step: the training step the values belong to.
      scalars: metric name -> scalar (Python, numpy or JAX).
    """
    if not self.is_primary:
      return
    if "step" in scalars:
      raise ValueError("metric name 'step' is reserved for the step number")
    values = {name: _plain(v) for name, v in scalars.items()}
    if self._jsonl is None:
      self._jsonl = open(self.path, "a")
    self._jsonl.write(json.dumps({"step": int(step), **values}) + "\n")
    self._jsonl.flush()
    if self._tb is None:
      # A unique suffix: tensorboardX names files by the second, and a writer
      # reopened within that second would overwrite the previous file.
      self._tb = tensorboardX.SummaryWriter(
          os.path.join(self.workdir, TB_DIR), purge_step=self._purge_step,
          filename_suffix=f".{time.time_ns()}")
    for name, value in values.items():
      self._tb.add_scalar(name, value, int(step))
    self._tb.flush()

  def truncate_after(self, step: int) -> None:
    """Drops every line with step > `step`, for a run resuming from that step.

    The steps after the checkpoint will be logged again; this keeps
    `metrics.jsonl` free of duplicates. The file is rewritten atomically
    (temporary file + `os.replace`). A trailing line cut off by a kill is
    dropped with a warning. TensorBoard hides the orphaned events itself: the
    next event file starts with a purge marker at step + 1.

    Args:
      step: the step of the checkpoint being resumed.
    """
    if not self.is_primary:
      return
    self.close()
    self._purge_step = step + 1
    if not os.path.exists(self.path):
      return
    kept, dropped = [], 0
    with open(self.path) as f:
      lines = f.read().splitlines()
    for lineno, line in enumerate(lines, 1):
      if not line.strip():
        continue
      try:
        row_step = json.loads(line)["step"]
      except (json.JSONDecodeError, TypeError, KeyError) as e:
        if lineno == len(lines):
          logging.warning("%s:%d: dropping an incomplete last line (%s)", self.path, lineno, e)
          continue
        raise ValueError(f"{self.path}:{lineno}: not a metrics line ({e!r}); fix or remove it "
                         "before resuming") from e
      if row_step <= step:
        kept.append(line + "\n")
      else:
        dropped += 1
    fd, tmp = tempfile.mkstemp(dir=self.workdir, prefix=METRICS_FILE + ".", suffix=".tmp")
    try:
      with os.fdopen(fd, "w") as f:
        f.writelines(kept)
        f.flush()
        os.fsync(f.fileno())
      os.replace(tmp, self.path)
    except BaseException:
      os.unlink(tmp)
      raise
    if dropped:
      logging.info("%s: dropped %d lines after step %d (resuming)", self.path, dropped, step)

  def close(self) -> None:
    """Closes the files; a later `write` reopens them."""
    if self._jsonl is not None:
      self._jsonl.close()
      self._jsonl = None
    if self._tb is not None:
      self._tb.close()
      self._tb = None

  def __enter__(self) -> "MetricWriter":
    return self

  def __exit__(self, *exc) -> None:
    self.close()


def check_finite(scalars: Mapping[str, Any], step: int) -> None:
  """Raises if any metric is NaN or infinite.

  Args:
    scalars: metric name -> scalar or array.
    step: the step, named in the error.

  Raises:
    FloatingPointError: naming the step and every non-finite key with its value.
  """
  bad = []
  for name, value in scalars.items():
    array = np.asarray(value)
    if np.issubdtype(array.dtype, np.inexact) and not np.all(np.isfinite(array)):
      bad.append(f"{name}={array.tolist()}")
  if bad:
    raise FloatingPointError(f"step {step}: non-finite metrics: {', '.join(bad)}")


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


def forward_flops_per_token(cfg: ModelConfig, context: int) -> int:
  """Forward FLOPs of one token that attends to `context` keys (itself included).

  Args:
    cfg: the model's shape.
    context: number of keys attended to.

  Returns:
    2 x `matmul_params` + 4 x context x num_heads x head_dim x num_layers.
  """
  return 2 * matmul_params(cfg) + _attention_flops_per_key(cfg) * context


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

  @contextlib.contextmanager
  def timed(self, num_devices: int, flops: int | float = 0,
            clock: Callable[[], float] = time.perf_counter) -> Iterator[None]:
    """Adds the `with` body's wall time x `num_devices`, and `flops`.

    Block on the body's results inside it: JAX dispatch is asynchronous.

    Args:
      num_devices: devices occupied by the body.
      flops: FLOPs of the body, if known before it runs.
      clock: seconds source.
    """
    start = clock()
    yield
    self.add(flops, clock() - start, num_devices)

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


def _duration(seconds: float) -> str:
  seconds = int(round(seconds))
  hours, rest = divmod(seconds, 3600)
  return f"{hours}:{rest // 60:02d}:{rest % 60:02d}"


class Progress:
  """One terminal line: step/total, steps/s, ETA and a few live values.

  On a TTY the line is redrawn in place ('\\r') at every update; otherwise
  (logs, CI) a plain line is printed at most every `every_s` seconds, and at
  the last step.
  """

  def __init__(self, total_steps: int, start_step: int = 0, every_s: float = 30.0,
               stream: Optional[TextIO] = None, clock: Callable[[], float] = time.monotonic):
    """Starts the clock.

    Args:
      total_steps: the step at which the run ends.
      start_step: the step it starts (or resumes) from; the rate counts from here.
      every_s: seconds between plain lines when the stream is not a TTY.
      stream: where to print; stderr by default.
      clock: seconds source.
    """
    self.total_steps = total_steps
    self.start_step = start_step
    self.every_s = every_s
    self._stream = stream if stream is not None else sys.stderr
    self._tty = self._stream.isatty()
    self._clock = clock
    self._start = clock()
    self._last_print: Optional[float] = None
    self._width = 0

  def line(self, step: int, **live: Any) -> str:
    """The progress text for `step` with `live` values (name=value)."""
    elapsed = self._clock() - self._start
    done = step - self.start_step
    parts = [f"step {step}/{self.total_steps}"]
    if done > 0 and elapsed > 0:
      rate = done / elapsed
      parts.append(f"{rate:.3g} steps/s")
      parts.append(f"ETA {_duration(max(self.total_steps - step, 0) / rate)}")
    for name, value in live.items():
      number = float(np.asarray(value))
      parts.append(f"{name} {number:.4g}" if math.isfinite(number) else f"{name} {number}")
    return " | ".join(parts)

  def update(self, step: int, **live: Any) -> None:
    """Shows the progress at `step`.

    Args:
      step: the step just finished.
      **live: values to show, e.g. `pass_rate=0.42`.
    """
    now = self._clock()
    text = self.line(step, **live)
    if self._tty:
      self._stream.write("\r" + text.ljust(self._width))
      self._width = len(text)
    elif (self._last_print is None or now - self._last_print >= self.every_s
          or step >= self.total_steps):
      self._stream.write(text + "\n")
      self._last_print = now
    else:
      return
    self._stream.flush()

  def close(self) -> None:
    """Ends the redrawn line on a TTY."""
    if self._tty and self._width:
      self._stream.write("\n")
      self._stream.flush()
      self._width = 0
