"""Memory and FLOPs per device of a config on a named accelerator.

`make_plan` counts what each device holds in the train and generate phases
of an RL step, with no device: shapes from `jax.eval_shape` of the real
code, per-device shares from the config's partition rules on an
`AbstractMesh`. Activations are a floor; FLOPs assume every completion at
the full token budget. `program_estimates` splits the counts by program.

Design: docs/design/planner.md; against the TPU compiler: docs/tpu.md.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Optional, Sequence

import flax.linen as nn
import jax
import ml_collections
import numpy as np
from jax.sharding import AbstractMesh, PartitionSpec

from scalerl_jax.metrics import compute
from scalerl_jax import config as config_lib
from scalerl_jax import evaluation
from scalerl_jax import optim
from scalerl_jax import sharding
from scalerl_jax.models import attention as attention_lib
from scalerl_jax.models import decode
from scalerl_jax.models import transformer
from scalerl_jax.rl import schedules
from scalerl_jax.sampling import slots
from scalerl_jax.sampling.settings import SamplingSettings

GB = 1e9  # Vendors state HBM capacity in GB of 10^9 bytes; so does the report.


@dataclasses.dataclass(frozen=True)
class Accelerator:
  """Published per-chip figures of one accelerator."""

  name: str
  hbm_bytes: float  # HBM capacity per chip.
  peak_flops: float  # Dense bf16 FLOP/s per chip.
  source: str


# Published per-chip figures: HBM capacity and dense bf16 peak. NVIDIA's
# datasheets list 1,979 bf16 TFLOP/s "with sparsity"; dense is half.
ACCELERATORS = {
    "tpu_v5e": Accelerator(
        "TPU v5e", 16 * GB, 197e12, 'Google Cloud TPU docs, "TPU v5e"'
    ),
    "tpu_v5p": Accelerator(
        "TPU v5p", 95 * GB, 459e12, 'Google Cloud TPU docs, "TPU v5p"'
    ),
    "tpu_v6e": Accelerator(
        "TPU v6e", 32 * GB, 918e12, 'Google Cloud TPU docs, "TPU v6e"'
    ),
    "h100": Accelerator(
        "NVIDIA H100 SXM", 80 * GB, 989e12, "NVIDIA H100 datasheet"
    ),
    "h200": Accelerator(
        "NVIDIA H200 SXM", 141 * GB, 989e12, "NVIDIA H200 datasheet"
    ),
}


def abstract_mesh(mesh_cfg: Any, num_devices: int) -> AbstractMesh:
  """The config's mesh over `num_devices` devices, without the devices."""
  shape = sharding.resolve_mesh_shape(mesh_cfg.shape, num_devices)
  return AbstractMesh(shape, tuple(mesh_cfg.axes))


def shard_elements(
    shape: Sequence[int], spec: PartitionSpec, mesh: AbstractMesh
) -> int:
  """Entries in one device's shard of an array of `shape` laid out by `spec`.

  Each dimension keeps ceil(size / ways) entries, as XLA pads uneven shards;
  missing trailing entries of `spec` are replicated.
  """
  return math.prod(_local_shape(shape, spec, mesh))


