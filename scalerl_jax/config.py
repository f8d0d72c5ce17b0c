"""Validation of an experiment ConfigDict before anything is built or compiled.

`validate(config)` walks the config against `SCHEMA` (every field, its type and
allowed values) and then checks the relations between fields (heads divide the
mesh's tensor axis, budgets fit the model's context, ...). Every error is a
`ConfigError` whose message starts with the dotted name of the offending field,
so a typo on the command line is caught here and not deep inside JAX.

Adding a config field means adding it to `configs/*.py` and to `SCHEMA`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Optional, Sequence

import ml_collections

from scalerl_jax.data import chat_template
from scalerl_jax.rl import schedules


class ConfigError(ValueError):
  """A config field is unknown, missing, of the wrong type or inconsistent."""


@dataclasses.dataclass(frozen=True)
class Field:
  """What one config field may hold."""
  type: Any  # Python type or tuple of types; float fields also accept ints.
  choices: Optional[Sequence[Any]] = None
  check: Optional[Callable[[Any], bool]] = None
  rule: str = ""  # Human-readable form of `check`, used in the message.


def _f(type_, choices=None, check=None, rule=""):
  return Field(type_, choices, check, rule)


_POS = (lambda v: v > 0, "must be > 0")
_NONNEG = (lambda v: v >= 0, "must be >= 0")
_UNIT = (lambda v: 0 < v <= 1, "must be in (0, 1]")
_PROB = (lambda v: 0 <= v <= 1, "must be in [0, 1]")
_DTYPES = ("float32", "bfloat16")
_VERIFIER_KINDS = ("math", "task", "code")  # rewards.registry.KINDS


def _axis_rules_ok(rules):
  for rule in rules:
    if not (isinstance(rule, (tuple, list)) and len(rule) == 2 and isinstance(rule[0], str)):
      return False
    target = rule[1]
    if target is not None and not isinstance(target, str) and not (
        isinstance(target, (tuple, list)) and all(isinstance(t, str) for t in target)):
      return False
  return True


SCHEMA: dict[str, Field] = {
    "variant": _f(str),
    "seed": _f(int, check=_NONNEG[0], rule=_NONNEG[1]),
    # model
    "model.family": _f(str, choices=("llama", "qwen2", "qwen3")),
    "model.vocab_size": _f(int, check=_POS[0], rule=_POS[1]),
    "model.embed_dim": _f(int, check=_POS[0], rule=_POS[1]),
    "model.num_layers": _f(int, check=_POS[0], rule=_POS[1]),
    "model.num_heads": _f(int, check=_POS[0], rule=_POS[1]),
    "model.num_kv_heads": _f(int, check=_POS[0], rule=_POS[1]),
    "model.head_dim": _f(int, check=lambda v: v > 0 and v % 2 == 0,
                         rule="must be a positive even number (rotary pairs)"),
    "model.mlp_dim": _f(int, check=_POS[0], rule=_POS[1]),
    "model.rope_theta": _f(float, check=_POS[0], rule=_POS[1]),
    "model.rope_scaling.type": _f(str, choices=("none", "llama3")),
    "model.rope_scaling.factor": _f(float, check=_POS[0], rule=_POS[1]),
    "model.rope_scaling.low_freq_factor": _f(float, check=_POS[0], rule=_POS[1]),
    "model.rope_scaling.high_freq_factor": _f(float, check=_POS[0], rule=_POS[1]),
    "model.rope_scaling.original_max_position": _f(int, check=_POS[0], rule=_POS[1]),
    "model.norm_eps": _f(float, check=_POS[0], rule=_POS[1]),
    "model.tie_embeddings": _f(bool),
    "model.qkv_bias": _f(bool),
    "model.qk_norm": _f(bool),
    "model.max_seq_len": _f(int, check=_POS[0], rule=_POS[1]),
    "model.param_dtype": _f(str, choices=_DTYPES),
    "model.compute_dtype": _f(str, choices=_DTYPES),
    "model.fp32_lm_head": _f(bool),
    "model.remat": _f(bool),
    "model.hf_path": _f(str),
    # mesh
    "mesh.axes": _f((tuple, list), check=lambda v: len(v) > 0 and all(isinstance(a, str) for a in v)
                    and len(set(v)) == len(v), rule="must be distinct axis names"),
    "mesh.shape": _f((tuple, list), check=lambda v: all(isinstance(s, int) and (s > 0 or s == -1) for s in v)
                     and list(v).count(-1) <= 1,
                     rule="must hold positive sizes and at most one -1"),
    "mesh.logical_axis_rules": _f((tuple, list), check=_axis_rules_ok,
                                  rule="must be (logical_name, mesh_axis | tuple of axes | None) pairs"),
    "mesh.distributed": _f(bool),
    "mesh.coordinator_address": _f(str),
    "mesh.num_processes": _f(int, check=_NONNEG[0], rule=_NONNEG[1]),
    "mesh.process_id": _f(int, check=lambda v: v >= -1, rule="must be >= -1"),
    # optim
    "optim.learning_rate": _f(float, check=_POS[0], rule=_POS[1]),
    "optim.warmup_steps": _f(int, check=_NONNEG[0], rule=_NONNEG[1]),
    "optim.schedule": _f(str, choices=("constant", "cosine")),
    "optim.decay_steps": _f(int, check=_NONNEG[0], rule=_NONNEG[1]),
    "optim.final_lr_fraction": _f(float, check=_PROB[0], rule=_PROB[1]),
    "optim.b1": _f(float, check=lambda v: 0 <= v < 1, rule="must be in [0, 1)"),
    "optim.b2": _f(float, check=lambda v: 0 <= v < 1, rule="must be in [0, 1)"),
    "optim.eps": _f(float, check=_POS[0], rule=_POS[1]),
    "optim.weight_decay": _f(float, check=_NONNEG[0], rule=_NONNEG[1]),
    "optim.grad_clip_norm": _f(float, check=_NONNEG[0], rule=_NONNEG[1]),
    # rl
    "rl.loss": _f(str, choices=("grpo", "dapo", "gspo", "gspo_token", "cispo")),
    "rl.aggregation": _f(str, choices=("sample", "prompt", "token")),
    "rl.adv_norm": _f(str, choices=("prompt", "batch", "none")),
    "rl.eps_clip": _f(float, check=_UNIT[0], rule=_UNIT[1]),
    "rl.eps_low": _f(float, check=_UNIT[0], rule=_UNIT[1]),
    "rl.eps_high": _f(float, check=_POS[0], rule=_POS[1]),
    "rl.gspo_eps_low": _f(float, check=_UNIT[0], rule=_UNIT[1]),
    "rl.gspo_eps_high": _f(float, check=_POS[0], rule=_POS[1]),
    "rl.cispo_eps_max": _f(float, check=_POS[0], rule=_POS[1]),
    "rl.tis_cap": _f(float, check=_NONNEG[0], rule=_NONNEG[1]),
    "rl.zero_variance_filter": _f(bool),
    "rl.reward_correct": _f(float),
    "rl.reward_incorrect": _f(float),
    # buffer
    "buffer.schedule": _f(str, choices=schedules.SCHEDULES.keys()),  # The registry, live.
    "buffer.max_off_policy": _f(int, check=_POS[0], rule=_POS[1]),
    "buffer.decode_steps_per_train_step": _f(int, check=_NONNEG[0], rule=_NONNEG[1]),
    # sampling
    "sampling.temperature": _f(float, check=_NONNEG[0], rule="must be >= 0 (0 = greedy)"),
    "sampling.top_k": _f(int, check=_NONNEG[0], rule=_NONNEG[1]),
    "sampling.top_p": _f(float, check=_UNIT[0], rule=_UNIT[1]),
    "sampling.max_prompt_len": _f(int, check=_POS[0], rule=_POS[1]),
    "sampling.max_new_tokens": _f(int, check=_POS[0], rule=_POS[1]),
    "sampling.num_slots": _f(int, check=_NONNEG[0], rule=_NONNEG[1]),
    "sampling.decode_steps_per_call": _f(int, check=_POS[0], rule=_POS[1]),
    "sampling.interruption.enabled": _f(bool),
    "sampling.interruption.thinking_budget_min": _f(int, check=_POS[0], rule=_POS[1]),
    "sampling.interruption.thinking_budget_max": _f(int, check=_POS[0], rule=_POS[1]),
    "sampling.interruption.answer_budget": _f(int, check=_POS[0], rule=_POS[1]),
    "sampling.interruption.phrase": _f(str, check=lambda v: len(v) > 0, rule="must not be empty"),
    # data
    "data.source": _f(str, choices=("builtin", "reasoning_gym", "tfds", "jsonl")),
    "data.prompts_per_step": _f(int, check=_POS[0], rule=_POS[1]),
    "data.generations_per_prompt": _f(int, check=lambda v: v >= 2,
                                      rule="must be >= 2 (group-relative advantages)"),
    "data.on_long_prompt": _f(str, choices=("error", "skip")),
    "data.builtin_difficulty": _f((tuple, list), check=lambda v: len(v) > 0 and all(
        isinstance(d, int) and d >= 1 for d in v), rule="must be a non-empty tuple of levels >= 1"),
    "data.builtin_num_train": _f(int, check=_POS[0], rule=_POS[1]),
    "data.builtin_num_val": _f(int, check=_POS[0], rule=_POS[1]),
    "data.reasoning_gym_name": _f(str),
    "data.reasoning_gym_size": _f(int, check=_POS[0], rule=_POS[1]),
    "data.reasoning_gym_val_size": _f(int, check=_POS[0], rule=_POS[1]),
    "data.tfds_name": _f(str),
    "data.tfds_split": _f(str),
    "data.tfds_val_split": _f(str),
    "data.tfds_data_dir": _f(str),
    "data.tfds_prompt_field": _f(str),
    "data.tfds_answer_field": _f(str),
    "data.jsonl_train": _f(str),
    "data.jsonl_val": _f(str),
    "data.jsonl_prompt_field": _f(str, check=bool, rule="must name a row field"),
    "data.jsonl_answer_field": _f(str, check=bool, rule="must name a row field"),
    "data.answer_delimiter": _f(str),
    "data.chat_template": _f(str, choices=chat_template.MODES),
    "data.system_prompt": _f(str),
    "data.answer_instruction": _f(str),
    "data.enable_thinking": _f(bool),
    "data.tokenizer_path": _f(str),
    # rewards
    "rewards.verifier": _f(str, choices=("auto",) + _VERIFIER_KINDS),
    "rewards.strip_thinking": _f((tuple, list), check=lambda v: all(k in _VERIFIER_KINDS for k in v)
                                 and len(set(v)) == len(v),
                                 rule=f"must be distinct verifier kinds of {_VERIFIER_KINDS}"),
    "rewards.timeout_s": _f(float, check=_POS[0], rule=_POS[1]),
    "rewards.num_workers": _f(int, check=_POS[0], rule=_POS[1]),
    "rewards.code_cpu_s": _f(float, check=_POS[0], rule=_POS[1]),
    "rewards.code_memory_mb": _f(int, check=_POS[0], rule=_POS[1]),
    "rewards.worker_memory_mb": _f(int, check=_NONNEG[0], rule=_NONNEG[1]),
    # curriculum
    "curriculum.no_positive_resampling": _f(bool),
    "curriculum.retire_threshold": _f(float, check=_UNIT[0], rule=_UNIT[1]),
    # trainer
    "trainer.num_steps": _f(int, check=_NONNEG[0], rule=_NONNEG[1]),
    "trainer.eval_every": _f(int, check=_POS[0], rule=_POS[1]),
    "trainer.eval_num_prompts": _f(int, check=_POS[0], rule=_POS[1]),
    "trainer.eval_samples": _f(int, check=_POS[0], rule=_POS[1]),
    "trainer.checkpoint_every": _f(int, check=_POS[0], rule=_POS[1]),
    "trainer.keep_checkpoints": _f(int, check=_POS[0], rule=_POS[1]),
    "trainer.log_every": _f(int, check=_POS[0], rule=_POS[1]),
    "trainer.max_nonfinite_steps": _f(int, check=_POS[0], rule=_POS[1]),
    "trainer.microbatches": _f(int, check=_POS[0], rule=_POS[1]),
    "trainer.logprob_chunk": _f(int, check=_NONNEG[0], rule="must be >= 0 (0 = off)"),
    "trainer.warm_start_steps": _f(int, check=_NONNEG[0], rule=_NONNEG[1]),
    "trainer.warm_start_lr": _f(float, check=_POS[0], rule=_POS[1]),
    "trainer.warm_start_batch": _f(int, check=_POS[0], rule=_POS[1]),
    "trainer.warm_start_slip_prob": _f(float, check=lambda v: 0 <= v < 1,
                                       rule="must be in [0, 1)"),
    "trainer.warm_start_answer_slip_prob": _f(float, check=lambda v: 0 <= v < 1,
                                              rule="must be in [0, 1)"),
    "trainer.warm_start_dir": _f(str),
    # monitor (scalerl_jax/monitors.py); 0 turns a check off
    "monitor.entropy_min_fraction": _f(float, check=lambda v: 0 <= v < 1,
                                       rule="must be in [0, 1) (0 = off)"),
    "monitor.truncation_rate_max": _f(float, check=lambda v: 0 <= v < 1,
                                      rule="must be in [0, 1) (0 = off)"),
    "monitor.logp_diff_max": _f(float, check=_NONNEG[0], rule="must be >= 0 (0 = off)"),
    "monitor.ratio_max": _f(float, check=lambda v: v == 0 or v > 1,
                            rule="must be 0 (off) or > 1 (on-policy ratios are 1)"),
    "monitor.reward_stuck_steps": _f(int, check=_NONNEG[0], rule="must be >= 0 (0 = off)"),
    "monitor.val_drop_max": _f(float, check=lambda v: 0 <= v < 1,
                               rule="must be in [0, 1) (0 = off)"),
    "monitor.stop_on_alert": _f(bool),
}


def _flatten(cfg, prefix=""):
  """Yields (dotted_name, value) for every leaf of a (nested) ConfigDict."""
  for key, value in cfg.items():
    name = f"{prefix}{key}"
    if isinstance(value, (ml_collections.ConfigDict, dict)):
      yield from _flatten(value, name + ".")
    else:
      yield name, value


def _type_ok(value, type_):
  types = type_ if isinstance(type_, tuple) else (type_,)
  if isinstance(value, bool):
    return bool in types  # bool is an int subclass; never accept it as a number.
  if float in types and isinstance(value, int):
    return True
  return isinstance(value, types)


def _type_name(type_):
  types = type_ if isinstance(type_, tuple) else (type_,)
  return " or ".join(t.__name__ for t in types)


def _check_fields(config):
  leaves = dict(_flatten(config))
  for name in leaves:
    if name not in SCHEMA:
      close = [k for k in SCHEMA if k.rsplit(".", 1)[-1] == name.rsplit(".", 1)[-1]]
      hint = f" (did you mean {close[0]!r}?)" if close else ""
      raise ConfigError(f"{name}: unknown config field{hint}")
  for name, field in SCHEMA.items():
    if name not in leaves:
      raise ConfigError(f"{name}: missing config field")
    value = leaves[name]
    if not _type_ok(value, field.type):
      raise ConfigError(
          f"{name}: expected {_type_name(field.type)}, got {type(value).__name__} {value!r}")
    if field.choices is not None and value not in field.choices:
      raise ConfigError(f"{name}: {value!r} is not one of {tuple(field.choices)}")
    if field.check is not None and not field.check(value):
      raise ConfigError(f"{name}: {value!r} {field.rule}")
  return leaves


def _mesh_axis_size(config, axis, num_devices):
  """Size of a mesh axis, resolving -1 against `num_devices` when known."""
  sizes = list(config.mesh.shape)
  if -1 in sizes:
    if num_devices is None:
      return None
    fixed = math.prod(s for s in sizes if s != -1)
    sizes[sizes.index(-1)] = num_devices // fixed if fixed and num_devices % fixed == 0 else None
  return dict(zip(config.mesh.axes, sizes)).get(axis, 1)


def _rule_axes(config, logical):
  """Mesh axes that a logical axis maps to (first matching rule wins)."""
  for name, target in config.mesh.logical_axis_rules:
    if name == logical:
      if target is None:
        return ()
      return (target,) if isinstance(target, str) else tuple(target)
  return ()


def _logical_ways(config, logical, num_devices):
  """How many ways a logical axis is split over the mesh; None if not yet known."""
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
        f"data.generations_per_prompt = {rows} completions")
  ways = _logical_ways(config, "act_batch", num_devices)
  if m > 1 and ways and (rows // m) % ways:
    raise ConfigError(
        f"trainer.microbatches: {m} microbatches of {rows // m} completions do not divide "
        f"over the {ways}-way batch sharding (mesh axes {_rule_axes(config, 'act_batch')})")


def _check_relations(config, num_devices):
  m = config.model
  if m.num_heads % m.num_kv_heads:
    raise ConfigError(
        f"model.num_kv_heads: {m.num_kv_heads} does not divide model.num_heads={m.num_heads}")
  if len(config.mesh.axes) != len(config.mesh.shape):
    raise ConfigError(
        f"mesh.shape: {tuple(config.mesh.shape)} has {len(config.mesh.shape)} sizes for "
        f"{len(config.mesh.axes)} axes {tuple(config.mesh.axes)}")
  for name, target in config.mesh.logical_axis_rules:
    for axis in (target,) if isinstance(target, str) else (target or ()):
      if axis not in config.mesh.axes:
        raise ConfigError(
            f"mesh.logical_axis_rules: rule for {name!r} names mesh axis {axis!r}, "
            f"not one of mesh.axes {tuple(config.mesh.axes)}")
  if num_devices is not None:
    sizes = [s for s in config.mesh.shape if s != -1]
    fixed = math.prod(sizes)
    if -1 in config.mesh.shape:
      if num_devices % fixed:
        raise ConfigError(
            f"mesh.shape: fixed sizes {tuple(config.mesh.shape)} (product {fixed}) do not "
            f"divide the {num_devices} available devices")
    elif fixed != num_devices:
      raise ConfigError(
          f"mesh.shape: {tuple(config.mesh.shape)} needs {fixed} devices, {num_devices} available")
  # Dimensions sharded over mesh axes must divide evenly.
  for field, logical in (("num_heads", "heads"), ("num_kv_heads", "kv_heads"),
                         ("mlp_dim", "mlp"), ("vocab_size", "vocab"), ("embed_dim", "embed")):
    size = _logical_ways(config, logical, num_devices)
    value = getattr(m, field)
    if size and value % size:
      raise ConfigError(
          f"model.{field}: {value} is not divisible by {size}, the size of mesh axes "
          f"{_rule_axes(config, logical)} that logical axis {logical!r} is sharded over")
  s = config.sampling
  if s.max_prompt_len + s.max_new_tokens > m.max_seq_len:
    raise ConfigError(
        f"sampling.max_new_tokens: max_prompt_len {s.max_prompt_len} + max_new_tokens "
        f"{s.max_new_tokens} exceeds model.max_seq_len {m.max_seq_len}")
  it = s.interruption
  if it.enabled:
    if it.thinking_budget_min > it.thinking_budget_max:
      raise ConfigError(
          f"sampling.interruption.thinking_budget_min: {it.thinking_budget_min} > "
          f"thinking_budget_max {it.thinking_budget_max}")
    if it.thinking_budget_max > s.max_new_tokens:
      raise ConfigError(
          f"sampling.interruption.thinking_budget_max: {it.thinking_budget_max} exceeds "
          f"sampling.max_new_tokens {s.max_new_tokens}")
  _check_microbatches(config, num_devices)
  if config.optim.schedule == "cosine" and config.optim.decay_steps <= 0:
    raise ConfigError("optim.decay_steps: cosine schedule needs decay_steps > 0")
  if config.rl.reward_correct <= config.rl.reward_incorrect:
    raise ConfigError(
        f"rl.reward_correct: {config.rl.reward_correct} must exceed "
        f"rl.reward_incorrect {config.rl.reward_incorrect}")
  d = config.data
  required = {"reasoning_gym": ("reasoning_gym_name",), "tfds": ("tfds_name",),
              "jsonl": ("jsonl_train",)}
  for field in required.get(d.source, ()):
    if not getattr(d, field):
      raise ConfigError(f"data.{field}: must be set when data.source={d.source!r}")
  if d.jsonl_prompt_field == d.jsonl_answer_field:
    raise ConfigError(f"data.jsonl_answer_field: {d.jsonl_answer_field!r} is also "
                      "data.jsonl_prompt_field")


def validate(config: ml_collections.ConfigDict, num_devices: Optional[int] = None) -> None:
  """Raises ConfigError naming the first bad field of `config`.

  Args:
    config: the experiment config (as returned by `configs/*.py:get_config`).
    num_devices: when given, the mesh shape is checked against it and sharded
      dimensions are checked for divisibility with `-1` resolved.
  """
  _check_fields(config)
  _check_relations(config, num_devices)
