"""The values each config field allows: ranges, and registry choices.

`RULES` maps a dotted field name to its rule. A new field needs an entry only
if some values of its type are invalid.
"""

from __future__ import annotations

from typing import Any, Callable, Collection, Optional, Union

import ml_collections

from scalerl_jax import optim
from scalerl_jax import sharding
from scalerl_jax.config.errors import ConfigError
from scalerl_jax.data import chat_template
from scalerl_jax.data import pipeline
from scalerl_jax.data import sources
from scalerl_jax.models import attention
from scalerl_jax.models import decode_attention
from scalerl_jax.models import hf_config
from scalerl_jax.models import lm_head
from scalerl_jax.models import model_config
from scalerl_jax.rewards import registry as verifiers
from scalerl_jax.rewards.sandbox import isolation
from scalerl_jax.rl import advantages
from scalerl_jax.rl import losses
from scalerl_jax.rl import schedules
from scalerl_jax.rl import weight_sync

# A field's value -> what is wrong with it, or None.
Rule = Callable[[Any], Optional[str]]

# Python types a rule's kind accepts: floats take ints, tuples take lists.
_KINDS = {int: (int,), float: (int, float), str: (str,), tuple: (tuple, list)}
_KIND_NAMES = {int: "int", float: "float", str: "str", tuple: "tuple or list"}


def _rule(kind: type, ok: Callable[[Any], bool], says: str) -> Rule:
  """Values of `kind` (never bool) for which `ok` holds; else `says` why."""

  def check(value: Any) -> Optional[str]:
    if isinstance(value, bool) or not isinstance(value, _KINDS[kind]):
      return (
          f"expected {_KIND_NAMES[kind]}, got {type(value).__name__} {value!r}"
      )
    return None if ok(value) else f"{value!r} {says}"

  return check


def _one_of(
    names: Union[Collection[str], Callable[[], Collection[str]]],
) -> Rule:
  """One of `names`, read when the config is checked (a registry's, then)."""

  def check(value: Any) -> Optional[str]:
    allowed = tuple(names() if callable(names) else names)
    return None if value in allowed else f"{value!r} is not one of {allowed}"

  return check


_POS_INT = _rule(int, lambda v: v > 0, "must be > 0")
_NONNEG_INT = _rule(int, lambda v: v >= 0, "must be >= 0")
_OFF_INT = _rule(int, lambda v: v >= 0, "must be >= 0 (0 = off)")
_POS = _rule(float, lambda v: v > 0, "must be > 0")
_NONNEG = _rule(float, lambda v: v >= 0, "must be >= 0")
_UNIT = _rule(float, lambda v: 0 < v <= 1, "must be in (0, 1]")
_PROB = _rule(float, lambda v: 0 <= v <= 1, "must be in [0, 1]")
_BELOW_ONE = _rule(float, lambda v: 0 <= v < 1, "must be in [0, 1)")
_OFF_BELOW_ONE = _rule(
    float, lambda v: 0 <= v < 1, "must be in [0, 1) (0 = off)"
)
_NAMED = _rule(str, bool, "must name a row field")


def _axis_rules_ok(rules):
  for rule in rules:
    if not (
        isinstance(rule, (tuple, list))
        and len(rule) == 2
        and isinstance(rule[0], str)
    ):
      return False
    target = rule[1]
    if (
        target is not None
        and not isinstance(target, str)
        and not (
            isinstance(target, (tuple, list))
            and all(isinstance(t, str) for t in target)
        )
    ):
      return False
  return True


