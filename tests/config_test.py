"""Config validation: every preset validates; every bad field is named."""

import jax
import ml_collections
import pytest

from configs import scalerl
from scalerl_jax import config as config_lib
from scalerl_jax import trainer as trainer_lib


@pytest.mark.parametrize("variant", scalerl.VARIANTS)
def test_every_variant_validates(variant):
  config = scalerl.get_config(f"variant={variant}")
  # The variant's model shape reaches the config, field by field.
  shape = scalerl._MODELS[variant]  # pylint: disable=protected-access
  assert {k: config.model[k] for k in shape} == shape
  config_lib.validate(config)


def test_default_variant_is_tiny_cpu_and_locked():
  config = scalerl.get_config()
  assert config.variant == "tiny_cpu"
  with pytest.raises(AttributeError, match="not_a_field"):
    config.model.not_a_field = 1  # Locked: new keys are refused at once.


# Values of another type than the field's: the locked config refuses them as
# they are set (as `--config.<field>=...` is parsed), naming the field, so
# `validate` has no type table of its own.
_WRONG_TYPES = [
    ("model", "fp32_lm_head", 1),
    ("monitor", "stop_on_alert", "yes"),
    ("model", "num_heads", "8"),
    ("rewards", "strip_thinking", "math"),
    ("data", "tfds_name", 3),
]


@pytest.mark.parametrize("section,field,value", _WRONG_TYPES)
def test_the_locked_config_refuses_another_type(section, field, value):
  config = scalerl.get_config()
  with pytest.raises(TypeError, match=f"field '{field}'"):
    setattr(config[section], field, value)


def test_unknown_variant_is_named():
  with pytest.raises(ValueError, match="huge_tpu"):
    scalerl.get_config("variant=huge_tpu")


def _with(path, value):
  config = scalerl.get_config()
  node = config
  *parents, leaf = path.split(".")
  for p in parents:
    node = node[p]
  # Bypass ml_collections' own type check so the validator sees the value.
  node._fields[leaf] = value  # pylint: disable=protected-access
  return config


