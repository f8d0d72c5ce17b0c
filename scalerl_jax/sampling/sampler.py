"""Jitted KV-cache sampler with continuous batching and in-flight weight updates.

`Sampler` is built once per (model, sampling settings, mesh) and compiles each
program once per shape bucket. Two ways to use it:

* Whole batch: `sampler.generate(params, prompts_BxL, prompt_lens_B, rng)`
  returns `Completions` in input order.
* Slots (PipelineRL): a fixed number of slots that the caller keeps full::

    state = sampler.init_state(num_slots, meta_width=2)
    state = sampler.start(state, params, free_slots, prompts, lens, rng, meta)
    while training:
      state = sampler.advance(state, params, version)   # weights of *this* call
      state, done = sampler.harvest(state)               # done.slot are free now
      state = sampler.start(state, params, done.slot[:k], new_prompts, ...)

  Parameters may change between any two calls; sequences in flight continue on
  their existing KV cache, and every generated token records the `version`
  passed to the `advance` call that chose it.

  Each call regroups the parameters for decoding (`decode.prepare`: fused
  kernels in the compute dtype), a pass over all weights. A caller that makes
  several calls with the same parameters passes `sampler.prepare(params)`
  instead, which regroups once; it holds a second copy of the weights for as
  long as the caller keeps it. `generate` does this for its own calls.

Which log-prob the losses use: `Completions.logp`, the log-probability of the
token under the model's full distribution at the sampling temperature. That is
the quantity the trainer recomputes with the same network call
(`token_logprobs(logits, tokens, temperature)`), so the ratio pi_train / pi_gen
reflects only staleness and generator/trainer numerics, as the ScaleRL losses
assume. `Completions.logp_sampling` is the log-probability under the top-k /
top-p truncated distribution the token was actually drawn from; it equals
`logp` when truncation is off (the ScaleRL recipe) and serves exact
behaviour-policy corrections and diagnostics.

Every input a caller can get wrong (prompt over budget, token id outside the
vocabulary, empty batch, occupied or unknown slot, budgets beyond the KV cache)
raises ValueError before anything is compiled. All processes of a multi-host
run pass the same host arrays.

Shape letters: the package key (scalerl_jax/__init__.py), and N slots, M metadata
ints, F finished sequences.
"""

from __future__ import annotations

import functools
from typing import Any, Optional, Sequence

import jax
import ml_collections
import numpy as np
from jax.sharding import Mesh

from scalerl_jax import sharding
from scalerl_jax.models import decode
from scalerl_jax.models.transformer import ModelConfig
from scalerl_jax.sampling import slots
from scalerl_jax.sampling.settings import SamplingSettings
from scalerl_jax.sampling.slots import Completions, SlotState

_MIN_PROMPT_BUCKET = 8
# Decoding attends over only the first W cache positions while every running
# sequence fits there (`Sampler._windows`). Windows start at _MIN_WINDOW
# (shorter ones save too little to pay for compiling another program), are
# multiples of _WINDOW_ALIGN apart, and number at most _MAX_WINDOWS (each is
# one more compiled decode program).
_MIN_WINDOW = 64
_WINDOW_ALIGN = 32
_MAX_WINDOWS = 4


def _pow2_at_least(n: int) -> int:
  return 1 << max(n - 1, 0).bit_length()