# Fields whose type admits invalid values, and the values they allow. Fields
# of any value of their type (flags, paths, names) are left to ml_collections.
RULES: dict[str, Rule] = {
    "seed": _NONNEG_INT,
    # model
    "model.family": _one_of(hf_config.ARCHITECTURES.values()),
    "model.vocab_size": _POS_INT,
    "model.embed_dim": _POS_INT,
    "model.num_layers": _POS_INT,
    "model.num_heads": _POS_INT,
    "model.num_kv_heads": _POS_INT,
    "model.head_dim": _rule(
        int,
        lambda v: v > 0 and v % 2 == 0,
        "must be a positive even number (rotary pairs)",
    ),
    "model.mlp_dim": _POS_INT,
    "model.rope_theta": _POS,
    "model.rope_scaling.type": _one_of(model_config.ROPE_SCALINGS),
    "model.rope_scaling.factor": _POS,
    "model.rope_scaling.low_freq_factor": _POS,
    "model.rope_scaling.high_freq_factor": _POS,
    "model.rope_scaling.original_max_position": _POS_INT,
    "model.norm_eps": _POS,
    "model.max_seq_len": _POS_INT,
    "model.param_dtype": _one_of(model_config.DTYPES),
    "model.compute_dtype": _one_of(model_config.DTYPES),
    "model.attention": _one_of(attention.IMPLS.names),
    "model.lm_head_algorithm": _one_of(lm_head.ALGORITHMS),
    "model.remat_policy": _one_of(model_config.REMAT_POLICIES),
    "model.scan_unroll": _NONNEG_INT,
    # mesh
    "mesh.axes": _rule(
        tuple,
        lambda v: len(v) > 0
        and all(isinstance(a, str) for a in v)
        and len(set(v)) == len(v),
        "must be distinct axis names",
    ),
    "mesh.shape": _rule(
        tuple,
        lambda v: all(isinstance(s, int) and (s > 0 or s == -1) for s in v)
        and list(v).count(-1) <= 1,
        "must hold positive sizes and at most one -1",
    ),
    "mesh.logical_axis_rules": _rule(
        tuple,
        _axis_rules_ok,
        "must be (logical_name, mesh_axis | tuple of axes | None) pairs",
    ),
    "mesh.layout": _one_of(sharding.LAYOUTS),
    "mesh.generator_devices": _NONNEG_INT,
    "mesh.transfer_dtype": _one_of(weight_sync.TRANSFER_DTYPES),
    "mesh.num_processes": _NONNEG_INT,
    "mesh.process_id": _rule(int, lambda v: v >= -1, "must be >= -1"),
    "mesh.peer_timeout_s": _rule(
        float, lambda v: v >= 1, "must be >= 1 (seconds)"
    ),
    # optim
    "optim.learning_rate": _POS,
    "optim.warmup_steps": _NONNEG_INT,
    "optim.schedule": _one_of(optim.SCHEDULES),
    "optim.decay_steps": _NONNEG_INT,
    "optim.final_lr_fraction": _PROB,
    "optim.b1": _BELOW_ONE,
    "optim.b2": _BELOW_ONE,
    "optim.eps": _POS,
    "optim.weight_decay": _NONNEG,
    "optim.grad_clip_norm": _NONNEG,
    # rl
    "rl.loss": _one_of(losses.LOSSES.names),
    "rl.aggregation": _one_of(losses.AGGREGATIONS.names),
    "rl.adv_norm": _one_of(advantages.NORMS.names),
    "rl.eps_clip": _UNIT,
    "rl.eps_low": _UNIT,
    "rl.eps_high": _POS,
    "rl.gspo_eps_low": _UNIT,
    "rl.gspo_eps_high": _POS,
    "rl.cispo_eps_max": _POS,
    "rl.tis_cap": _NONNEG,
    # buffer
    "buffer.schedule": _one_of(schedules.SCHEDULES.names),
    "buffer.max_off_policy": _POS_INT,
    "buffer.decode_steps_per_train_step": _NONNEG_INT,
    "buffer.sync_at_decode_step": _NONNEG_INT,
    "buffer.sync_mode": _one_of(weight_sync.SYNC_MODES),
    "buffer.role_stall_timeout_s": _rule(
        float, lambda v: v == 0 or v >= 1, "must be 0 (off) or >= 1 (seconds)"
    ),
    # sampling
    "sampling.temperature": _rule(
        float, lambda v: v >= 0, "must be >= 0 (0 = greedy)"
    ),
    "sampling.top_k": _NONNEG_INT,
    "sampling.top_p": _UNIT,
    "sampling.max_prompt_len": _POS_INT,
    "sampling.max_new_tokens": _POS_INT,
    "sampling.num_slots": _NONNEG_INT,
    "sampling.decode_steps_per_call": _POS_INT,
    "sampling.decode_steps_per_check": _POS_INT,
    "sampling.kv_cache_dtype": _one_of(model_config.DTYPES),
    "sampling.weight_layout": _one_of(sharding.WEIGHT_LAYOUTS),
    "sampling.decode_attention": _one_of(decode_attention.KERNELS),
    "sampling.interruption.thinking_budget_min": _POS_INT,
    "sampling.interruption.thinking_budget_max": _POS_INT,
    "sampling.interruption.answer_budget": _POS_INT,
    "sampling.interruption.phrase": _rule(
        str, lambda v: len(v) > 0, "must not be empty"
    ),
    # data
    "data.source": _one_of(sources.SOURCES.names),
    "data.prompts_per_step": _POS_INT,
    "data.generations_per_prompt": _rule(
        int, lambda v: v >= 2, "must be >= 2 (group-relative advantages)"
    ),
    "data.on_long_prompt": _one_of(pipeline.ON_LONG_PROMPT),
    "data.builtin_difficulty": _rule(
        tuple,
        lambda v: len(v) > 0 and all(isinstance(d, int) and d >= 1 for d in v),
        "must be a non-empty tuple of levels >= 1",
    ),
    "data.builtin_num_train": _POS_INT,
    "data.builtin_num_val": _POS_INT,
    "data.builtin_val_seed": _rule(
        int, lambda v: v >= -1, "must be >= 0, or -1 (= sources.VAL_SEED)"
    ),
    "data.reasoning_gym_size": _POS_INT,
    "data.reasoning_gym_val_size": _POS_INT,
    "data.jsonl_prompt_field": _NAMED,
    "data.jsonl_answer_field": _NAMED,
    "data.chat_template": _one_of(chat_template.MODES),
    # rewards
    "rewards.verifier": _one_of(verifiers.MODES),
    "rewards.strip_thinking": _rule(
        tuple,
        lambda v: all(k in verifiers.KINDS for k in v)
        and len(set(v)) == len(v),
        f"must be distinct verifier kinds of {verifiers.KINDS}",
    ),
    "rewards.timeout_s": _POS,
    "rewards.num_workers": _POS_INT,
    "rewards.code_cpu_s": _POS,
    "rewards.code_memory_mb": _POS_INT,
    "rewards.code_isolation": _one_of(isolation.MODES),
    "rewards.worker_memory_mb": _NONNEG_INT,
    # curriculum
    "curriculum.retire_threshold": _UNIT,
    # trainer
    "trainer.num_steps": _NONNEG_INT,
    "trainer.eval_every": _POS_INT,
    "trainer.eval_early_until": _NONNEG_INT,
    "trainer.eval_every_early": _POS_INT,
    "trainer.eval_num_prompts": _POS_INT,
    "trainer.eval_samples": _POS_INT,
    "trainer.eval_batch_rows": _NONNEG_INT,
    "trainer.checkpoint_every": _POS_INT,
    "trainer.keep_checkpoints": _POS_INT,
    "trainer.log_every": _POS_INT,
    "trainer.max_nonfinite_steps": _POS_INT,
    "trainer.microbatches": _POS_INT,
    "trainer.logprob_chunk": _OFF_INT,
    "trainer.warm_start_steps": _NONNEG_INT,
    "trainer.warm_start_lr": _POS,
    "trainer.warm_start_batch": _POS_INT,
    "trainer.warm_start_weight_decay": _NONNEG,
    "trainer.warm_start_slip_prob": _BELOW_ONE,
    "trainer.warm_start_answer_slip_prob": _BELOW_ONE,
    "trainer.warm_start_max_new_tokens": _NONNEG_INT,
    "trainer.warm_start_skip_prob": _BELOW_ONE,
    "trainer.warm_start_chain_first_steps": _NONNEG_INT,
    "trainer.warm_start_chain_loss_target": _NONNEG,
    "trainer.warm_start_chain_max_steps": _NONNEG_INT,
    "trainer.base_gate_min_chain_exact": _rule(
        float, lambda v: 0 <= v <= 1, "must be in [0, 1] (0 = no gate)"
    ),
    "trainer.base_gate_levels": _rule(
        tuple, lambda v: len(v) > 0, "must name one or more levels"
    ),
    "trainer.base_gate_p_chain_range": _rule(
        tuple,
        lambda v: len(v) == 2 and 0 <= v[0] <= v[1] <= 1,
        "must be (low, high) with 0 <= low <= high <= 1",
    ),
    "trainer.warm_start_seed": _rule(
        int, lambda v: v >= -1, "must be >= 0, or -1 (= seed)"
    ),
    # monitor (scalerl_jax/metrics/monitors.py); 0 turns a check off
    "monitor.entropy_min_fraction": _OFF_BELOW_ONE,
    "monitor.truncation_rate_max": _OFF_BELOW_ONE,
    "monitor.logp_diff_max": _rule(
        float, lambda v: v >= 0, "must be >= 0 (0 = off)"
    ),
    "monitor.ratio_max": _rule(
        float,
        lambda v: v == 0 or v > 1,
        "must be 0 (off) or > 1 (on-policy ratios are 1)",
    ),
    "monitor.reward_stuck_steps": _OFF_INT,
    "monitor.val_drop_max": _OFF_BELOW_ONE,
}


def _value(config: Any, name: str) -> Any:
  """The value of dotted field `name` of a (nested) ConfigDict."""
  node = config
  for part in name.split("."):
    if (
        not isinstance(node, (ml_collections.ConfigDict, dict))
        or part not in node
    ):
      raise ConfigError(f"{name}: missing config field")
    node = node[part]
  return node


def check_fields(config: ml_collections.ConfigDict) -> None:
  """Raises ConfigError naming the first field whose value its rule refuses."""
  for name, rule in RULES.items():
    problem = rule(_value(config, name))
    if problem is not None:
      raise ConfigError(f"{name}: {problem}")
