"""Jitted KV-cache sampler: continuous batching, in-flight weight updates.

`generate` completes a batch (`Completions` in input order). The slot
interface (PipelineRL) keeps N slots full: `start` prefills prompts into free
slots, `advance` decodes with that call's parameters (each token records its
`version`), `harvest` takes finished sequences out. Parameters may change
between any two calls; sequences in flight keep their KV cache. Every input a
caller can get wrong raises ValueError before anything compiles
(`sampling/inputs.py`); all processes of a multi-host run pass the same host
arrays. The jitted programs it calls: programs.py (`Sampler.programs`).

Design: docs/design/sampling.md.

Shape letters: the package key (scalerl_jax/__init__.py), and W metadata ints
per sequence; n, f: B and F rows padded to a bucket.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import jax
from jax.sharding import Mesh
import ml_collections
import numpy as np

from scalerl_jax import sharding
from scalerl_jax.models.model_config import ModelConfig
from scalerl_jax.sampling import inputs
from scalerl_jax.sampling import programs
from scalerl_jax.sampling import slots
from scalerl_jax.sampling import windows
from scalerl_jax.sampling.completions import Completions
from scalerl_jax.sampling.settings import SamplingSettings
from scalerl_jax.sampling.slots import SlotState


def generate_slots(batch: int, divisor: int) -> int:
  """Slots for `batch` prompts in `generate`: a multiple of `divisor`."""
  return -(-inputs.pow2_at_least(batch) // divisor) * divisor


def _as_key(rng: jax.Array) -> jax.Array:
  if jax.dtypes.issubdtype(rng.dtype, jax.dtypes.prng_key):
    return rng
  return jax.random.wrap_key_data(rng)


class PreparedParams:
  """`Sampler.prepare`'s regrouped parameters; pass them in place of params."""

  def __init__(self, weights: Any):
    self.weights = weights


