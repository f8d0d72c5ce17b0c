"""The relations between config fields: the mesh, sharded dimensions,
budgets, microbatches and the fields each data source needs."""

from __future__ import annotations

import math

from scalerl_jax import sharding
from scalerl_jax import warm_steps
from scalerl_jax.config.errors import ConfigError
from scalerl_jax.data import parity_task
from scalerl_jax.rl import schedules


def _mesh_axis_size(config, axis, num_devices):
  """Size of a mesh axis, resolving -1 against `num_devices` when known."""
  sizes = list(config.mesh.shape)
  if -1 in sizes:
    if num_devices is None:
      return None
    fixed = math.prod(s for s in sizes if s != -1)
    sizes[sizes.index(-1)] = (
        num_devices // fixed if fixed and num_devices % fixed == 0 else None
    )
  return dict(zip(config.mesh.axes, sizes)).get(axis, 1)


def _rule_axes(config, logical):
  """Mesh axes that `config.mesh`'s rules map a logical axis to."""
  return sharding.rule_axes(config.mesh.logical_axis_rules, logical)


def _logical_ways(config, logical, num_devices):
  """Ways a logical axis is split over the mesh; None if not yet known."""
  size = 1
  for axis in _rule_axes(config, logical):
    axis_size = _mesh_axis_size(config, axis, num_devices)
    if axis_size is None:
      return None
    size *= axis_size
  return size


