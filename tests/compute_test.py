"""Tests of scalerl_jax.metrics.compute: FLOPs counted by hand,
the cumulative meter."""

import dataclasses
import json

import numpy as np
import pytest

from configs import scalerl
from scalerl_jax.metrics import compute
from scalerl_jax.models.model_config import ModelConfig
from tests import helpers

# A model small enough to count by hand: D=4, L=1, H=2, K=1, E=2, F=3, V=10.
#   per layer: q,k,v,o = D*E*(2H + 2K) = 4*2*6 = 48; MLP 3*D*F = 36 -> 84
#   LM head D*V = 40 -> matmul params P = 124, 2P = 248 FLOPs per token
#   attention: 2*2*L*H*E = 16 FLOPs per attended key
_CFG = dataclasses.replace(
    ModelConfig.from_config(scalerl.get_config().model),
    vocab_size=10,
    embed_dim=4,
    num_layers=1,
    num_heads=2,
    num_kv_heads=1,
    head_dim=2,
    mlp_dim=3,
    qkv_bias=False,
    qk_norm=False,
)


def test_matmul_params_hand_count_and_num_params():
  assert compute.matmul_params(_CFG) == 124
  # Tied, no biases/qk-norm (tiny_cpu): the head is the embedding, so the
  # matmul parameters are exactly the parameters minus the norm scales.
  tied = ModelConfig.from_config(scalerl.get_config("variant=tiny_cpu").model)
  norms = tied.num_layers * 2 * tied.embed_dim + tied.embed_dim
  assert compute.matmul_params(tied) == tied.num_params() - norms
  # Untied: the embedding table takes part in no matmul.
  untied = ModelConfig(**{**tied.__dict__, "tie_embeddings": False})
  embedding = untied.vocab_size * untied.embed_dim
  assert (
      compute.matmul_params(untied) == untied.num_params() - norms - embedding
  )


def test_forward_flops_hand_worked():
  # One token after 2 cached ones attends to 3 keys: 248 + 16 * 3.
  assert compute.forward_flops(_CFG, 1, past=2) == 296
  # Three tokens from scratch attend to 1 + 2 + 3 = 6 keys: 3 * 248 + 16 * 6.
  assert compute.forward_flops(_CFG, 3) == 840
  # Two tokens after 2 cached ones attend to 3 + 4 keys: 2 * 248 + 16 * 7.
  assert compute.forward_flops(_CFG, 2, past=2) == 608
  assert compute.forward_flops(_CFG, 0, past=5) == 0


def test_generation_flops_hand_worked():
  # Sequence 1: prompt 2, 3 sampled -> tokens at positions 0..3 go through the
  #   model: prefill 2 * 248 + 16 * (1 + 2) = 544,
  #   decode 2 * 248 + 16 * (3 + 4) = 608.
  # Sequence 2: prompt 1, 1 sampled -> only the prompt: 248 + 16 * 1 = 264.
  assert compute.generation_flops(_CFG, [2], [3]) == 544 + 608
  assert (
      compute.generation_flops(_CFG, np.array([2, 1]), np.array([3, 1]))
      == 1152 + 264
  )
  with pytest.raises(ValueError, match="2 prompt lengths but 1 completion"):
    compute.generation_flops(_CFG, [2, 1], [3])


def test_generation_counted_as_it_happens_adds_up_to_generation_flops():
  # Prompt 2, then 3 tokens decoded in calls of 1 and 2 (lengths 2 -> 3 -> 5):
  #   prefill: positions 0, 1 -> 2 * 248 + 16 * (1 + 2) = 544;
  #   first call: the first token's predecessor is the prompt's (prefilled): 0;
  #   second call: tokens at positions 3, 4 feed back positions 2, 3 with 3 and
  #   4 keys -> 2 * 248 + 16 * (3 + 4) = 608.
  assert compute.prefill_flops(_CFG, [2]) == 544
  assert compute.decode_flops(_CFG, [2], [2], [3]) == 0
  assert compute.decode_flops(_CFG, [2], [3], [5]) == 608
  assert 544 + 0 + 608 == compute.generation_flops(_CFG, [2], [3])
  # Any split of the decoding into calls sums to the same, row by row.
  rng = np.random.RandomState(0)
  prompts, lengths = rng.randint(1, 9, 16), rng.randint(0, 30, 16)
  total = compute.prefill_flops(_CFG, prompts)
  at = prompts.copy()
  while (at < prompts + lengths).any():
    nxt = np.minimum(at + rng.randint(0, 5, 16), prompts + lengths)
    total += compute.decode_flops(_CFG, prompts, at, nxt)
    at = nxt
  assert total == compute.generation_flops(_CFG, prompts, lengths)
  with pytest.raises(ValueError):
    compute.decode_flops(_CFG, [2, 1], [2], [3])


def test_train_flops_hand_worked():
  # 3 x (5 * 248 + 16 * (1 + 2 + 3 + 4 + 5)) = 3 * (1240 + 240).
  assert compute.train_flops(_CFG, [5]) == 4440
  assert compute.train_flops(_CFG, [5, 1]) == 4440 + 3 * (248 + 16)


def test_compute_meter_accumulates_and_resumes():
  meter = compute.ComputeMeter()
  meter.add(flops=100, wall_seconds=2.0, num_devices=4)
  meter.add(flops=50, wall_seconds=0.5)
  meter.add(flops=25, wall_seconds=3.0, num_devices=2)
  # 8 + 0.5 + 3 * 2 device-seconds.
  assert meter.scalars() == {
      "compute/flops": 175.0,
      "compute/device_seconds": 14.5,
  }
  state = json.loads(json.dumps(meter.state_dict()))
  resumed = compute.ComputeMeter()
  resumed.load_state_dict(state)
  resumed.add(flops=1, wall_seconds=1.0)
  assert resumed.scalars() == {
      "compute/flops": 176.0,
      "compute/device_seconds": 15.5,
  }


def test_compute_meter_rejects_bad_input():
  meter = compute.ComputeMeter()
  with pytest.raises(ValueError, match="num_devices >= 1"):
    meter.add(flops=1, wall_seconds=1.0, num_devices=0)
  with pytest.raises(ValueError, match="keys"):
    meter.load_state_dict({"flops": 1})
  with pytest.raises(
      ValueError, match=r"device_seconds=-1.0 is not a non-negative"
  ):
    meter.load_state_dict({"flops": 1, "device_seconds": -1.0})


def test_memory_scalars_report_the_device_nearest_to_running_out():
  devices = [
      helpers.StatsDevice(
          {"peak_bytes_in_use": 7e9, "bytes_in_use": 2e9, "bytes_limit": 9e9}
      ),
      helpers.StatsDevice(
          {"peak_bytes_in_use": 5e9, "bytes_in_use": 3e9, "bytes_limit": 8e9}
      ),
  ]
  assert compute.memory_scalars(devices) == {
      compute.MEMORY_PEAK_KEY: 7.0,
      compute.MEMORY_IN_USE_KEY: 3.0,
      compute.MEMORY_LIMIT_KEY: 8.0,
  }
  # A backend without statistics (the CPU) logs nothing.
  assert compute.memory_scalars([helpers.StatsDevice(None)]) == {}
  assert compute.memory_scalars() == {}