class Sampler:
  """Prefill + decode over a slot-major KV cache on the policy's mesh."""

  def __init__(
      self,
      model_cfg: ModelConfig,
      settings: SamplingSettings,
      mesh: Mesh,
      rules: sharding.Rules,
      hbm_budget: Optional[float] = None,
  ):
    """Raises ValueError for settings `model_cfg` (the trainer's) cannot run.

    `hbm_budget` holds prefill and decode to that many bytes per chip where
    the compiler takes a limit (TPU: `sharding.hbm_budget_options`); None:
    none.
    """
    settings.validate(model_cfg)
    platform = sharding.platform_of(mesh)
    settings = settings.for_platform(model_cfg, platform)
    self.model_cfg = model_cfg
    self.settings = settings
    self.mesh = mesh
    # The model's weight names laid out as `settings.weight_layout` says;
    # activation and cache names as the trainer's.
    self.rules = sharding.sampler_rules(rules, settings.weight_layout)
    self.train_rules = rules  # The parameters' layout, which `prepare` reads.
    self.hbm_budget = hbm_budget
    self._divisor = sharding.batch_divisor(mesh, rules)
    self.programs = programs.Programs(
        model_cfg, settings, mesh, self.rules, rules, hbm_budget
    )

  @classmethod
  def from_config(
      cls,
      config: ml_collections.ConfigDict,
      mesh: Mesh,
      rules: sharding.Rules,
      *,
      eos_ids: Sequence[int],
      pad_id: int,
      think_close_id: Optional[int] = None,
      phrase_ids: Sequence[int] = (),
  ) -> "Sampler":
    """A sampler for `config.model` and `config.sampling`."""
    settings = SamplingSettings.from_config(
        config.sampling,
        eos_ids=eos_ids,
        pad_id=pad_id,
        think_close_id=think_close_id,
        phrase_ids=phrase_ids,
    )
    return cls(ModelConfig.from_config(config.model), settings, mesh, rules)

  def with_hbm_budget(self, hbm_budget: Optional[float]) -> "Sampler":
    """This sampler with its prefill and decode held to `hbm_budget` bytes
    per chip (compiled anew); itself where nothing would change."""
    if hbm_budget == self.hbm_budget:
      return self
    return Sampler(
        self.model_cfg, self.settings, self.mesh, self.train_rules, hbm_budget
    )

  def prepare(self, params: Any) -> PreparedParams:
    """`params` regrouped once for any number of `start` / `advance` calls.

    It holds a second copy of the weights for as long as the caller keeps it.
    """
    if isinstance(params, PreparedParams):
      return params
    return PreparedParams(self._call(self.programs.prepare, params))

  # Abstract use: compiling the programs without running them
  # (jobs/planner/aot.py lowers them through `programs.lower`).

  def state_shape(
      self, num_slots: int, meta_width: int = slots.DEFAULT_META_WIDTH
  ) -> SlotState:
    """`init_state(num_slots, meta_width)` as sharded ShapeDtypeStructs."""
    return sharding.abstract(
        jax.eval_shape(self.programs.empty, num_slots, meta_width),
        self.programs.state_shardings,
    )

  def prepared_shape(self, params: Any) -> Any:
    """`prepare(params).weights` as sharded ShapeDtypeStructs (compiles it)."""
    compiled = self.programs.lower("prepare", params).compile()
    return sharding.abstract(
        jax.eval_shape(self.programs.prepare, params),
        compiled.output_shardings,
    )

  # Slot interface.

  def init_state(
      self,
      num_slots: Optional[int] = None,
      meta_width: int = slots.DEFAULT_META_WIDTH,
  ) -> SlotState:
    """All N slots free, sharded over slots.

    `num_slots` (default `settings.num_slots`) must divide over the mesh's
    batch axes; `meta_width` is W.
    """
    num_slots = num_slots or self.settings.num_slots
    if num_slots <= 0:
      raise ValueError(
          "sampling.num_slots: 0; pass num_slots to init_state or set the field"
      )
    if num_slots % self._divisor:
      raise ValueError(
          f"num_slots {num_slots} does not divide over the {self._divisor}-way batch sharding "
          f"of the mesh; use a multiple of {self._divisor}"
      )
    if meta_width <= 0:
      raise ValueError(f"meta_width {meta_width} must be > 0")
    return self._call(self.programs.empty, num_slots, meta_width)

  def free_slots(self, state: SlotState) -> np.ndarray:
    """Ids of the slots that hold no sequence (host int array)."""
    active, _ = self._call(self.programs.flags, state)
    return np.flatnonzero(~np.asarray(active)).astype(np.int32)

  def progress(
      self, state: SlotState
  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Host (prompt_len [N], length [N] (prompt + completion), running [N])."""
    return tuple(np.asarray(x) for x in self.progress_arrays(state))

  def progress_arrays(self, state: SlotState) -> tuple[jax.Array, ...]:
    """`progress` on the devices, not waited for; ready once `state` is,
    and no later call donates them."""
    return self._call(self.programs.progress, state)

  def start(
      self,
      state: SlotState,
      params: Any,
      slot_ids: Any,
      prompt_tokens: Any,
      prompt_lens: Any,
      rng: jax.Array,
      meta: Any = None,
  ) -> SlotState:
    """Prefills prompts into free slots; they decode from the next `advance`.

    Args:
      state: slot state; donated (do not reuse it).
      params: policy parameters, or `prepare(params)`.
      slot_ids: [B] distinct free slots.
      prompt_tokens: [B, L] int ids; positions past a row's length ignored.
      prompt_lens: [B], 1 <= len <= min(L, sampling.max_prompt_len).
      rng: PRNG key; sequence i draws from fold_in(rng, i) only, whatever
        its slot and the other sequences.
      meta: [B, W] (or [B] when W == 1) int metadata returned with it.
    """
    prompts_BxL, lens_B = self._check_prompts(prompt_tokens, prompt_lens)
    b = len(lens_B)
    num_slots, width = state.meta.shape
    active, _ = self._call(self.programs.flags, state)
    slot_ids_B = inputs.check_slot_ids(slot_ids, b, np.asarray(active))
    meta_BxW = inputs.check_meta(meta, b, width)

    n = min(inputs.pow2_at_least(b), num_slots)
    pad = n - b
    slot_ids_n = np.concatenate(
        [slot_ids_B, np.full((pad,), num_slots)]
    ).astype(np.int32)
    prompts_nxL = np.pad(
        prompts_BxL, ((0, pad), (0, 0)), constant_values=self.settings.pad_id
    )
    lens_n = np.concatenate([lens_B, np.ones((pad,), np.int32)])
    meta_nxW = np.pad(meta_BxW, ((0, pad), (0, 0)))
    in_order = n == num_slots and bool(
        np.all((slot_ids_n == np.arange(n)) | (slot_ids_n >= n))
    )
    return self._call(
        self.programs.start,
        state,
        self.prepare(params).weights,
        slot_ids_n,
        prompts_nxL,
        lens_n,
        meta_nxW,
        _as_key(rng),
        in_order=in_order,
    )

  def advance(
      self,
      state: SlotState,
      params: Any,
      version: int,
      num_steps: Optional[int] = None,
  ) -> SlotState:
    """Decodes every running slot by up to `num_steps` tokens with `params`.

    `state` is donated. `params` (or `prepare(params)`), which may differ
    from earlier calls', choose every token of the call, each recorded with
    `version`. `num_steps` defaults to `sampling.decode_steps_per_call`; the
    call stops early when no slot is running.
    """
    num_steps = int(
        self.settings.decode_steps_per_call if num_steps is None else num_steps
    )
    if num_steps <= 0:
      raise ValueError(f"num_steps {num_steps} must be > 0")
    window, spans = 0, windows.attention_windows(self.settings)
    if spans:
      longest = int(self._call(self.programs.longest, state))
      window = windows.window_for(spans, longest, num_steps)
    return self._call(
        self.programs.advance,
        state,
        self.prepare(params).weights,
        np.int32(version),
        np.int32(num_steps),
        window=window,
    )

  def harvest(self, state: SlotState) -> tuple[SlotState, Completions]:
    """Takes every finished sequence out of its slot (`state` donated).

    Returns the new state and the finished sequences as host arrays in slot
    order; the slots in `Completions.slot` are free again.
    """
    active, done = self._call(self.programs.flags, state)
    rows_F = np.flatnonzero(np.asarray(active) & np.asarray(done)).astype(
        np.int32
    )
    num_slots = state.meta.shape[0]
    f = len(rows_F)
    bucket = min(inputs.pow2_at_least(max(f, 1)), num_slots)
    rows_f = np.concatenate(
        [rows_F, np.full((bucket - f,), num_slots, np.int32)]
    )
    state, out = self._call(self.programs.take, state, rows_f)
    return state, jax.tree.map(lambda x: np.asarray(x)[:f], out)

  # Whole batch.

  def generate(
      self,
      params: Any,
      prompt_tokens: Any,
      prompt_lens: Any,
      rng: jax.Array,
      version: int = 0,
      meta: Any = None,
  ) -> Completions:
    """Completions of B prompts in input order; args as for start/advance."""
    _, lens_B = self._check_prompts(prompt_tokens, prompt_lens)
    b = len(lens_B)
    meta_shape = () if meta is None else np.asarray(meta).shape
    meta_BxW = inputs.check_meta(
        meta,
        b,
        meta_shape[1] if len(meta_shape) == 2 else slots.DEFAULT_META_WIDTH,
    )
    num_slots = generate_slots(b, self._divisor)
    params = self.prepare(params)
    state = self.init_state(num_slots, meta_BxW.shape[1])
    state = self.start(
        state, params, np.arange(b), prompt_tokens, prompt_lens, rng, meta_BxW
    )
    # No row exceeds max_new_tokens, so the calls finish them all; prompt i
    # ran in slot i and harvest returns slot order (input order).
    for window, steps in windows.generate_calls(
        windows.attention_windows(self.settings),
        int(lens_B.max()),
        self.settings.max_new_tokens,
    ):
      state = self._call(
          self.programs.advance,
          state,
          params.weights,
          np.int32(version),
          np.int32(steps),
          window=window,
      )
    return self.harvest(state)[1]

  def _call(self, fn, *args, **static):
    # Traced inside the mesh context so the model's logical constraints apply.
    with sharding.activate(self.mesh, self.rules):
      return fn(*args, **static)

  def _check_prompts(
      self, prompt_tokens: Any, prompt_lens: Any
  ) -> tuple[np.ndarray, np.ndarray]:
    return inputs.check_prompts(
        prompt_tokens,
        prompt_lens,
        self.settings.max_prompt_len,
        self.model_cfg.vocab_size,
        self.settings.pad_id,
    )
