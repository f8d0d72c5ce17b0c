"""Memory and FLOPs per device of a config, with no device.

`make_plan` counts what each device holds in the train and generate phases
of an RL step: shapes from `jax.eval_shape` of the real code, per-device
shares from the config's partition rules on an `AbstractMesh`. Activations
are a floor; FLOPs assume every completion at the full token budget.
`program_estimates` splits the counts by program; `plan_report` sets them
against the accelerators.

Design: docs/design/planner.md; against the TPU compiler: docs/tpu.md.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Optional

import flax.linen as nn
import jax
from jax.sharding import AbstractMesh
from jax.sharding import PartitionSpec
import ml_collections
import numpy as np

from scalerl_jax import config as config_lib
from scalerl_jax import evaluation
from scalerl_jax import optim
from scalerl_jax import sharding
from scalerl_jax.jobs.planner.activations import Unsharded
from scalerl_jax.jobs.planner.activations import activation_bytes
from scalerl_jax.jobs.planner.activations import sampler_temps
from scalerl_jax.jobs.planner.layout_bytes import abstract_mesh
from scalerl_jax.jobs.planner.layout_bytes import shard_elements
from scalerl_jax.jobs.planner.layout_bytes import tree_bytes
from scalerl_jax.metrics import compute
from scalerl_jax.models import decode
from scalerl_jax.models import model_config
from scalerl_jax.models import transformer
from scalerl_jax.rl import schedules
from scalerl_jax.sampling import slots
from scalerl_jax.sampling.settings import SamplingSettings


def default_num_slots(config: ml_collections.ConfigDict) -> int:
  """Sampler slots the trainer runs with (`rl.schedules.num_slots`)."""
  return schedules.num_slots(config)


@dataclasses.dataclass(frozen=True)
class Plan:
  """Per-device bytes and per-step FLOPs of one config on one mesh."""

  mesh_shape: dict[str, int]
  num_slots: int
  train_rows: int  # P x G sequences per train step.
  seq_len: int  # max_prompt_len + max_new_tokens.
  remat: bool  # config.model.remat: which activation figure counts.
  params: int
  opt_state: int  # Moments sharded like their parameters (rl/train_step.py).
  grads: int
  grad_accum: int  # float32 gradient sums over microbatches; 0 without.
  kv_cache: int
  slot_records: int
  decode_weights: int  # Layer weights in the compute dtype; generate only.
  # The train step's activations and the weights it un-shards (`unsharded`),
  # at its peak phase (`activation_bytes`), with and without remat.
  activations_remat: int
  activations_no_remat: int
  # With config.model.remat, per sequence on a device, without the weights.
  activations_per_row: int
  rows_per_device: int  # ceil(train_rows / microbatches / batch-axis ways).
  generation_flops: int
  train_flops: int
  batch: int = 0  # The train step's input arrays.
  # Weights the train step un-shards over fsdp to use them, each phase its
  # own (counted in the activations, at the phase that peaks).
  unsharded: Unsharded = Unsharded()
  # With `sampling.weight_layout` "sharded", the decode loop's weights gathered
  # over fsdp, at the least: the float32 LM head and one regrouped layer at a
  # time. Where HBM is plentiful the TPU compiler holds the whole network
  # instead (docs/tpu.md). "resident": 0, nothing is gathered.
  decode_gathered: int = 0
  # Embedding, LM head and final norm in the regrouped weights.
  prepared_rest: int = 0
  # The regroup's own: a tied embedding is transposed into the head from a
  # copy as large as the head (qwen3_0.6b on v6e 16x16: 0.63 GB measured).
  # Some chips' compilers stage the layers too (`program_estimates`).
  prepare_temps: int = 0
  prefill_temps: int = 0  # One prefill of every slot at the full prompt width.
  decode_temps: int = 0  # One decode step over every slot.
  val_slot_state: int = 0  # Validation's slots (KV cache and records).
  val_prefill_temps: int = 0
  val_decode_temps: int = 0

  @property
  def slot_state(self) -> int:
    return self.kv_cache + self.slot_records

  @property
  def activations(self) -> int:
    return self.activations_remat if self.remat else self.activations_no_remat

  @property
  def resident(self) -> int:
    """What stays allocated through the whole step."""
    return self.params + self.opt_state + self.kv_cache + self.slot_records

  @property
  def train_peak(self) -> int:
    return self.resident + self.grads + self.grad_accum + self.activations

  @property
  def generate_peak(self) -> int:
    return self.resident + self.decode_weights + self.prepared_rest

  @property
  def peak(self) -> int:
    return max(self.train_peak, self.generate_peak)


def _check_divides(what: str, count: int, ways: int) -> None:
  if count % ways:
    raise config_lib.ConfigError(
        f"{what}: {count} does not divide over the {ways}-way batch sharding of the mesh"
    )


def _train_shapes(
    config: ml_collections.ConfigDict,
    cfg: model_config.ModelConfig,
    mesh: AbstractMesh,
    rules: sharding.Rules,
) -> tuple[Any, Any, Any, Any]:
  """Abstract params, their specs, opt state and its specs, as trained."""
  # The parameters' shapes do not depend on the attention kernel; tracing
  # cuDNN's or splash's here would need that hardware's libraries.
  model = transformer.Transformer(dataclasses.replace(cfg, attention="plain"))
  init = lambda: model.init(jax.random.key(0), np.zeros((1, 1), np.int32))
  params = nn.unbox(jax.eval_shape(lambda: init()["params"]))
  shardings = sharding.param_shardings(model, mesh, rules)
  param_specs = jax.tree.map(lambda s: s.spec, shardings)
  optimizer = optim.make_optimizer(config.optim)
  opt_state = jax.eval_shape(optimizer.init, params)
  # The trainer's layout (tests/plan_test.py checks it on real arrays).
  opt_specs = sharding.opt_state_shardings(
      optimizer, params, param_specs, PartitionSpec()
  )
  return params, param_specs, opt_state, opt_specs


def _prepared_weights(
    cfg: model_config.ModelConfig,
    params: Any,
    rules: sharding.Rules,
    layout: str,
) -> tuple[Any, tuple[Any, ...], dict[str, Any], dict[str, Any]]:
  """The sampler's abstract layers, their specs, the rest and its specs."""
  # The sampler's regrouped weights (`decode.prepare`), laid out by their names
  # in `sampling.weight_layout`.
  prepared = jax.eval_shape(functools.partial(decode.prepare, cfg), params)
  weight_rules = sharding.sampler_rules(rules, layout)
  specs = lambda axes, names: {
      name: nn.logical_to_mesh_axes(axes[name], weight_rules) for name in names
  }
  layers = prepared["layers"]
  head = {k: v for k, v in prepared.items() if k != "layers"}
  layer_specs = tuple(specs(decode.PREPARED_AXES, layer) for layer in layers)
  return layers, layer_specs, head, specs(decode.TOP_AXES, head)


