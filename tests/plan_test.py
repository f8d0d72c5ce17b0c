"""Tests of the planner, scalerl_jax.jobs.planner.plan (memory and FLOPs per
device) with its layout_bytes, activations, program_estimates and plan_report,
and launch/plan.py.

The numbers are worked out by hand below for `tiny_cpu`'s settings with a
wider model (`_SHAPE`, ~3.3M parameters, the shape tiny_cpu had until its
default run needed a faster one): V=512, D=256, L=4, H=8, K=4, E=32, F=768,
tied embeddings, float32 params and compute; P x G = 8 x 16 = 128 sequences
of 64 + 96 = 160 tokens.

Run as a script (`python -m tests.plan_test`, 8 simulated devices) it prints
the bytes that real sharded arrays hold on device 0, for
`test_plan_matches_real_sharded_arrays`.
"""

import functools
import json
import os
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest

from configs import scalerl
from scalerl_jax import config as config_lib
from scalerl_jax import optim
from scalerl_jax import sharding
from scalerl_jax import trainer as trainer_lib
from scalerl_jax.jobs.planner import accelerators
from scalerl_jax.jobs.planner import activations
from scalerl_jax.jobs.planner import layout_bytes
from scalerl_jax.jobs.planner import plan
from scalerl_jax.jobs.planner import plan_report
from scalerl_jax.jobs.planner import program_estimates
from scalerl_jax.models import kv_cache
from scalerl_jax.models import model_config
from scalerl_jax.models import transformer
from scalerl_jax.rl import logprobs
from scalerl_jax.rl import losses
from scalerl_jax.rl import train_step as train_step_lib
from tests import helpers

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Parameters: attention D*E*(2H + 2K) = 256*32*24 = 196,608 per layer, MLP
# 3*D*F = 589,824, norms 2*D = 512 -> 786,944 per layer; x 4 layers = 3,147,776;
# embedding V*D = 131,072; final norm 256 -> 3,279,104 in all. Norm scales
# (2,048 in the layers + 256 final = 2,304) are replicated; every other
# tensor has an `embed` axis (-> fsdp) and maybe heads/mlp/vocab (-> tensor).
SHARDED_PARAMS = 3_279_104 - 2_304


# attention="plain" pins the [B, H, T, T] softmax the hand counts below include
# (`auto` would pick splash on the planner's default platform, TPU).
_SHAPE = dict(
    embed_dim=256,
    num_heads=8,
    num_kv_heads=4,
    head_dim=32,
    mlp_dim=768,
    attention="plain",
)


def _plan(config, num_devices):
  """The plan with CPU layouts: the hand counts below take
  no TPU tile padding."""
  return plan.make_plan(config, num_devices, platform="cpu")


def _config(**mesh_shape):
  config = scalerl.get_config("tiny_cpu")
  with config.unlocked():
    config.model.update(_SHAPE)
    config.data.prompts_per_step = 8
    for name, value in mesh_shape.items():
      config.mesh[name] = value
  return config


def test_a_gpu_kernel_is_planned_on_a_machine_without_one():
  # Planning cuDNN attention must not trace cuDNN (absent on a CPU host); the
  # parameters do not depend on the kernel.
  config = _config()
  with config.unlocked():
    config.model.compute_dtype = "bfloat16"
    config.model.attention = "cudnn"
  gpu = plan.make_plan(config, 8, platform="gpu")
  with config.unlocked():
    config.model.attention = "plain"
  assert gpu.params == plan.make_plan(config, 8, platform="gpu").params > 0


def test_an_untied_embedding_is_gathered_with_its_gradient():
  # fsdp 8: the train step un-shards the float32 [512, 256] table for the
  # lookup and its gradient, 2 x 4 x 512 x 256 bytes, as it does the head.
  tied = _plan(_config(), 8)
  config = _config()
  with config.unlocked():
    config.model.tie_embeddings = False
  untied = _plan(config, 8)
  assert untied.unsharded.embedding == 2 * 4 * 512 * 256 == 1_048_576
  assert tied.unsharded.embedding == 0
  assert untied.unsharded.head == tied.unsharded.head == 1_048_576
  # Its gradient comes after the layers' backward, beside the hidden states'
  # gradient only (2,544 x 1,024 + 1,048,576 B): below the head's phase.
  assert untied.activations_no_remat == tied.activations_no_remat