def generate_slots(batch: int, divisor: int) -> int:
  """Slots `Sampler.generate` runs `batch` prompts in, on a `divisor`-way batch sharding."""
  return -(-_pow2_at_least(batch) // divisor) * divisor


def _as_key(rng: jax.Array) -> jax.Array:
  """Accepts typed keys and legacy uint32[2] keys."""
  if jax.dtypes.issubdtype(rng.dtype, jax.dtypes.prng_key):
    return rng
  return jax.random.wrap_key_data(rng)


class PreparedParams:
  """Policy parameters regrouped for decoding by `Sampler.prepare`; pass in place of params."""

  def __init__(self, weights: Any):
    self.weights = weights


class Sampler:
  """Prefill + decode over a slot-major KV cache on the policy's mesh."""

  def __init__(self, model_cfg: ModelConfig, settings: SamplingSettings, mesh: Mesh,
               rules: sharding.Rules):
    """Validates the settings against the model and prepares the jitted programs.

    Args:
      model_cfg: the policy network (the trainer's, so log-probs agree).
      settings: sampling settings and token ids.
      mesh: the policy's device mesh.
      rules: its logical-axis rules.
    """
    settings.validate(model_cfg)
    self.model_cfg = model_cfg
    self.settings = settings
    self.mesh = mesh
    self.rules = rules
    self._divisor = sharding.batch_divisor(mesh, rules)
    state_sh = slots.state_shardings(mesh, rules, model_cfg.num_layers)
    small = slots.replicated(mesh)
    bind = functools.partial
    self._prepare = jax.jit(bind(decode.prepare, model_cfg))
    self._empty = jax.jit(bind(slots.empty_state, model_cfg, settings), static_argnums=(0, 1),
                          out_shardings=state_sh)
    self._start = jax.jit(bind(slots.start, model_cfg, settings), donate_argnums=0,
                          out_shardings=state_sh, static_argnames="in_order")
    self._advance = jax.jit(bind(slots.advance, model_cfg, settings), donate_argnums=0,
                            out_shardings=state_sh, static_argnames="window")
    self._take = jax.jit(slots.take, donate_argnums=0, out_shardings=(state_sh, small))
    self._flags = jax.jit(lambda st: (st.active, st.done), out_shardings=(small, small))
    self._longest = jax.jit(slots.longest_running, out_shardings=small)
    self._progress = jax.jit(lambda st: (st.prompt_len, st.length, st.active & ~st.done),
                             out_shardings=(small, small, small))

  @classmethod
  def from_config(cls, config: ml_collections.ConfigDict, mesh: Mesh, rules: sharding.Rules,
                  *, eos_ids: Sequence[int], pad_id: int, think_close_id: Optional[int] = None,
                  phrase_ids: Sequence[int] = ()) -> "Sampler":
    """A sampler for `config.model` and `config.sampling`; see `SamplingSettings.from_config`."""
    settings = SamplingSettings.from_config(
        config.sampling, eos_ids=eos_ids, pad_id=pad_id, think_close_id=think_close_id,
        phrase_ids=phrase_ids)
    return cls(ModelConfig.from_config(config.model), settings, mesh, rules)

  def prepare(self, params: Any) -> PreparedParams:
    """`params` regrouped once for any number of `start` / `advance` calls (module docstring)."""
    if isinstance(params, PreparedParams):
      return params
    return PreparedParams(self._call(self._prepare, params))

  # Abstract use: compiling the programs without running them (scalerl_jax/jobs/aot.py).

  def lower(self, program: str, *args, **static) -> jax.stages.Lowered:
    """Lowers `program` ("prepare", "start" or "advance") for `args`, as a call would run it.

    The arguments may be abstract (`jax.ShapeDtypeStruct`s with shardings, as
    from `state_shape` and `prepared_shape`), so nothing is allocated; `start`
    takes the padded arguments of `slots.start` (what `Sampler.start` passes).
    """
    fn = {"prepare": self._prepare, "start": self._start, "advance": self._advance}[program]
    with sharding.activate(self.mesh, self.rules):
      return fn.lower(*args, **static)

  def state_shape(self, num_slots: int, meta_width: int = 1) -> SlotState:
    """`init_state(num_slots, meta_width)` as sharded ShapeDtypeStructs."""
    return sharding.abstract(jax.eval_shape(self._empty, num_slots, meta_width),
                             slots.state_shardings(self.mesh, self.rules,
                                                   self.model_cfg.num_layers))

  def prepared_shape(self, params: Any) -> Any:
    """`prepare(params).weights` as sharded ShapeDtypeStructs, for abstract `params`.

    The regrouped weights take the layout the compiler gives `prepare`'s
    outputs, so this compiles `prepare` (not run).
    """
    compiled = self.lower("prepare", params).compile()
    return sharding.abstract(jax.eval_shape(self._prepare, params), compiled.output_shardings)

  # Slot interface.

  def init_state(self, num_slots: Optional[int] = None, meta_width: int = 1) -> SlotState:
    """All slots free.

    Args:
      num_slots: number of slots N; defaults to `settings.num_slots`. Must
        divide over the mesh's batch axes.
      meta_width: M, the number of int32 metadata values per sequence.

    Returns:
      The slot state (device arrays, sharded over slots).
    """
    num_slots = num_slots or self.settings.num_slots
    if num_slots <= 0:
      raise ValueError("sampling.num_slots: 0; pass num_slots to init_state or set the field")
    if num_slots % self._divisor:
      raise ValueError(
          f"num_slots {num_slots} does not divide over the {self._divisor}-way batch sharding "
          f"of the mesh; use a multiple of {self._divisor}")
    if meta_width <= 0:
      raise ValueError(f"meta_width {meta_width} must be > 0")
    return self._call(self._empty, num_slots, meta_width)

  def free_slots(self, state: SlotState) -> np.ndarray:
    """Ids of the slots that hold no sequence (host int array)."""
    active, _ = self._call(self._flags, state)
    return np.flatnonzero(~np.asarray(active)).astype(np.int32)

  def progress(self, state: SlotState) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Where every slot stands (host arrays), to count the work of the calls between two reads.

    Returns:
      (prompt_len [N], length [N] prompt + completion tokens so far, running [N]
      whether the slot holds a sequence that is still decoding).
    """
    prompt_len, length, running = self._call(self._progress, state)
    return np.asarray(prompt_len), np.asarray(length), np.asarray(running)

  def start(self, state: SlotState, params: Any, slot_ids: Any, prompt_tokens: Any,
            prompt_lens: Any, rng: jax.Array, meta: Any = None) -> SlotState:
    """Prefills prompts into free slots; they decode from the next `advance`.

    Args:
      state: slot state; donated (do not reuse the argument).
      params: policy parameters for the prefill, or `prepare(params)`.
      slot_ids: [B] distinct free slots.
      prompt_tokens: [B, L] int token ids; positions past a row's length are ignored.
      prompt_lens: [B] prompt lengths, 1 <= len <= min(L, sampling.max_prompt_len).
      rng: PRNG key; sequence i draws its tokens and thinking budget from
        fold_in(rng, i) only, so its sampling does not depend on its slot or
        on the other sequences.
      meta: [B, M] (or [B] when M == 1) int metadata returned with the sequence.

    Returns:
      The new state.
    """
    prompts_BxL, lens_B = self._check_prompts(prompt_tokens, prompt_lens)
    b = len(lens_B)
    num_slots, width = state.meta.shape
    slot_ids_B = np.asarray(slot_ids)
    if slot_ids_B.shape != (b,) or not np.issubdtype(slot_ids_B.dtype, np.integer):
      raise ValueError(f"slot_ids: expected {b} ints, got shape {slot_ids_B.shape}")
    if np.any((slot_ids_B < 0) | (slot_ids_B >= num_slots)):
      raise ValueError(f"slot_ids: {slot_ids_B.tolist()} must lie in [0, {num_slots})")
    if len(np.unique(slot_ids_B)) != b:
      raise ValueError(f"slot_ids: {slot_ids_B.tolist()} contains duplicates")
    active, _ = self._call(self._flags, state)
    busy = slot_ids_B[np.asarray(active)[slot_ids_B]]
    if busy.size:
      raise ValueError(f"slot_ids: slots {busy.tolist()} still hold sequences; harvest first")
    meta_BxM = self._check_meta(meta, b, width)

    n = min(_pow2_at_least(b), num_slots)
    pad = n - b
    slot_ids_n = np.concatenate([slot_ids_B, np.full((pad,), num_slots)]).astype(np.int32)
    prompts_nxL = np.pad(prompts_BxL, ((0, pad), (0, 0)), constant_values=self.settings.pad_id)
    lens_n = np.concatenate([lens_B, np.ones((pad,), np.int32)])
    meta_nxM = np.pad(meta_BxM, ((0, pad), (0, 0)))
    in_order = n == num_slots and bool(np.all((slot_ids_n == np.arange(n)) | (slot_ids_n >= n)))
    return self._call(self._start, state, self.prepare(params).weights, slot_ids_n, prompts_nxL,
                      lens_n, meta_nxM, _as_key(rng), in_order=in_order)

  def advance(self, state: SlotState, params: Any, version: int,
              num_steps: Optional[int] = None) -> SlotState:
    """Decodes every running slot by up to `num_steps` tokens with `params`.

    Args:
      state: slot state; donated.
      params: parameters used for every token chosen in this call (they may
        differ from those of earlier calls: in-flight weight update), or
        `prepare(params)`.
      version: policy version recorded for those tokens.
      num_steps: decode steps; defaults to `sampling.decode_steps_per_call`.
        Stops early when no slot is running.

    Returns:
      The new state.

    When the cache is long enough for attention windows (see `_MIN_WINDOW`),
    this reads the longest running sequence's length (a scalar from the
    device) and runs the call in the smallest window that holds all of its
    steps: while every sequence is still short, as after a batch of prompts
    started together (ppo_off_policy), the steps skip the empty tail of the
    cache.
    """
    num_steps = int(self.settings.decode_steps_per_call if num_steps is None else num_steps)
    if num_steps <= 0:
      raise ValueError(f"num_steps {num_steps} must be > 0")
    window = 0
    if self._windows():
      # Step j (from 0) processes the token at position length - 1 <= longest - 1 + j.
      longest = int(self._call(self._longest, state))
      window = next((w for w in self._windows() if longest + num_steps - 1 <= w), 0)
    return self._call(self._advance, state, self.prepare(params).weights, np.int32(version),
                      np.int32(num_steps), window=window)

  def harvest(self, state: SlotState) -> tuple[SlotState, Completions]:
    """Takes every finished sequence out of its slot.

    Args:
      state: slot state; donated.

    Returns:
      (new state, finished sequences as host numpy arrays in slot order). The
      slots in `Completions.slot` are free again.
    """
    active, done = self._call(self._flags, state)
    rows_F = np.flatnonzero(np.asarray(active) & np.asarray(done)).astype(np.int32)
    num_slots = state.meta.shape[0]
    f = len(rows_F)
    bucket = min(_pow2_at_least(max(f, 1)), num_slots)
    rows_f = np.concatenate([rows_F, np.full((bucket - f,), num_slots, np.int32)])
    state, out = self._call(self._take, state, rows_f)
    return state, jax.tree.map(lambda x: np.asarray(x)[:f], out)

  # Whole batch.

  def generate(self, params: Any, prompt_tokens: Any, prompt_lens: Any, rng: jax.Array,
               version: int = 0, meta: Any = None) -> Completions:
    """Completes a batch of prompts on the slot machinery.

    Args:
      params: policy parameters (or `prepare(params)`); regrouped once for
        all of this call's prefill and decode programs.
      prompt_tokens: [B, L] int token ids.
      prompt_lens: [B] prompt lengths.
      rng: PRNG key.
      version: policy version recorded for the generated tokens.
      meta: optional [B, M] or [B] int metadata.

    Returns:
      Completions for the B prompts, in input order.
    """
    _, lens_B = self._check_prompts(prompt_tokens, prompt_lens)
    b = len(lens_B)
    meta_shape = () if meta is None else np.asarray(meta).shape
    meta_BxM = self._check_meta(meta, b, meta_shape[1] if len(meta_shape) == 2 else 1)
    num_slots = generate_slots(b, self._divisor)
    params = self.prepare(params)
    state = self.init_state(num_slots, meta_BxM.shape[1])
    state = self.start(state, params, np.arange(b), prompt_tokens, prompt_lens, rng, meta_BxM)
    # Each step appends one token to every running sequence, so before step j
    # (from 0) no row is longer than the longest prompt + j, and step j only
    # reads cache positions below that: the early steps run in a shorter
    # attention window. No row exceeds max_new_tokens, so the calls finish them
    # all; prompt i ran in slot i and harvest returns slot order (input order).
    longest, total, done = int(lens_B.max()), self.settings.max_new_tokens, 0
    for window in self._windows():
      steps = min(window - longest - done + 1, total - done)
      if steps > 0:
        state = self._call(self._advance, state, params.weights, np.int32(version),
                           np.int32(steps), window=window)
        done += steps
    if done < total:
      state = self._call(self._advance, state, params.weights, np.int32(version),
                         np.int32(total - done), window=0)
    return self.harvest(state)[1]

  def _windows(self) -> list[int]:
    """Attention windows shorter than the cache, ascending (see `_MIN_WINDOW`).

    E.g. a cache of 96 positions gets [64], 160 gets [64, 96, 128], and 288
    gets [64, 128, 192, 256].
    """
    s = self.settings.cache_len
    span = s - _MIN_WINDOW
    step = _WINDOW_ALIGN * max(1, -(-span // (_WINDOW_ALIGN * _MAX_WINDOWS)))
    return list(range(_MIN_WINDOW, s, step))

  def _call(self, fn, *args, **static):
    # Traced inside the mesh context so the model's logical constraints apply.
    with sharding.activate(self.mesh, self.rules):
      return fn(*args, **static)

  # Host-side validation.

  def _check_prompts(self, prompt_tokens: Any, prompt_lens: Any) -> tuple[np.ndarray, np.ndarray]:
    """Returns prompts [B, L'] cut or padded to a length bucket, and lengths [B]."""
    prompts = np.asarray(prompt_tokens)
    lens = np.asarray(prompt_lens)
    if prompts.ndim != 2 or not np.issubdtype(prompts.dtype, np.integer):
      raise ValueError(
          f"prompt_tokens: expected a [batch, length] int array, got shape {prompts.shape} "
          f"dtype {prompts.dtype}")
    b, width = prompts.shape
    if b == 0:
      raise ValueError("prompt_tokens: empty batch")
    if lens.shape != (b,) or not np.issubdtype(lens.dtype, np.integer):
      raise ValueError(f"prompt_lens: expected {b} ints, got shape {lens.shape}")
    budget = self.settings.max_prompt_len
    for i, n in enumerate(lens.tolist()):
      if n < 1:
        raise ValueError(f"prompt {i}: length {n}; prompts need at least one token")
      if n > budget:
        raise ValueError(
            f"prompt {i}: {n} tokens exceed the prompt budget sampling.max_prompt_len {budget}")
      if n > width:
        raise ValueError(f"prompt {i}: length {n} exceeds the prompt_tokens width {width}")
    vocab = self.model_cfg.vocab_size
    inside = np.arange(width)[None, :] < lens[:, None]
    bad = inside & ((prompts < 0) | (prompts >= vocab))
    if bad.any():
      i, j = np.argwhere(bad)[0]
      raise ValueError(
          f"prompt {i}: token id {prompts[i, j]} at position {j} is outside the vocabulary "
          f"[0, {vocab})")
    p = min(max(_pow2_at_least(int(lens.max())), _MIN_PROMPT_BUCKET), budget)
    prompts = prompts[:, :p]
    if prompts.shape[1] < p:
      prompts = np.pad(prompts, ((0, 0), (0, p - width)), constant_values=self.settings.pad_id)
    return prompts.astype(np.int32), lens.astype(np.int32)

  @staticmethod
  def _check_meta(meta: Any, b: int, width: int) -> np.ndarray:
    if meta is None:
      return np.zeros((b, width), np.int32)
    meta = np.asarray(meta)
    if meta.ndim == 1 and width == 1:
      meta = meta[:, None]
    if meta.shape != (b, width) or not np.issubdtype(meta.dtype, np.integer):
      raise ValueError(f"meta: expected a [{b}, {width}] int array, got shape {meta.shape}")
    return meta.astype(np.int32)