# (field, bad value, start of the message): each fails on the field alone. A
# bool passes ml_collections' int and float fields, so those kinds are checked.
_BAD_FIELDS = [
    ("model.num_heads", "8", "model.num_heads: expected int"),
    ("optim.learning_rate", True, "optim.learning_rate: expected float"),
    ("trainer.microbatches", True, "trainer.microbatches: expected int"),
    ("rl.loss", "ppo", "rl.loss: 'ppo' is not one of"),
    ("rl.aggregation", "batch", "rl.aggregation: 'batch' is not one of"),
    ("rl.adv_norm", "group", "rl.adv_norm: 'group' is not one of"),
    ("buffer.schedule", "sync", "buffer.schedule: 'sync' is not one of"),
    (
        "model.param_dtype",
        "float16",
        "model.param_dtype: 'float16' is not one of",
    ),
    ("model.head_dim", 33, "model.head_dim: 33 must be a positive even number"),
    ("optim.b2", 1.0, "optim.b2: 1.0 must be in [0, 1)"),
    (
        "data.generations_per_prompt",
        1,
        "data.generations_per_prompt: 1 must be >= 2",
    ),
    (
        "mesh.shape",
        (-1, -1, 1),
        "mesh.shape: (-1, -1, 1) must hold positive sizes and at most one -1",
    ),
    ("mesh.logical_axis_rules", (("embed",),), "mesh.logical_axis_rules:"),
    (
        "curriculum.retire_threshold",
        1.5,
        "curriculum.retire_threshold: 1.5 must be in (0, 1]",
    ),
    (
        "rewards.strip_thinking",
        ("maths",),
        "rewards.strip_thinking: ('maths',) must be distinct",
    ),
    (
        "rewards.strip_thinking",
        ("math", "math"),
        "rewards.strip_thinking: ('math', 'math') must",
    ),
    (
        "rewards.strip_thinking",
        "math",
        "rewards.strip_thinking: expected tuple or list",
    ),
    ("seed", -1, "seed: -1 must be >= 0"),
    ("optim.eps", 0.0, "optim.eps: 0.0 must be > 0"),
    ("sampling.temperature", -0.5, "sampling.temperature: -0.5 must be >= 0"),
    ("sampling.top_p", 0.0, "sampling.top_p: 0.0 must be in (0, 1]"),
    ("buffer.max_off_policy", 0, "buffer.max_off_policy: 0 must be > 0"),
    (
        "buffer.role_stall_timeout_s",
        0.5,
        "buffer.role_stall_timeout_s: 0.5 must be 0 (off) or >= 1 (seconds)",
    ),
    (
        "buffer.role_stall_timeout_s",
        -1.0,
        "buffer.role_stall_timeout_s: -1.0 must be 0 (off) or >= 1",
    ),
    (
        "data.chat_template",
        "maybe",
        "data.chat_template: 'maybe' is not one of",
    ),
    (
        "data.source",
        "hf",
        "data.source: 'hf' is not one of ('builtin', 'builtin_code', 'builtin_search',",
    ),
    (
        "data.on_long_prompt",
        "cut",
        "data.on_long_prompt: 'cut' is not one of ('error', 'skip')",
    ),
    (
        "data.builtin_difficulty",
        (0,),
        "data.builtin_difficulty: (0,) must be a non-empty tuple",
    ),
    ("rewards.verifier", "python", "rewards.verifier: 'python' is not one of"),
    ("trainer.keep_checkpoints", 0, "trainer.keep_checkpoints: 0 must be > 0"),
    (
        "trainer.warm_start_slip_prob",
        1.0,
        "trainer.warm_start_slip_prob: 1.0 must be in [0, 1)",
    ),
    (
        "monitor.entropy_min_fraction",
        1.0,
        "monitor.entropy_min_fraction: 1.0 must be in [0, 1)",
    ),
    (
        "monitor.truncation_rate_max",
        1.5,
        "monitor.truncation_rate_max: 1.5 must be in [0, 1)",
    ),
    ("monitor.logp_diff_max", -0.1, "monitor.logp_diff_max: -0.1 must be >= 0"),
    ("monitor.ratio_max", 0.5, "monitor.ratio_max: 0.5 must be 0 (off) or > 1"),
    (
        "monitor.reward_stuck_steps",
        2.0,
        "monitor.reward_stuck_steps: expected int",
    ),
    (
        "monitor.val_drop_max",
        -0.2,
        "monitor.val_drop_max: -0.2 must be in [0, 1)",
    ),
]


@pytest.mark.parametrize("path,value,message", _BAD_FIELDS)
def test_bad_field_is_named(path, value, message):
  with pytest.raises(config_lib.ConfigError) as e:
    config_lib.validate(_with(path, value))
  assert str(e.value).startswith(message), str(e.value)


def test_a_missing_field_with_a_rule_is_named():
  config = scalerl.get_config()
  with config.unlocked():
    del config.model["head_dim"]
  with pytest.raises(
      config_lib.ConfigError, match=r"^model.head_dim: missing config field"
  ):
    config_lib.validate(config)


