"""Hugging Face checkpoint parity: logits vs `transformers`,
export round trip, errors."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from configs import scalerl
from scalerl_jax import sharding
from scalerl_jax.models import hf_io
from scalerl_jax.models import transformer

_SHAPE = dict(
    vocab_size=97,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
)

_ARCHS = {
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM, {}),
    "llama3_rope": (
        transformers.LlamaConfig,
        transformers.LlamaForCausalLM,
        dict(
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 16,
            }
        ),
    ),
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM, {}),
    "qwen2_tied": (
        transformers.Qwen2Config,
        transformers.Qwen2ForCausalLM,
        dict(tie_word_embeddings=True),
    ),
    "qwen3": (
        transformers.Qwen3Config,
        transformers.Qwen3ForCausalLM,
        dict(head_dim=16),
    ),
}


def _hf_model(name, tmp_path):
  """A random HF model saved with save_pretrained; norms and biases perturbed
  so that a mix-up of them cannot hide behind their all-ones / zeros init."""
  config_cls, model_cls, extra = _ARCHS[name]
  torch.manual_seed(0)
  model = model_cls(config_cls(**_SHAPE, **extra)).eval()
  with torch.no_grad():
    for pname, p in model.named_parameters():
      if "norm" in pname or "bias" in pname:
        p.add_(torch.randn_like(p) * 0.1)
  path = str(tmp_path / name)
  model.save_pretrained(path)
  return model, path


def _ids():
  return np.random.RandomState(0).randint(0, _SHAPE["vocab_size"], (2, 40))


def _hf_logits(model, ids):
  with torch.no_grad():
    return model(torch.tensor(ids)).logits.numpy()


@pytest.mark.parametrize("name", sorted(_ARCHS))
def test_logits_match_transformers_and_export_round_trips(name, tmp_path):
  model, path = _hf_model(name, tmp_path)
  cfg, params = hf_io.load_checkpoint(path)
  assert cfg.family == name.split("_")[0].replace("llama3", "llama")
  ids = _ids()
  ours = jax.jit(transformer.Transformer(cfg).apply)(
      {"params": params}, jnp.asarray(ids)
  )
  ref = _hf_logits(model, ids)
  err = np.abs(np.asarray(ours) - ref).max()
  print(f"{name}: max |logit diff| vs transformers = {err:.2e}")
  assert err <= 1e-4

  exported = str(tmp_path / f"{name}_export")
  hf_io.save_checkpoint(params, cfg, exported)
  reloaded = transformers.AutoModelForCausalLM.from_pretrained(exported).eval()
  assert type(reloaded) is type(model)
  err = np.abs(_hf_logits(reloaded, ids) - ref).max()
  print(f"{name}: export round trip max |logit diff| = {err:.2e}")
  assert err <= 1e-4


def test_sharded_index_checkpoint_loads_onto_mesh(tmp_path):
  model, path = _hf_model("qwen3", tmp_path)
  cfg, params = hf_io.load_checkpoint(path)
  # Force several shards plus model.safetensors.index.json.
  sharded = str(tmp_path / "sharded")
  names = hf_io.save_checkpoint(params, cfg, sharded, max_shard_bytes=20_000)
  assert len(names) > 2
  with open(os.path.join(sharded, "model.safetensors.index.json")) as f:
    assert set(json.load(f)["weight_map"].values()) == set(names)
  config = scalerl.get_config()
  mesh = sharding.make_mesh(config.mesh)
  rules = sharding.logical_rules(config.mesh)
  shardings = sharding.param_shardings(
      transformer.Transformer(cfg), mesh, rules
  )
  cfg2, params2 = hf_io.load_checkpoint(sharded, shardings=shardings)
  assert cfg2 == cfg
  leaves, leaves2 = jax.tree_util.tree_leaves(
      params
  ), jax.tree_util.tree_leaves(params2)
  assert len(leaves) == len(leaves2)
  for a, b in zip(leaves, leaves2):
    np.testing.assert_array_equal(a, b)
  assert params2["embedding"].sharding == shardings["embedding"]


def test_bfloat16_params_on_load(tmp_path):
  _, path = _hf_model("llama", tmp_path)
  cfg, params = hf_io.load_checkpoint(
      path, param_dtype="bfloat16", compute_dtype="bfloat16"
  )
  assert {x.dtype for x in jax.tree_util.tree_leaves(params)} == {
      jnp.dtype(jnp.bfloat16)
  }
  logits = transformer.Transformer(cfg).apply(
      {"params": params}, jnp.asarray(_ids())
  )
  assert logits.dtype == jnp.float32  # fp32_lm_head defaults on


def test_missing_directory_and_files(tmp_path):
  with pytest.raises(hf_io.CheckpointError, match="does not exist"):
    hf_io.load_checkpoint(str(tmp_path / "nope"))
  (tmp_path / "empty").mkdir()
  with pytest.raises(hf_io.CheckpointError, match="config.json"):
    hf_io.load_checkpoint(str(tmp_path / "empty"))
  _, path = _hf_model("llama", tmp_path)
  os.remove(os.path.join(path, "model.safetensors"))
  with pytest.raises(hf_io.CheckpointError, match="model.safetensors"):
    hf_io.load_checkpoint(path)


def test_missing_shard_is_named(tmp_path):
  _, path = _hf_model("llama", tmp_path)
  cfg, params = hf_io.load_checkpoint(path)
  sharded = str(tmp_path / "sharded")
  names = hf_io.save_checkpoint(params, cfg, sharded, max_shard_bytes=20_000)
  os.remove(os.path.join(sharded, names[1]))
  with pytest.raises(hf_io.CheckpointError, match=names[1]):
    hf_io.load_checkpoint(sharded)


def _edit_config(path, **changes):
  """Rewrites <path>/config.json with some fields changed."""
  config_path = os.path.join(path, "config.json")
  with open(config_path) as f:
    hf = json.load(f)
  with open(config_path, "w") as f:
    json.dump(dict(hf, **changes), f)


def test_unsupported_architecture_is_named(tmp_path):
  _, path = _hf_model("llama", tmp_path)
  _edit_config(path, architectures=["MistralForCausalLM"])
  with pytest.raises(hf_io.CheckpointError, match="MistralForCausalLM"):
    hf_io.load_checkpoint(path)


def test_wrong_tensor_shape_is_named(tmp_path):
  _, path = _hf_model("qwen2", tmp_path)
  # The file's MLP tensors are 48 wide.
  _edit_config(path, intermediate_size=64)
  with pytest.raises(
      hf_io.CheckpointError, match=r"model\.layers\.0\.mlp\.\w+_proj\.weight"
  ):
    hf_io.load_checkpoint(path)


def test_missing_and_unused_tensors_are_named(tmp_path):
  _, path = _hf_model("qwen3", tmp_path)
  # Claim Llama: the q_norm / k_norm tensors are then unexpected.
  _edit_config(path, architectures=["LlamaForCausalLM"], model_type="llama")
  with pytest.raises(hf_io.CheckpointError, match="q_norm"):
    hf_io.load_checkpoint(path)
  # Claim Qwen2: the q_proj bias is then missing.
  _edit_config(path, architectures=["Qwen2ForCausalLM"], model_type="qwen2")
  with pytest.raises(hf_io.CheckpointError, match=r"q_proj\.bias: missing"):
    hf_io.load_checkpoint(path)