def _check_microbatches(config, num_devices):
  rows = config.data.prompts_per_step * config.data.generations_per_prompt
  m = config.trainer.microbatches
  if rows % m:
    raise ConfigError(
        f"trainer.microbatches: {m} does not divide the batch of data.prompts_per_step x "
        f"data.generations_per_prompt = {rows} completions"
    )
  ways = _logical_ways(config, "act_batch", num_devices)
  if m > 1 and ways and (rows // m) % ways:
    raise ConfigError(
        f"trainer.microbatches: {m} microbatches of {rows // m} completions do not divide "
        f"over the {ways}-way batch sharding (mesh axes {_rule_axes(config, 'act_batch')})"
    )


def _check_mesh(config, num_devices):
  """mesh.shape over `num_devices` (one role's; None: not yet known), and
  the dimensions sharded over its axes."""
  shape = tuple(config.mesh.shape)
  fixed = math.prod(s for s in shape if s != -1)
  if num_devices is not None and -1 in shape and num_devices % fixed:
    raise ConfigError(
        f"mesh.shape: fixed sizes {shape} (product {fixed}) do not "
        f"divide the {num_devices} available devices"
    )
  if num_devices is not None and -1 not in shape and fixed != num_devices:
    raise ConfigError(
        f"mesh.shape: {shape} needs {fixed} devices, {num_devices} available"
    )
  for field, logical in (
      ("num_heads", "heads"),
      ("num_kv_heads", "kv_heads"),
      ("mlp_dim", "mlp"),
      ("vocab_size", "vocab"),
      ("embed_dim", "embed"),
  ):
    size = _logical_ways(config, logical, num_devices)
    value = getattr(config.model, field)
    if size and value % size:
      raise ConfigError(
          f"model.{field}: {value} is not divisible by {size}, the size of mesh axes "
          f"{_rule_axes(config, logical)} that logical axis {logical!r} is sharded over"
      )


def _check_layout(config, num_devices):
  """mesh.layout's relations; (trainer's, generator's) device counts, each
  None while `num_devices` is unknown."""
  disaggregated = sharding.layout_of(config.mesh) == "disaggregated"
  if disaggregated and config.mesh.distributed:
    raise ConfigError(
        "mesh.layout: 'disaggregated' runs in one process for now, not with "
        "mesh.distributed=True (docs/design/disaggregated.md)"
    )
  transfer = config.mesh.transfer_dtype
  if transfer != "float32" and not disaggregated:
    raise ConfigError(
        f"mesh.transfer_dtype: {transfer!r} needs mesh.layout="
        "'disaggregated' (colocated, no weights move)"
    )
  if transfer != "float32" and config.model.compute_dtype != transfer:
    raise ConfigError(
        f"mesh.transfer_dtype: {transfer!r} needs model.compute_dtype="
        f"{transfer!r}: the sampler computes in "
        f"{config.model.compute_dtype!r}, and weights sent narrower would "
        "change its values"
    )
  _check_sync(config, disaggregated)
  if num_devices is None:
    return None, None
  try:
    return sharding.role_device_counts(config.mesh, num_devices)
  except ValueError as e:
    raise ConfigError(str(e)) from None


def _check_sync(config, disaggregated):
  """The relations of buffer.sync_at_decode_step and buffer.sync_mode."""
  b = config.buffer
  asked = {}  # Field -> its value, where it swaps weights in flight.
  if b.sync_at_decode_step:
    asked["buffer.sync_at_decode_step"] = b.sync_at_decode_step
  if b.sync_mode == "free":
    asked["buffer.sync_mode"] = "free"
  in_flight = schedules.SCHEDULES.get(b.schedule).in_flight_updates
  for field, value in asked.items():
    if not disaggregated:
      raise ConfigError(
          f"{field}: {value!r} needs mesh.layout='disaggregated' (colocated, "
          "the generator and the trainer share devices and take turns)"
      )
    if not in_flight:
      raise ConfigError(
          f"{field}: {value!r} swaps weights under sequences in flight, "
          f"which buffer.schedule={b.schedule!r} decodes with one version"
      )
  if len(asked) == 2:
    raise ConfigError(
        "buffer.sync_mode: 'free' swaps whenever new weights arrive; "
        f"buffer.sync_at_decode_step={b.sync_at_decode_step} fixes the step "
        "(sync_mode 'fixed')"
    )


def _check_kv_heads(config):
  """Raises unless model.num_kv_heads divides model.num_heads."""
  m = config.model
  if m.num_heads % m.num_kv_heads:
    raise ConfigError(
        f"model.num_kv_heads: {m.num_kv_heads} does not divide model.num_heads={m.num_heads}"
    )


def _check_mesh_axes(config):
  """Raises unless mesh.shape and mesh.logical_axis_rules fit mesh.axes."""
  if len(config.mesh.axes) != len(config.mesh.shape):
    raise ConfigError(
        f"mesh.shape: {tuple(config.mesh.shape)} has {len(config.mesh.shape)} sizes for "
        f"{len(config.mesh.axes)} axes {tuple(config.mesh.axes)}"
    )
  for name, target in config.mesh.logical_axis_rules:
    for axis in (target,) if isinstance(target, str) else (target or ()):
      if axis not in config.mesh.axes:
        raise ConfigError(
            f"mesh.logical_axis_rules: rule for {name!r} names mesh axis {axis!r}, "
            f"not one of mesh.axes {tuple(config.mesh.axes)}"
        )


def _check_attention(config):
  """Raises where model.attention asks for a compute dtype it lacks."""
  m = config.model
  if m.attention == "cudnn" and m.compute_dtype != "bfloat16":
    raise ConfigError(
        f"model.attention: 'cudnn' needs model.compute_dtype='bfloat16' (cuDNN's flash "
        f"attention takes 16-bit inputs), not {m.compute_dtype!r}"
    )


def _check_sequence_lengths(config):
  """Raises where a prompt and its completion exceed model.max_seq_len."""
  m, s = config.model, config.sampling
  if s.max_prompt_len + s.max_new_tokens > m.max_seq_len:
    raise ConfigError(
        f"sampling.max_new_tokens: max_prompt_len {s.max_prompt_len} + max_new_tokens "
        f"{s.max_new_tokens} exceeds model.max_seq_len {m.max_seq_len}"
    )
  warm_new = config.trainer.warm_start_max_new_tokens
  if s.max_prompt_len + warm_new > m.max_seq_len:
    raise ConfigError(
        f"trainer.warm_start_max_new_tokens: max_prompt_len {s.max_prompt_len} + "
        f"{warm_new} exceeds model.max_seq_len {m.max_seq_len}"
    )


def _check_parity_only(config):
  """Raises where a parity-only trainer field is set for another source."""
  # Fields that only the parity task's chains give a meaning to.
  for field, what in (
      ("warm_start_skip_prob", "chains skip digits"),
      ("warm_start_chain_first_steps", "warm start writes chains"),
      ("base_gate_min_chain_exact", "base has a gate"),
  ):
    if config.trainer[field] and config.data.source != parity_task.SOURCE:
      raise ConfigError(
          f"trainer.{field}: only the parity task's {what} "
          f"(data.source={parity_task.SOURCE!r}), not "
          f"data.source={config.data.source!r}"
      )


def _check_chain_phase(config):
  """Raises where the warm start's chain phase fields contradict each other."""
  first = config.trainer.warm_start_chain_first_steps
  if first > config.trainer.warm_start_steps:
    raise ConfigError(
        f"trainer.warm_start_chain_first_steps: {first} exceeds "
        f"trainer.warm_start_steps {config.trainer.warm_start_steps}"
    )
  target = config.trainer.warm_start_chain_loss_target
  cap = config.trainer.warm_start_chain_max_steps
  if target and not first:
    raise ConfigError(
        f"trainer.warm_start_chain_loss_target: {target} runs on a chain phase, "
        "which trainer.warm_start_chain_first_steps=0 does not have"
    )
  chain_rate = config.trainer.warm_start_chain_rate
  if chain_rate not in warm_steps.CHAIN_RATES:
    raise ConfigError(
        f"trainer.warm_start_chain_rate: {chain_rate!r} is not one of "
        f"{warm_steps.CHAIN_RATES}"
    )
  if chain_rate != warm_steps.CHAIN_RATES[0] and not first:
    raise ConfigError(
        f"trainer.warm_start_chain_rate: {chain_rate!r} sets a chain phase's "
        "rate, which trainer.warm_start_chain_first_steps=0 does not have"
    )
  if target and cap < first:
    raise ConfigError(
        f"trainer.warm_start_chain_max_steps: {cap} is below "
        f"trainer.warm_start_chain_first_steps {first}; the chain phase runs "
        "its planned steps at least"
    )


def _check_interruption(config):
  """Raises where enabled thinking budgets are out of order or too long."""
  s = config.sampling
  it = s.interruption
  if it.enabled:
    if it.thinking_budget_min > it.thinking_budget_max:
      raise ConfigError(
          f"sampling.interruption.thinking_budget_min: {it.thinking_budget_min} > "
          f"thinking_budget_max {it.thinking_budget_max}"
      )
    if it.thinking_budget_max > s.max_new_tokens:
      raise ConfigError(
          f"sampling.interruption.thinking_budget_max: {it.thinking_budget_max} exceeds "
          f"sampling.max_new_tokens {s.max_new_tokens}"
      )


def _check_optim_and_rewards(config):
  """Raises on a cosine schedule without decay steps, or rewards misordered."""
  if config.optim.schedule == "cosine" and config.optim.decay_steps <= 0:
    raise ConfigError(
        "optim.decay_steps: cosine schedule needs decay_steps > 0"
    )
  if config.rl.reward_correct <= config.rl.reward_incorrect:
    raise ConfigError(
        f"rl.reward_correct: {config.rl.reward_correct} must exceed "
        f"rl.reward_incorrect {config.rl.reward_incorrect}"
    )


def _check_data(config):
  """Raises where data.source lacks a field it needs, or jsonl fields clash."""
  d = config.data
  required = {
      "reasoning_gym": ("reasoning_gym_name",),
      "tfds": ("tfds_name",),
      "jsonl": ("jsonl_train",),
  }
  for field in required.get(d.source, ()):
    if not getattr(d, field):
      raise ConfigError(
          f"data.{field}: must be set when data.source={d.source!r}"
      )
  if d.jsonl_prompt_field == d.jsonl_answer_field:
    raise ConfigError(
        f"data.jsonl_answer_field: {d.jsonl_answer_field!r} is also "
        "data.jsonl_prompt_field"
    )


def check_relations(config, num_devices):
  """Raises ConfigError naming the first field inconsistent with another."""
  _check_kv_heads(config)
  _check_mesh_axes(config)
  trainer_devices, generator_devices = _check_layout(config, num_devices)
  # Each role's mesh lays mesh.shape over its own devices.
  for devices in dict.fromkeys((trainer_devices, generator_devices)):
    _check_mesh(config, devices)
  _check_attention(config)
  _check_sequence_lengths(config)
  _check_parity_only(config)
  _check_chain_phase(config)
  _check_interruption(config)
  _check_microbatches(config, trainer_devices)
  _check_optim_and_rewards(config)
  _check_data(config)