def _local_shape(
    shape: Sequence[int], spec: PartitionSpec, mesh: AbstractMesh
) -> list[int]:
  local = []
  for i, size in enumerate(shape):
    axes = spec[i] if i < len(spec) else None
    axes = (
        ()
        if axes is None
        else (axes,)
        if isinstance(axes, str)
        else tuple(axes)
    )
    local.append(-(-size // math.prod(mesh.shape[a] for a in axes)))
  return local


def tpu_tiled(local_shape: Sequence[int], itemsize: int) -> list[int]:
  """`local_shape` padded to TPU tiles of (8 x 4 / itemsize, 128).

  The last dim is the minor one, padded to 128 lanes. The compiler picks
  which other dim tiles the sublanes, and takes the one that pads least:
  qwen2.5_0.5b's keys [1, 16383, 2, 64] are 8.4 MB on a v5e chip, with the
  16,383 positions in the sublanes, not 67 MB with the 2 heads there.
  """
  dims = list(local_shape)
  if dims:
    dims[-1] = -(-dims[-1] // 128) * 128
  if len(dims) >= 2:
    rows = 8 * max(1, 4 // itemsize)
    padded = lambda n: -(-n // rows) * rows
    # The least padding; on a tie the second-minor dim, as laid out.
    best = min(
        range(len(dims) - 1),
        key=lambda i: (padded(dims[i]) / dims[i], i != len(dims) - 2),
    )
    dims[best] = padded(dims[best])
  return dims


def shard_bytes(
    shape: Sequence[int],
    spec: PartitionSpec,
    mesh: AbstractMesh,
    itemsize: int,
    platform: str,
) -> int:
  """Bytes of one device's shard of `shape` laid out by `spec` (TPU: tiled)."""
  local = _local_shape(shape, spec, mesh)
  return (
      math.prod(tpu_tiled(local, itemsize) if platform == "tpu" else local)
      * itemsize
  )


def tree_bytes(abstract: Any, specs: Any, mesh: AbstractMesh) -> int:
  """Per-device bytes, untiled, of ShapeDtypeStructs laid out by `specs`."""
  sizes = jax.tree.map(
      lambda x, s: shard_elements(x.shape, s, mesh) * x.dtype.itemsize,
      abstract,
      specs,
  )
  return sum(jax.tree.leaves(sizes))


def default_num_slots(config: ml_collections.ConfigDict) -> int:
  """Sampler slots the trainer runs with (`rl.schedules.num_slots`)."""
  return schedules.num_slots(config)


# An activation: shape, logical axis names, bytes per entry.
Residual = tuple[tuple[int, ...], tuple[Optional[str], ...], int]


def _block_residuals(
    cfg: transformer.ModelConfig, b: int, t: int, attention: str
) -> list[Residual]:
  """(shape, logical axes, bytes) one block keeps for its backward pass."""
  c = np.dtype(cfg.dtype).itemsize
  h, k, e = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
  tok = ("act_batch", "act_len")
  embed = ((b, t, cfg.embed_dim), tok + ("act_embed",), c)
  heads = ((b, t, h, e), tok + ("act_heads", "head_dim"), c)
  kv = ((b, t, k, e), tok + ("act_kv_heads", "head_dim"), c)
  mlp = ((b, t, cfg.mlp_dim), tok + ("act_mlp",), c)
  scores = ((b, h, t, t), ("act_batch", "act_heads", "act_len", None), 4)
  # Block input, attention norm output, residual after attention, MLP norm
  # output; q, k, v after rope and the attention output (matmul inputs);
  # gate, up and their product; the float32 softmax output [B, H, T, T].
  out = [embed] * 4 + [heads, kv, kv, heads] + [mlp] * 3
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


@dataclasses.dataclass(frozen=True)
class Unsharded:
  """Per-device bytes of the weights the train step un-shards over fsdp, each
  with its gradient at full size beside it."""

  head: int = 0  # The float32 LM head (the embedding when tied), x 2.
  layer: int = 0  # One layer's kernels in the compute dtype, x 2.
  embedding: int = 0  # An untied float32 embedding table, x 2.


def activation_bytes(
    cfg: transformer.ModelConfig,
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
  - the head's: what the layers keep (with `remat` each layer's input, else
    every layer's residuals), the final hidden states, one float32 [rows, T,
    V] logit chunk (T cut to `chunk`; 0: whole) and `weights.head`;
  - a layer's backward: what the layers keep, one layer's residuals and
    `weights.layer`;
  - an untied embedding's gradient, after the layers: the hidden states'
    gradient and `weights.embedding`.
  The model runs on seq_len - 1 tokens; `platform` resolves `auto` attention.

  Measured against the TPU compiler's least peak (launch.compile
  --check_planner): the phases do not add up. Counted as a sum, with two logit
  chunks, the train step was 1.7x what the compiler needs at least for
  qwen2.5_0.5b and qwen3_0.6b (docs/tpu.md).
  """
  t = seq_len - 1

  def size(items):
    return sum(
        shard_bytes(
            shape, nn.logical_to_mesh_axes(axes, rules), mesh, nbytes, platform
        )
        for shape, axes, nbytes in items
    )

  block = _block_residuals(cfg, rows, t, _resolve_attention(cfg, platform, t))
  positions = min(chunk, t) if chunk else t
  logits = (
      (rows, positions, cfg.vocab_size),
      ("act_batch", "act_len", "act_vocab"),
      4,
  )
  hidden = size(block[:1])
  kept = cfg.num_layers * (hidden if remat else size(block))
  return max(
      kept + hidden + size([logits]) + weights.head,
      kept + (size(block) if remat else 0) + weights.layer,
      hidden + weights.embedding,
  )


def _resolve_attention(
    cfg: transformer.ModelConfig, platform: str, seq_len: int
) -> str:
  """The attention implementation `cfg.attention` runs as on `platform`."""
  if cfg.attention == attention_lib.AUTO:
    return attention_lib.pick(platform, seq_len, cfg.dtype)
  return cfg.attention


def _sampler_temps(
    cfg: transformer.ModelConfig,
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

  def size(items):
    return sum(
        shard_bytes(
            shape, nn.logical_to_mesh_axes(axes, rules), mesh, nbytes, platform
        )
        for shape, axes, nbytes in items
    )

  rows_axes = ("act_batch", "act_kv_heads", None, None)
  cache = [((rows, k, e, width), rows_axes, kv_bytes)] * (2 * cfg.num_layers)
  # tokens, logp, logp_sampling, version, uniform (4 B each) and mask (1 B).
  records = [((rows, cache_len), ("act_batch", None), 4)] * 5 + [
      ((rows, cache_len), ("act_batch", None), 1)
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


@dataclasses.dataclass(frozen=True)
class Plan:
  """Per-device bytes and per-step FLOPs of one config on one mesh."""

  mesh_shape: dict[str, int]
  num_slots: int
  train_rows: int  # P x G sequences per train step.
  seq_len: int  # max_prompt_len + max_new_tokens.
  remat: bool  # config.model.remat: which activation figure counts.
  params: int
  opt_state: int  # Moments sharded like their parameters, as in trainer.py.
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
  cfg = transformer.ModelConfig.from_config(config.model)
  mesh = abstract_mesh(config.mesh, num_devices)
  rules = sharding.logical_rules(config.mesh)
  batch_ways = sharding.batch_divisor(mesh, rules)
  num_slots = default_num_slots(config)
  rows = config.data.prompts_per_step * config.data.generations_per_prompt
  _check_divides("sampling.num_slots", num_slots, batch_ways)
  _check_divides(
      "data.prompts_per_step x data.generations_per_prompt", rows, batch_ways
  )

  # The parameters' shapes do not depend on the attention kernel; tracing
  # cuDNN's or splash's here would need that hardware's libraries.
  model = transformer.Transformer(dataclasses.replace(cfg, attention="plain"))
  params = nn.unbox(
      jax.eval_shape(
          lambda: model.init(jax.random.key(0), np.zeros((1, 1), np.int32))[
              "params"
          ]
      )
  )
  param_specs = jax.tree.map(
      lambda s: s.spec, sharding.param_shardings(model, mesh, rules)
  )
  optimizer = optim.make_optimizer(config.optim)
  opt_state = jax.eval_shape(optimizer.init, params)
  # The trainer's layout (tests/plan_test.py checks it on real arrays).
  opt_specs = sharding.opt_state_shardings(
      optimizer, params, param_specs, PartitionSpec()
  )
  # The sampler's regrouped weights (`decode.prepare`), laid out by their names
  # in `sampling.weight_layout`.
  prepared = jax.eval_shape(functools.partial(decode.prepare, cfg), params)
  weight_rules = sharding.sampler_rules(rules, config.sampling.weight_layout)
  layer_specs = tuple(
      {
          name: nn.logical_to_mesh_axes(
              decode.PREPARED_AXES[name], weight_rules
          )
          for name in layer
      }
      for layer in prepared["layers"]
  )

  s = config.sampling
  settings = SamplingSettings(
      max_prompt_len=s.max_prompt_len,
      max_new_tokens=s.max_new_tokens,
      kv_cache_dtype=s.kv_cache_dtype,
      decode_attention=s.decode_attention,
  ).for_platform(cfg, platform)
  state = jax.eval_shape(
      functools.partial(slots.empty_state, cfg, settings, num_slots, 1)
  )
  state_specs = jax.tree.map(
      lambda sh: sh.spec,
      slots.state_shardings(mesh, rules, cfg.num_layers, settings.value_layout),
  )
  kv_cache = tree_bytes(state.cache, state_specs.cache, mesh)

  seq_len = settings.cache_len
  divisor = sharding.batch_divisor(mesh, rules)
  val_slots = evaluation.num_slots(config, divisor)
  val_state = jax.eval_shape(
      functools.partial(slots.empty_state, cfg, settings, val_slots, 1)
  )
  kv_bytes = np.dtype(transformer.DTYPES[s.kv_cache_dtype]).itemsize
  temps = functools.partial(
      _sampler_temps,
      cfg,
      mesh,
      rules,
      width=s.max_prompt_len,
      cache_len=seq_len,
      kv_bytes=kv_bytes,
      platform=platform,
      decode_kernel=settings.decode_attention,
      cache_positions=settings.cache_positions,
  )
  rows_spec = PartitionSpec(nn.logical_to_mesh_axes(("act_batch",), rules)[0])
  batch_bytes = (
      3 * 4 * shard_elements((rows, seq_len), rows_spec, mesh) + rows * 4
  )
  head = {k: v for k, v in prepared.items() if k != "layers"}
  head_specs = {
      name: nn.logical_to_mesh_axes(decode.TOP_AXES[name], weight_rules)
      for name in head
  }
  unsharded = lambda spec: PartitionSpec(
      *(sharding.without_axes(a, ("fsdp",)) for a in spec)
  )
  # The LM head gathered over fsdp, in float32 (the FP32 head).
  head_name = "embedding" if cfg.tie_embeddings else "lm_head"
  gathered_head = 4 * shard_elements(
      params[head_name].shape, unsharded(param_specs[head_name]), mesh
  )
  # An untied embedding table is gathered too, for the lookup, in float32
  # (llama3_8b on v5p 4x4x8: 4.2 GB with its gradient that the compiler held
  # and this count missed).
  gathered_embedding = (
      0
      if cfg.tie_embeddings
      else 4
      * shard_elements(
          params["embedding"].shape, unsharded(param_specs["embedding"]), mesh
      )
  )
  one_layer = jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape[1:], cfg.dtype), params["layers"]
  )
  layer_specs_1 = jax.tree.map(
      lambda sp: unsharded(PartitionSpec(*sp[1:])), param_specs["layers"]
  )
  unsharded_weights = Unsharded(
      head=2 * gathered_head,
      layer=2 * tree_bytes(one_layer, layer_specs_1, mesh),
      embedding=2 * gathered_embedding,
  )
  # Resident weights are whole on each chip already: nothing to gather.
  decode_gathered = (
      0
      if config.sampling.weight_layout == "resident"
      else gathered_head
      + tree_bytes(
          prepared["layers"][0],
          jax.tree.map(
              unsharded,
              layer_specs[0],
              is_leaf=lambda x: isinstance(x, PartitionSpec),
          ),
          mesh,
      )
  )
  (prefill_temps, decode_temps), (val_prefill_temps, val_decode_temps) = (
      temps(num_slots),
      temps(val_slots),
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
  accum = jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, np.float32), params
  )
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
      grad_accum=tree_bytes(accum, param_specs, mesh)
      if microbatches > 1
      else 0,
      slot_records=tree_bytes(state, state_specs, mesh) - kv_cache,
      decode_weights=tree_bytes(prepared["layers"], layer_specs, mesh),
      activations_remat=acts(
          rows=rows // microbatches, remat=True, weights=unsharded_weights
      ),
      activations_no_remat=acts(
          rows=rows // microbatches, remat=False, weights=unsharded_weights
      ),
      activations_per_row=acts(rows=batch_ways, remat=cfg.remat),
      rows_per_device=-(-rows // microbatches // batch_ways),
      generation_flops=compute.generation_flops(
          cfg, [s.max_prompt_len] * rows, [s.max_new_tokens] * rows
      ),
      train_flops=compute.train_flops(cfg, [seq_len] * rows),
      batch=batch_bytes,
      unsharded=unsharded_weights,
      decode_gathered=decode_gathered,
      prepared_rest=tree_bytes(head, head_specs, mesh),
      prepare_temps=(
          sum(
              tree_bytes(head[name], head_specs[name], mesh)
              for name in ("head", "head_lo")
              if name in head
          )
          if cfg.tie_embeddings
          else 0
      ),
      prefill_temps=prefill_temps,
      decode_temps=decode_temps,
      val_slot_state=tree_bytes(val_state, state_specs, mesh),
      val_prefill_temps=val_prefill_temps,
      val_decode_temps=val_decode_temps,
  )


@dataclasses.dataclass(frozen=True)
class Memory:
  """Per-device bytes of one compiled program (XLA's buffer assignment)."""

  arguments: int
  outputs: int
  aliased: int  # Outputs written into donated arguments.
  temporaries: int

  @property
  def peak(self) -> int:
    return self.arguments + self.outputs - self.aliased + self.temporaries


def program_estimates(
    config: ml_collections.ConfigDict, num_devices: int, platform: str = "tpu"
) -> dict[str, Memory]:
  """Per-device `Memory` of each program a run compiles, named as in `aot`."""
  p = make_plan(config, num_devices, platform)
  state = p.params + p.opt_state
  weights = p.decode_weights + p.prepared_rest

  def sampler(slots: int, temps: int) -> Memory:
    return Memory(weights + slots, slots, slots, temps)

  return {
      "train_step": Memory(
          state + p.batch,
          state,
          state,
          p.grads + p.grad_accum + p.activations + p.params,
      ),
      "prepare": Memory(p.params, weights, 0, p.prepare_temps),
      "prefill": sampler(p.slot_state, p.prefill_temps),
      "decode": sampler(p.slot_state, p.decode_temps + p.decode_gathered),
      "val_prefill": sampler(p.val_slot_state, p.val_prefill_temps),
      "val_decode": sampler(
          p.val_slot_state, p.val_decode_temps + p.decode_gathered
      ),
  }


@dataclasses.dataclass(frozen=True)
class Fit:
  """How a plan sits on one accelerator."""

  accelerator: Accelerator
  fits: bool  # peak <= (1 - margin) x HBM.
  free_bytes: float  # (1 - margin) x HBM - peak; negative when it does not fit.
  # Train sequences per device the activations leave room for.
  rows_that_fit: int
  generate_s: float  # At peak FLOP/s on every device.
  train_s: float


def fit(plan: Plan, accelerator: Accelerator, margin: float) -> Fit:
  """How `plan` fits in (1 - margin) x HBM of `accelerator`; time at peak."""
  usable = (1.0 - margin) * accelerator.hbm_bytes
  rows = 0
  if plan.generate_peak <= usable:
    rows = max(
        int(
            (usable - plan.train_peak + plan.activations)
            // plan.activations_per_row
        ),
        0,
    )
  device_flops = math.prod(plan.mesh_shape.values()) * accelerator.peak_flops
  return Fit(
      accelerator,
      plan.peak <= usable,
      usable - plan.peak,
      rows,
      plan.generation_flops / device_flops,
      plan.train_flops / device_flops,
  )


def format_report(
    plan: Plan, accelerators: Sequence[Accelerator], margin: float
) -> str:
  """The planner's printout: per-device memory, FLOPs, and a fit table."""
  gb = lambda n: f"{n / GB:10.3f} GB"
  act = "remat" if plan.remat else "no remat"
  lines = [
      f"mesh {plan.mesh_shape}; {plan.num_slots} sampler slots; train batch "
      f"{plan.train_rows} x {plan.seq_len} tokens ({plan.rows_per_device} rows per device)",
      "",
      "Per device:",
      f"  parameters                 {gb(plan.params)}",
      f"  optimizer state (AdamW)    {gb(plan.opt_state)}",
      f"  gradients                  {gb(plan.grads)}",
      f"  gradient accumulator       {gb(plan.grad_accum)}",
      f"  sampler KV cache           {gb(plan.kv_cache)}",
      f"  sampler token records      {gb(plan.slot_records)}",
      # Activations and the weights the step un-shards, at its peak phase.
      f"  train temporaries, remat   {gb(plan.activations_remat)}",
      f"  train temporaries, none    {gb(plan.activations_no_remat)}",
      f"  decode weights (generate)  {gb(plan.decode_weights)}",
      f"  embedding, head (generate) {gb(plan.prepared_rest)}",
      f"  {'peak, train (' + act + ')':27s}{gb(plan.train_peak)}",
      f"  peak, generate             {gb(plan.generate_peak)}",
      "",
      "Per RL step (every completion at the full budget):",
      f"  generation FLOPs  {plan.generation_flops:.4g}",
      f"  training FLOPs    {plan.train_flops:.4g}",
      "",
      f"Fit with {margin:.0%} of HBM kept free (time at peak bf16 FLOP/s, a lower bound):",
      f"  {'accelerator':16s} {'HBM GB':>7s} {'TFLOP/s':>8s} {'fits':>5s} {'free GB':>9s} "
      f"{'rows/dev':>8s} {'gen s':>9s} {'train s':>9s} {'step s':>9s}",
  ]
  for acc in accelerators:
    f = fit(plan, acc, margin)
    lines.append(
        f"  {acc.name:16s} {acc.hbm_bytes / GB:7.0f} {acc.peak_flops / 1e12:8.0f} "
        f"{'yes' if f.fits else 'no':>5s} {f.free_bytes / GB:9.2f} {f.rows_that_fit:8d} "
        f"{f.generate_s:9.3g} {f.train_s:9.3g} {f.generate_s + f.train_s:9.3g}"
    )
  lines.append(
      f"  (rows/dev: train sequences per device that would fit; this batch puts "
      f"{plan.rows_per_device} on each)"
  )
  if plan.mesh_shape.get("tensor", 1) > 1:
    # Measured (docs/tpu.md, "The compiler's least peak"): llama3_8b on v5p
    # (1,64,2) and v6e (1,128,2) 4.8 GB of regroup temporaries uncounted.
    lines.append(
        "  Mesh with a tensor axis: the TPU compiler's weight regroup held "
        "up to 1.6x this plan's count of it (docs/tpu.md); check the slice "
        "with launch.compile."
    )
  return "\n".join(lines) + "\n"


def resolve_num_devices(mesh_cfg: Any, requested: Optional[int]) -> int:
  """`requested`, else a -1-free mesh's size, else `jax.device_count()`."""
  if requested is not None:
    return requested
  if -1 not in mesh_cfg.shape:
    return math.prod(mesh_cfg.shape)
  return jax.device_count()


def accelerators_named(names: Sequence[str]) -> list[Accelerator]:
  """`ACCELERATORS` entries by key, in order; ValueError names unknown ones."""
  unknown = [n for n in names if n not in ACCELERATORS]
  if unknown:
    raise ValueError(
        f"unknown accelerators {unknown}; choose from {sorted(ACCELERATORS)}"
    )
  return [ACCELERATORS[n] for n in names]