def _sampling_settings(
    s: ml_collections.ConfigDict, cfg: model_config.ModelConfig, platform: str
) -> SamplingSettings:
  """`config.sampling`'s cache and decode settings as run on `platform`."""
  return SamplingSettings(
      max_prompt_len=s.max_prompt_len,
      max_new_tokens=s.max_new_tokens,
      kv_cache_dtype=s.kv_cache_dtype,
      decode_attention=s.decode_attention,
  ).for_platform(cfg, platform)


def _slot_bytes(
    cfg: model_config.ModelConfig,
    settings: SamplingSettings,
    mesh: AbstractMesh,
    rules: sharding.Rules,
    platform: str,
    n: int,
) -> tuple[int, int, int, int]:
  """Bytes of `n` slots: KV cache, whole state, prefill and decode temps."""
  state = jax.eval_shape(
      functools.partial(slots.empty_state, cfg, settings, n, 1)
  )
  state_specs = jax.tree.map(
      lambda sh: sh.spec,
      slots.state_shardings(mesh, rules, cfg.num_layers, settings.value_layout),
  )
  prefill_temps, decode_temps = sampler_temps(
      cfg,
      mesh,
      rules,
      n,
      width=settings.max_prompt_len,
      cache_len=settings.cache_len,
      kv_bytes=np.dtype(model_config.DTYPES[settings.kv_cache_dtype]).itemsize,
      platform=platform,
      decode_kernel=settings.decode_attention,
      cache_positions=settings.cache_positions,
  )
  return (
      tree_bytes(state.cache, state_specs.cache, mesh),
      tree_bytes(state, state_specs, mesh),
      prefill_temps,
      decode_temps,
  )