# (fields set together, devices, start of the message):
# each fails on a relation.
_INCONSISTENT = [
    (
        {"model.num_heads": 5},
        None,
        "model.num_kv_heads: 2 does not divide model.num_heads=5",
    ),
    (
        {"mesh.shape": (1, 1, 4)},
        4,
        "model.num_kv_heads: 2 is not divisible by 4",
    ),
    ({"mesh.shape": (1, 1, 3)}, 3, "model.num_heads: 4 is not divisible by 3"),
    (
        {"mesh.shape": (1, 6, 1)},
        6,
        "model.embed_dim: 128 is not divisible by 6",
    ),
    (
        {"mesh.shape": (1, 1, 2), "model.mlp_dim": 765},
        2,
        "model.mlp_dim: 765 is not divisible by 2",
    ),
    (
        {"mesh.shape": (2, 2, 2)},
        4,
        "mesh.shape: (2, 2, 2) needs 8 devices, 4 available",
    ),
    ({"mesh.shape": (3, -1, 1)}, 8, "mesh.shape: fixed sizes (3, -1, 1)"),
    (
        {"mesh.shape": (1, -1)},
        None,
        "mesh.shape: (1, -1) has 2 sizes for 3 axes",
    ),
    (
        {"mesh.logical_axis_rules": (("embed", "model"),)},
        None,
        "mesh.logical_axis_rules: rule for 'embed' names mesh axis 'model'",
    ),
    (
        {"sampling.max_new_tokens": 500},
        None,
        "sampling.max_new_tokens: max_prompt_len 64 + max_new_tokens 500 exceeds model.max_seq_len 512",
    ),
    (
        {
            "sampling.interruption.enabled": True,
            "sampling.interruption.thinking_budget_min": 10,
            "sampling.interruption.thinking_budget_max": 5,
        },
        None,
        "sampling.interruption.thinking_budget_min: 10 > thinking_budget_max 5",
    ),
    (
        {
            "sampling.interruption.enabled": True,
            "sampling.interruption.thinking_budget_min": 10,
            "sampling.interruption.thinking_budget_max": 200,
        },
        None,
        "sampling.interruption.thinking_budget_max: 200 exceeds sampling.max_new_tokens 96",
    ),
    (
        {"optim.schedule": "cosine", "optim.decay_steps": 0},
        None,
        "optim.decay_steps: cosine schedule needs decay_steps > 0",
    ),
    ({"rl.reward_incorrect": 1.0}, None, "rl.reward_correct: 1.0 must exceed"),
    (
        {"data.source": "jsonl"},
        None,
        "data.jsonl_train: must be set when data.source='jsonl'",
    ),
    ({"data.source": "tfds"}, None, "data.tfds_name: must be set"),
    (
        {"data.jsonl_answer_field": "prompt"},
        None,
        "data.jsonl_answer_field: 'prompt' is also data.jsonl_prompt_field",
    ),
]


def _with_all(updates):
  config = scalerl.get_config()
  for path, value in updates.items():
    node = config
    *parents, leaf = path.split(".")
    for p in parents:
      node = node[p]
    node[leaf] = value
  return config


@pytest.mark.parametrize("updates,num_devices,message", _INCONSISTENT)
def test_inconsistent_fields_are_named(updates, num_devices, message):
  with pytest.raises(config_lib.ConfigError) as e:
    config_lib.validate(_with_all(updates), num_devices=num_devices)
  assert str(e.value).startswith(message), str(e.value)


def test_a_plain_dict_config_is_walked_too():
  config = ml_collections.ConfigDict(scalerl.get_config().to_dict())
  config_lib.validate(config)
  config.rl.aggregation = "seq"  # Unlocked: nothing refuses it until validate.
  with pytest.raises(config_lib.ConfigError, match="rl.aggregation: 'seq'"):
    config_lib.validate(config)


def test_the_trainer_refuses_every_invalid_config_before_compiling(tmp_path):
  """train_and_evaluate, the entry point, fails on each config
  with its field named."""
  configs = [
      (_with(path, value), message) for path, value, message in _BAD_FIELDS
  ]
  configs += [
      (_with_all(updates), message)
      for updates, num_devices, message in _INCONSISTENT
      if num_devices is None
  ]
  assert len(configs) >= 20
  compile_event = "/jax/core/compile/backend_compile_duration"
  events = []
  listener = lambda event, *args, **kwargs: events.append(event)
  jax.monitoring.register_event_duration_secs_listener(listener)
  try:
    for i, (config, message) in enumerate(configs):
      with pytest.raises(config_lib.ConfigError) as e:
        trainer_lib.train_and_evaluate(config, str(tmp_path / str(i)))
      assert str(e.value).startswith(message), str(e.value)
    refused = list(events)
    # The listener does see a compile.
    jax.jit(lambda x: x * 3 + 1)(jax.numpy.arange(7))
  finally:
    jax.monitoring.unregister_event_duration_listener(listener)
  assert compile_event not in refused and compile_event in events