def test_params_optimizer_and_grads_follow_the_rules_on_fsdp8():
  p = _plan(_config(), 8)
  assert p.mesh_shape == {"data": 1, "fsdp": 8, "tensor": 1}
  # 3,276,800 / 8 + 2,304 = 411,904 float32 entries.
  assert p.params == 411_904 * 4 == 1_647_616
  assert p.grads == p.params
  # AdamW: mu and nu in float32, sharded like the params, plus two
  # replicated int32 step counts (adam, schedule): 2 x 1,647,616 + 8.
  assert p.opt_state == 2 * 1_647_616 + 8 == 3_295_240
  # Decode weights: the layer kernels and norms in float32 (no embedding):
  # 3,147,776 - 2,048 norms = 3,145,728 / 8 + 2,048 = 395,264 entries.
  assert p.decode_weights == 395_264 * 4


def test_params_on_a_mesh_with_data_and_tensor_axes():
  # (2, 2, 2): data replicates parameters, fsdp x tensor splits them 4 ways
  # (the embedding is [vocab -> tensor, embed -> fsdp]).
  p = _plan(_config(shape=(2, 2, 2)), 8)
  assert p.params == (SHARDED_PARAMS // 4 + 2_304) * 4 == 3_286_016
  assert p.opt_state == 2 * 3_286_016 + 8


def test_sampler_state_on_fsdp8():
  p = _plan(_config(), 8)
  # pipeline_rl: 2 x P x G = 256 slots, 32 per device.
  assert p.num_slots == 256
  # KV cache: 256 slots x 160 positions x 4 layers x 4 kv heads x 32 x 2 (k, v)
  # x 4 bytes / 8 devices.
  assert p.kv_cache == 256 * 160 * 4 * 4 * 32 * 2 * 4 // 8 == 20_971_520
  # Per slot: tokens, logp, logp_sampling, version, uniform (4 B x 160 each)
  # = 3,200, mask 160, prompt_len/length/limit 12, active/done/truncated 3,
  # meta 4, interruption budget/phrase_pos 8 + 2 flags = 3,389 B; x 32 slots.
  assert p.slot_records == 3_389 * 32 == 108_448


def test_kv_cache_splits_kv_heads_over_tensor():
  # (2, 2, 2): slots over data x fsdp (64 each), kv heads over tensor (2 each).
  p = _plan(_config(shape=(2, 2, 2)), 8)
  assert p.kv_cache == 64 * 2 * 32 * 160 * 2 * 4 * 4


def test_activations_on_fsdp8():
  p = _plan(_config(), 8)
  # 128 rows / 8 = 16 per device, T = 159 tokens -> 2,544 tokens per device.
  assert p.rows_per_device == 16
  # Per token per layer (float32 entries): 4 x D (block input, attn norm,
  # residual, MLP norm) = 1,024; q and attention output 2 x H*E = 512; k, v
  # 2 x K*E = 256; gate, up, hidden 3 x F = 2,304; softmax H x T = 1,272.
  # 5,368 entries = 21,472 B; x 2,544 tokens = 54,624,768 B per layer.
  per_layer = 2_544 * 21_472
  # The head's phase, per token: the final hidden state D + one float32 chunk
  # of logits V = 768 entries = 3,072 B; x 2,544 = 7,815,168. Beside them the
  # float32 head [256, 512] un-sharded and its gradient: 1,048,576 B.
  head = 2_544 * 3_072 + 2 * 4 * 256 * 512
  assert p.activations_no_remat == 4 * per_layer + head == 227_362_816
  # Remat: each layer's input only (D = 1,024 B per token) and then the most
  # of the head's phase and a layer's backward: its recomputed residuals and
  # its float32 kernels (786,944 entries) un-sharded with their gradient.
  layer = 2 * 786_944 * 4
  assert (
      p.activations_remat == 4 * 2_544 * 1_024 + per_layer + layer == 71_340_544
  )
  # remat is off in tiny_cpu; per sequence, without the weights.
  assert p.activations_per_row == (4 * per_layer + 2_544 * 3_072) // 16


def test_flash_attention_keeps_a_log_sum_exp_instead_of_the_softmax():
  config = _config()
  with config.unlocked():
    config.model.attention = "splash"
  # Per token per layer the H x T = 1,272 softmax entries become H = 8
  # float32 log-sum-exps: 5,368 - 1,272 + 8 = 4,104 entries = 16,416 B; x 2,544
  # tokens per device.
  assert (
      _plan(config, 8).activations_no_remat
      == 4 * 2_544 * 16_416 + 2_544 * 3_072 + 2 * 4 * 256 * 512
  )
  cfg = model_config.ModelConfig.from_config(
      scalerl.get_config("tiny_cpu").model
  )
  # auto on a TPU slice.
  assert activations._resolve_attention(cfg, "tpu", 159) == "splash"
  assert activations._resolve_attention(cfg, "cpu", 159) == "plain"


def test_tpu_layouts_pad_the_two_minor_dimensions_to_tiles():
  # float32 tiles are (8, 128), bfloat16 (16, 128): q [rows, T, H=4, E=32].
  # The compiler tiles the sublanes with the dim that pads least: here the
  # 64, not the 4 (x2 for float32, x4 for bfloat16's 16-row tiles).
  assert layout_bytes.tpu_tiled([64, 159, 4, 32], 4) == [64, 159, 4, 128]
  assert layout_bytes.tpu_tiled([64, 159, 4, 32], 2) == [64, 159, 4, 128]
  assert layout_bytes.tpu_tiled([3, 5, 32], 4) == [
      3,
      8,
      128,
  ]  # 5 -> 8 beats 3 -> 8.
  assert layout_bytes.tpu_tiled([1, 16383, 2, 64], 2) == [1, 16384, 2, 128]
  assert layout_bytes.tpu_tiled([1024], 4) == [1024]
  # Temporaries are counted tiled on TPU, arrays that live across programs not;
  # the TPU allocates the cache's 160 positions as 256 (kv_cache.cache_align).
  plain = _config()
  with plain.unlocked():
    plain.sampling.decode_attention = "plain"
  p_cpu, p_tpu = _plan(plain, 8), plan.make_plan(plain, 8, platform="tpu")
  assert p_tpu.params == p_cpu.params
  assert p_tpu.kv_cache * 160 == p_cpu.kv_cache * 256
  # The decode step's float32 logits [32 slots, V=512] x 3 are whole tiles; its
  # scores [32, K=4, Q=2, S=256] over the allocated positions (on CPU
  # S=160), and the 32 slots fill whole 8-row sublane tiles.
  assert p_cpu.decode_temps == 3 * 32 * 512 * 4 + 32 * 4 * 2 * 160 * 4
  assert p_tpu.decode_temps == 3 * 32 * 512 * 4 + 32 * 4 * 2 * 256 * 4
  # "auto" is the Pallas kernel on TPU, which keeps the scores on chip; the
  # CPU keeps plain attention.
  auto = plan.make_plan(_config(), 8, platform="tpu")
  assert auto.decode_temps == 3 * 32 * 512 * 4
  assert _plan(_config(), 8).decode_temps == p_cpu.decode_temps


def test_microbatches_and_logprob_chunks_shrink_activations():
  config = _config()
  with config.unlocked():
    config.trainer.microbatches, config.trainer.logprob_chunk = 4, 32
  p = _plan(config, 8)
  # 128 / 4 = 32 rows per microbatch, 4 per device: 636 tokens. The layers
  # keep 21,472 B per token (as above). The head's phase adds the final
  # hidden states (1,024 B per token), one float32 [4, 32, 512] chunk of
  # logits and the head with its gradient: 651,264 + 262,144 + 1,048,576 B.
  # A layer's backward adds its kernels and their gradient, 6,295,552 B: the
  # step peaks there.
  assert p.rows_per_device == 4
  assert p.activations_no_remat == 4 * 636 * 21_472 + 2 * 786_944 * 4
  # The float32 gradient accumulator is sharded like the (float32) parameters.
  assert p.grad_accum == p.grads == 1_647_616
  assert p.train_peak == p.resident + 2 * p.grads + p.activations_no_remat
  assert _plan(_config(), 8).grad_accum == 0


def test_activations_split_heads_mlp_and_vocab_over_tensor():
  # (2, 2, 2): 128 / 4 = 32 rows per device, 5,088 tokens;
  # tensor halves H, K, F, V.
  p = _plan(_config(shape=(2, 2, 2)), 8)
  # Per token per layer: 4 x 256 + 2 x 4*32 + 2 x 2*32 + 3 x 384 + 4 x 159
  # = 1,024 + 256 + 128 + 1,152 + 636 = 3,196 entries = 12,784 B.
  # Head: the final hidden state 256 + one logit chunk 256 = 512 entries =
  # 2,048 B, and the head un-sharded over fsdp (still halved by tensor) with
  # its gradient, 2 x 4 x 256 x 256 B.
  assert p.activations_no_remat == 5_088 * (4 * 12_784 + 2_048) + 2 * 4 * 256**2


def test_bfloat16_compute_and_qk_norm_add_their_residuals():
  config = _config()
  with config.unlocked():
    config.model.compute_dtype = "bfloat16"
    config.model.qk_norm = True
  cfg = model_config.ModelConfig.from_config(config.model)
  mesh = layout_bytes.abstract_mesh(config.mesh, 1)
  rules = sharding.logical_rules(config.mesh)
  # One sequence, 159 tokens. Per token per layer: the 4,096 entries above
  # in bfloat16 = 8,192 B; the float32 softmax and its bfloat16 copy
  # 8 x 159 x (4 + 2) = 7,632 B; q and k before their norms (256 + 128) x 2
  # = 768 B; 16,592 B. Head: the final hidden state 256 x 2 + a float32
  # logit chunk 512 x 4 = 2,560 B. Layer input (remat): 256 x 2 = 512 B.
  # With remat a layer's backward (16,592 B per token) outweighs the head.
  assert activations.activation_bytes(
      cfg, mesh, rules, 1, 160, remat=False, platform="cpu"
  ) == 159 * (4 * 16_592 + 2_560)
  assert activations.activation_bytes(
      cfg, mesh, rules, 1, 160, remat=True, platform="cpu"
  ) == 159 * (4 * 512 + 16_592)


def _one_sequence_activations(seq_len, **kwargs):
  """`activation_bytes` of the test config, plain attention on every platform,
  for one sequence of `seq_len`, without remat; `kwargs` complete it."""
  config = _config()
  with config.unlocked():
    config.model.attention = "plain"
  cfg = model_config.ModelConfig.from_config(config.model)
  return activations.activation_bytes(
      cfg,
      layout_bytes.abstract_mesh(config.mesh, 1),
      sharding.logical_rules(config.mesh),
      1,
      seq_len,
      remat=False,
      **kwargs,
  )


def test_gpu_counts_the_logit_chunk_and_its_gradient():
  # One sequence of 159 positions: two more float32 chunks of V = 512 logits
  # per position, 2 x 159 x 512 x 4 = 651,264 B, on GPU only.
  gpu = _one_sequence_activations(160, platform="gpu")
  assert gpu - _one_sequence_activations(160, platform="cpu") == 651_264


def test_the_planner_counts_the_head_chunk_as_the_head_evens_it():
  # 1,279 positions at chunk 1,024: the head runs two chunks of 640
  # (logprobs.evened_chunks), so one float32 chunk of V = 512 is
  # 640 x 512 x 4 = 1,310,720 B, not 1,024 x 512 x 4.
  assert logprobs.evened_chunks(1_279, 1_024) == (2, 640)
  assert logprobs.evened_chunks(1_279, 0) == (1, 1_279)
  assert logprobs.evened_chunks(100, 1_024) == (1, 100)
  # The whole sequence as one chunk of 1,279 against two of 640: the head's
  # phase differs by the chunk alone, (1,279 - 640) x 512 x 4 B.
  whole = _one_sequence_activations(1_280, chunk=0, platform="cpu")
  evened = _one_sequence_activations(1_280, chunk=1_024, platform="cpu")
  assert whole - evened == 639 * 512 * 4


def test_flops_at_the_full_budget():
  p = _plan(_config(), 8)
  # Matmul params: 4 x (196,608 + 589,824) + D*V 131,072 = 3,276,800.
  # Attention: 2*2*L*H*E = 4,096 FLOPs per attended key.
  # Generation: 159 tokens per sequence, sum of contexts 159*160/2 = 12,720:
  #   2 x 3,276,800 x 159 + 4,096 x 12,720 = 1,094,123,520 per sequence.
  assert p.generation_flops == 128 * 1_094_123_520
  # Training: 3 x a forward over 160 tokens (12,880 keys):
  #   3 x (2 x 3,276,800 x 160 + 4,096 x 12,880) = 3,303,997,440 per sequence.
  assert p.train_flops == 128 * 3_303_997_440


def test_fit_against_a_made_up_chip():
  p = _plan(_config(), 8)
  # Train peak: params and grads 1,647,616 x 2 + optimizer 3,295,240 + KV
  # 20,971,520 + records 108,448 + activations 227,362,816 = 255,033,256 B.
  assert p.peak == p.train_peak == 255_033_256
  chip = accelerators.Accelerator(
      "chip", hbm_bytes=400e6, peak_flops=1e12, source="none"
  )
  f = plan_report.fit(p, chip, margin=0.1)  # 360e6 usable.
  assert f.fits and f.free_bytes == pytest.approx(360e6 - 255_033_256)
  # Without activations 27,670,440 B; 332,329,560 / 14,144,640 per row = 23.5.
  assert f.rows_that_fit == 23
  assert plan_report.fit(p, chip, margin=0.36).fits  # 256e6 usable.
  assert not plan_report.fit(p, chip, margin=0.37).fits  # 252e6 usable.
  # 128 x 1,094,123,520 FLOPs over 8 chips x 1e12 FLOP/s.
  assert f.generate_s == pytest.approx(0.017505976)
  assert f.train_s == pytest.approx(128 * 3_303_997_440 / 8e12)


def _qwen3(weight_layout="sharded", shape=(1, -1, 1)):
  config = scalerl.get_config("qwen3_0.6b")
  with config.unlocked():
    config.sampling.weight_layout = weight_layout
    config.mesh.shape = shape
  return config


def test_qwen3_keeps_float32_master_weights_and_moments():
  p = _plan(_qwen3(), 8)
  # Replicated norms: 28 x (2 x 1,024 + 2 x 128 q/k norms) + 1,024 = 65,536.
  cfg = model_config.ModelConfig.from_config(
      scalerl.get_config("qwen3_0.6b").model
  )
  assert p.params == ((cfg.num_params() - 65_536) // 8 + 65_536) * 4
  assert p.opt_state == 2 * p.params + 8
  # The sampler's regrouped layers: q, k, v, o, gate, up and down (15,728,640
  # per layer, sharded 8 ways) a bfloat16 copy; the norm scales (2 x 1,024 +
  # 2 x 128, replicated) stay float32.
  assert p.decode_weights == 28 * (
      15_728_640 // 8 * 2 + (2 * 1024 + 2 * 128) * 4
  )
  assert p.num_slots == 2 * 48 * 16


# qwen3_0.6b's embedding and (tied) head: 151,936 x 1,024 entries.
_QWEN3_TABLE = 151_936 * 1_024
# One regrouped layer: 15,728,640 kernel entries in bfloat16, norms in float32.
_QWEN3_LAYER = 15_728_640 * 2 + (2 * 1024 + 2 * 128) * 4


def test_sampler_weights_sharded_are_split_over_fsdp_and_gathered_to_decode():
  p = _plan(_qwen3("sharded"), 8)
  # Embedding in bfloat16, the FP32 head in float32, both split 8 ways over
  # fsdp; the final norm's 1,024 float32 scales replicated.
  assert p.prepared_rest == _QWEN3_TABLE // 8 * (2 + 4) + 1024 * 4
  # Decode gathers the float32 head and one whole layer at a time.
  assert p.decode_gathered == _QWEN3_TABLE * 4 + _QWEN3_LAYER


def test_sampler_weights_resident_are_whole_on_each_chip_and_never_gathered():
  p = _plan(_qwen3("resident"), 8)
  assert p.decode_weights == 28 * _QWEN3_LAYER
  assert p.prepared_rest == _QWEN3_TABLE * (2 + 4) + 1024 * 4
  assert p.decode_gathered == 0
  assert p.generate_peak == p.resident + p.decode_weights + p.prepared_rest
  # The tied table transposed into the float32 head, from a copy as large.
  assert p.prepare_temps == _QWEN3_TABLE * 4
  assert program_estimates.program_estimates(_qwen3("resident"), 8)[
      "prepare"
  ] == (
      program_estimates.Memory(
          p.params, p.decode_weights + p.prepared_rest, 0, p.prepare_temps
      )
  )
  # With a tensor axis of 2 they are split over it: heads, kv heads, the MLP
  # and the vocabulary halve; the norms stay whole.
  q = _plan(_qwen3("resident", (1, 4, 2)), 8)
  assert q.decode_weights == 28 * (
      15_728_640 // 2 * 2 + (2 * 1024 + 2 * 128) * 4
  )
  assert q.prepared_rest == _QWEN3_TABLE // 2 * (2 + 4) + 1024 * 4


def test_the_regroup_stages_its_layer_weights_on_tpu7x_alone():
  config = _qwen3("resident")
  prepare = lambda chip: program_estimates.program_estimates(
      config, 8, chip=accelerators.ACCELERATORS[chip]
  )["prepare"]
  for chip in ("tpu_v5e", "tpu_v5p", "tpu_v6e", "h100", "h200"):
    assert accelerators.ACCELERATORS[chip].regroup_layer_copies == 0
    assert prepare(chip).temporaries == _QWEN3_TABLE * 4
  # TPU7x also stages each of the 28 regrouped layers once: 28 x (15,728,640
  # bfloat16 kernel entries + 2,304 float32 norm scales) = 28 x 31,466,496
  # = 881,061,888 bytes, beside the head's 151,936 x 1,024 x 4 = 622,329,856.
  assert prepare("tpu_7x").temporaries == 881_061_888 + 622_329_856


def test_the_report_warns_of_the_regroup_on_a_tensor_split_mesh():
  # The TPU compiler held up to 1.6x the planner's regroup there (docs/tpu.md).
  chips = accelerators.accelerators_named(["tpu_v5p"])
  warn = "Mesh with a tensor axis"
  assert warn in plan_report.format_report(
      _plan(_config(shape=(2, 2, 2)), 8), chips, 0.1
  )
  assert warn not in plan_report.format_report(_plan(_config(), 8), chips, 0.1)


def test_num_slots_rule():
  config = _config()
  with config.unlocked():
    config.buffer.schedule = "ppo_off_policy"
  assert plan.default_num_slots(config) == 128
  with config.unlocked():
    config.sampling.num_slots = 64
  assert plan.default_num_slots(config) == 64


def test_rejects_slots_that_do_not_divide_the_batch_axes():
  config = _config()
  with config.unlocked():
    config.sampling.num_slots = 12
  with pytest.raises(config_lib.ConfigError, match="sampling.num_slots: 12"):
    _plan(config, 8)


def test_rejects_a_mesh_the_model_does_not_divide_over():
  with pytest.raises(
      config_lib.ConfigError, match="model.embed_dim: 256 is not divisible by 3"
  ):
    _plan(_config(), 3)


def test_resolve_num_devices():
  assert plan.resolve_num_devices(_config(shape=(2, 2, 2)).mesh, None) == 8
  assert plan.resolve_num_devices(_config().mesh, 64) == 64
  assert plan.resolve_num_devices(_config().mesh, None) == jax.device_count()


def test_activation_count_is_a_lower_bound_of_xla_cpu():
  # XLA's own count for the compiled train step on one CPU device. The CPU
  # backend fuses less than TPU/GPU and keeps ~2x the residuals this model
  # counts; it must never keep fewer.
  config = _config()
  p = _plan(config, 1)
  cfg = model_config.ModelConfig.from_config(config.model)
  model = transformer.Transformer(cfg)
  optimizer = optim.make_optimizer(config.optim)
  params = nn.unbox(
      jax.eval_shape(
          lambda: model.init(jax.random.key(0), jnp.zeros((1, 1), jnp.int32))[
              "params"
          ]
      )
  )
  state = jax.eval_shape(
      functools.partial(train_step_lib.init_state, optimizer=optimizer), params
  )
  spec = train_step_lib.StepSpec(
      model=model,
      optimizer=optimizer,
      loss=losses.LossParams.from_config(config.rl),
      adv_norm="batch",
      zero_variance_filter=True,
      num_prompts=8,
      num_generations=16,
      temperature=1.0,
  )
  rows = jax.ShapeDtypeStruct((128, 160), jnp.float32)
  batch = {
      "tokens_BxS": jax.ShapeDtypeStruct((128, 160), jnp.int32),
      "mask_BxS": rows,
      "gen_logp_BxS": rows,
      "rewards_PxG": jax.ShapeDtypeStruct((8, 16), jnp.float32),
  }
  step = jax.jit(
      functools.partial(train_step_lib.train_step, spec=spec), donate_argnums=0
  )
  temp = step.lower(state, batch).compile().memory_analysis().temp_size_in_bytes
  assert p.activations_no_remat <= temp <= 3 * p.activations_no_remat


def test_plan_matches_real_sharded_arrays():
  real = helpers.run_on_8_devices("tests.plan_test")
  for shape in ((1, 8, 1), (2, 2, 2)):
    p = _plan(_config(shape=shape), 8)
    assert real[shape] == {
        "shape": list(shape),
        "params": p.params,
        "opt_state": p.opt_state,
        "kv_cache": p.kv_cache,
        "slot_records": p.slot_records,
    }


def test_launcher_prints_the_report():
  out = subprocess.run(
      [
          sys.executable,
          "-m",
          "launch.plan",
          "--config=configs/scalerl.py",
          "--config.mesh.shape=(2,2,2)",
          "--accelerators=tpu_v5e,h200",
          "--platform=cpu",
      ],
      cwd=REPO,
      capture_output=True,
      text=True,
      timeout=300,
  )
  assert out.returncode == 0, out.stderr[-2000:]
  assert "mesh {'data': 2, 'fsdp': 2, 'tensor': 2}" in out.stdout
  assert "sampler KV cache                0.021 GB" in out.stdout
  chips = [
      line.split()[:2]
      for line in out.stdout.splitlines()
      if line.startswith(("  TPU", "  NVIDIA"))
  ]
  assert chips == [["TPU", "v5e"], ["NVIDIA", "H200"]]


def _real_bytes_on_device_0():
  """Per-device bytes of the arrays the trainer and sampler really build."""
  from scalerl_jax.sampling.sampler import Sampler
  from scalerl_jax.sampling.settings import SamplingSettings

  device = jax.devices()[0]

  def on_device(tree):
    return sum(
        s.data.nbytes
        for x in jax.tree.leaves(tree)
        for s in x.addressable_shards
        if s.device == device
    )

  for shape in ((1, 8, 1), (2, 2, 2)):
    config = _config(shape=shape)
    cfg = model_config.ModelConfig.from_config(config.model)
    mesh, rules = sharding.make_mesh(config.mesh), sharding.logical_rules(
        config.mesh
    )
    params, param_shardings = sharding.init_model_params(
        transformer.Transformer(cfg), jax.random.key(0), mesh, rules
    )
    state, _ = train_step_lib.init_train_state(
        optim.make_optimizer(config.optim), params, param_shardings, mesh
    )
    sampler = Sampler(
        cfg, SamplingSettings(max_prompt_len=64, max_new_tokens=96), mesh, rules
    )
    slots = sampler.init_state(256, meta_width=1)
    kv = on_device(slots.cache)
    print(
        json.dumps(
            {
                "shape": list(shape),
                "params": on_device(state.params),
                "opt_state": on_device(state.opt_state),
                "kv_cache": kv,
                "slot_records": on_device(slots) - kv,
            }
        )
    )


if __name__ == "__main__":
  _real_bytes_on_device_0()