def _batch_bytes(
    rows: int, seq_len: int, mesh: AbstractMesh, rules: sharding.Rules
) -> int:
  """The train batch's bytes: three 4-byte [rows, seq_len] arrays, rewards."""
  rows_spec = PartitionSpec(nn.logical_to_mesh_axes(("act_batch",), rules)[0])
  return 3 * 4 * shard_elements((rows, seq_len), rows_spec, mesh) + rows * 4


def _without_fsdp(spec: PartitionSpec) -> PartitionSpec:
  """`spec` with the fsdp axis taken out of every dimension."""
  return PartitionSpec(*(sharding.without_axes(a, ("fsdp",)) for a in spec))


def _gathered_weights(
    cfg: model_config.ModelConfig,
    params: Any,
    param_specs: Any,
    layer: Any,
    layer_spec: Any,
    layout: str,
    mesh: AbstractMesh,
) -> tuple[Unsharded, int]:
  """The train step's `Unsharded` weights; the bytes a decode step gathers."""
  gathered = lambda name: 4 * shard_elements(
      params[name].shape, _without_fsdp(param_specs[name]), mesh
  )
  # The LM head gathered over fsdp, in float32 (the FP32 head).
  head = gathered("embedding" if cfg.tie_embeddings else "lm_head")
  # An untied embedding table is gathered too, for the lookup, in float32
  # (llama3_8b on v5p 4x4x8: 4.2 GB with its gradient that the compiler held
  # and this count missed).
  embedding = 0 if cfg.tie_embeddings else gathered("embedding")
  one_layer = jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape[1:], cfg.dtype), params["layers"]
  )
  layer_specs_1 = jax.tree.map(
      lambda sp: _without_fsdp(PartitionSpec(*sp[1:])), param_specs["layers"]
  )
  unsharded = Unsharded(
      head=2 * head,
      layer=2 * tree_bytes(one_layer, layer_specs_1, mesh),
      embedding=2 * embedding,
  )
  # Resident weights are whole on each chip already: nothing to gather.
  if layout == "resident":
    return unsharded, 0
  is_spec = lambda x: isinstance(x, PartitionSpec)
  layer_spec = jax.tree.map(_without_fsdp, layer_spec, is_leaf=is_spec)
  return unsharded, head + tree_bytes(layer, layer_spec, mesh)


def _prepare_temps(
    cfg: model_config.ModelConfig,
    head: dict[str, Any],
    head_specs: dict[str, Any],
    mesh: AbstractMesh,
) -> int:
  """Bytes of the head a tied embedding is transposed into; 0 when untied."""
  names = ("head", "head_lo") if cfg.tie_embeddings else ()
  return sum(
      tree_bytes(head[n], head_specs[n], mesh) for n in names if n in head
  )


def _grad_accum(
    params: Any, param_specs: Any, mesh: AbstractMesh, microbatches: int
) -> int:
  """Bytes of the float32 gradient sums over microbatches; 0 without."""
  if microbatches <= 1:
    return 0
  f32 = lambda x: jax.ShapeDtypeStruct(x.shape, np.float32)
  return tree_bytes(jax.tree.map(f32, params), param_specs, mesh)


def make_plan(
    config: ml_collections.ConfigDict, num_devices: int, platform: str = "tpu"
) -> Plan:
  """Counts memory and FLOPs for `config` on `num_devices` devices.

  `config.model` gives the model's shape (an `hf_path` checkpoint is not
  read). `platform` ('tpu', 'gpu' or 'cpu') resolves `model.attention=auto`
  and whether arrays are tiled. Raises ConfigError when the config is invalid
  on this many devices, or the slots or the train batch do not divide over
  the batch axes.
  """
  config_lib.validate(config, num_devices)
  cfg = model_config.ModelConfig.from_config(config.model)
  mesh = abstract_mesh(config.mesh, num_devices)
  rules = sharding.logical_rules(config.mesh)
  batch_ways = sharding.batch_divisor(mesh, rules)
  num_slots = default_num_slots(config)
  rows = config.data.prompts_per_step * config.data.generations_per_prompt
  _check_divides("sampling.num_slots", num_slots, batch_ways)
  _check_divides(
      "data.prompts_per_step x data.generations_per_prompt", rows, batch_ways
  )
  params, param_specs, opt_state, opt_specs = _train_shapes(
      config, cfg, mesh, rules
  )
  s = config.sampling
  layers, layer_specs, head, head_specs = _prepared_weights(
      cfg, params, rules, s.weight_layout
  )
  settings = _sampling_settings(s, cfg, platform)
  seq_len = settings.cache_len
  kv_cache, slot_state, prefill_temps, decode_temps = _slot_bytes(
      cfg, settings, mesh, rules, platform, num_slots
  )
  val_slots = evaluation.num_slots(config, batch_ways)
  _, val_slot_state, val_prefill_temps, val_decode_temps = _slot_bytes(
      cfg, settings, mesh, rules, platform, val_slots
  )
  unsharded, decode_gathered = _gathered_weights(
      cfg, params, param_specs, layers[0], layer_specs[0], s.weight_layout, mesh
  )
  acts = functools.partial(
      activation_bytes,
      cfg,
      mesh,
      rules,
      seq_len=seq_len,
      platform=platform,
      chunk=config.trainer.logprob_chunk,
  )
  microbatches = config.trainer.microbatches
  micro_rows = rows // microbatches
  return Plan(
      mesh_shape=dict(mesh.shape),
      num_slots=num_slots,
      train_rows=rows,
      seq_len=seq_len,
      remat=cfg.remat,
      params=tree_bytes(params, param_specs, mesh),
      opt_state=tree_bytes(opt_state, opt_specs, mesh),
      grads=tree_bytes(params, param_specs, mesh),
      kv_cache=kv_cache,
      grad_accum=_grad_accum(params, param_specs, mesh, microbatches),
      slot_records=slot_state - kv_cache,
      decode_weights=tree_bytes(layers, layer_specs, mesh),
      activations_remat=acts(rows=micro_rows, remat=True, weights=unsharded),
      activations_no_remat=acts(
          rows=micro_rows, remat=False, weights=unsharded
      ),
      activations_per_row=acts(rows=batch_ways, remat=cfg.remat),
      rows_per_device=-(-rows // microbatches // batch_ways),
      generation_flops=compute.generation_flops(
          cfg, [s.max_prompt_len] * rows, [s.max_new_tokens] * rows
      ),
      train_flops=compute.train_flops(cfg, [seq_len] * rows),
      batch=_batch_bytes(rows, seq_len, mesh, rules),
      unsharded=unsharded,
      decode_gathered=decode_gathered,
      prepared_rest=tree_bytes(head, head_specs, mesh),
      prepare_temps=_prepare_temps(cfg, head, head_specs, mesh),
      prefill_temps=prefill_temps,
      decode_temps=decode_temps,
      val_slot_state=val_slot_state,
      val_prefill_temps=val_prefill_temps,
      val_decode_temps=val_decode_temps,
  )


def resolve_num_devices(mesh_cfg: Any, requested: Optional[int]) -> int:
  """`requested`, else a -1-free mesh's size, else `jax.device_count()`."""
  if requested is not None:
    return requested
  if -1 not in mesh_cfg.shape:
    return math.prod(mesh_cfg.shape)
  return jax.device_count()
