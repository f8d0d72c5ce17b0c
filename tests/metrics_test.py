"""Tests of scalerl_jax.metrics: writers, compute accounting, NaN guard, progress."""

import glob
import io
import json
import os
import struct

import jax.numpy as jnp
import numpy as np
import pytest
from tensorboardX.proto import event_pb2

from configs import scalerl
from scalerl_jax import metrics
from scalerl_jax.models.transformer import ModelConfig

# A model small enough to count by hand: D=4, L=1, H=2, K=1, E=2, F=3, V=10.
#   per layer: q,k,v,o = D*E*(2H + 2K) = 4*2*6 = 48; MLP 3*D*F = 36 -> 84
#   LM head D*V = 40 -> matmul params P = 124, 2P = 248 FLOPs per token
#   attention: 2*2*L*H*E = 16 FLOPs per attended key
_CFG = ModelConfig(vocab_size=10, embed_dim=4, num_layers=1, num_heads=2, num_kv_heads=1,
                   head_dim=2, mlp_dim=3)


def _read_events(tb_dir):
  """Every Event in the TFRecord files of `tb_dir`, file by file in name order."""
  files = []
  for path in sorted(glob.glob(os.path.join(tb_dir, "events.out.tfevents.*"))):
    events = []
    with open(path, "rb") as f:
      data = f.read()
    pos = 0
    while pos < len(data):
      (length,) = struct.unpack("<Q", data[pos:pos + 8])
      pos += 12  # length + its CRC
      events.append(event_pb2.Event.FromString(data[pos:pos + length]))
      pos += length + 4  # payload + its CRC
    files.append(events)
  return files


def _scalars(events):
  return [(e.step, v.tag, round(v.simple_value, 5)) for e in events for v in e.summary.value]


def _lines(path):
  with open(path) as f:
    return [json.loads(line) for line in f]


def test_writer_jsonl_and_tensorboard(tmp_path):
  workdir = str(tmp_path / "run")
  with metrics.MetricWriter(workdir, is_primary=True) as writer:
    writer.write(1, {"loss": jnp.float32(0.5), "train/pass_rate": np.float64(0.25),
                     "tokens": np.int64(7)})
    # Flushed per write: readable before the writer is closed.
    assert _lines(os.path.join(workdir, "metrics.jsonl")) == [
        {"step": 1, "loss": 0.5, "train/pass_rate": 0.25, "tokens": 7}]
    writer.write(2, {metrics.VAL_KEY: 0.75})
  assert _lines(os.path.join(workdir, "metrics.jsonl"))[1] == {"step": 2, "val/mean_at_k": 0.75}
  (events,) = _read_events(os.path.join(workdir, "tb"))
  assert _scalars(events) == [(1, "loss", 0.5), (1, "train/pass_rate", 0.25), (1, "tokens", 7.0),
                              (2, "val/mean_at_k", 0.75)]


def test_writer_rejects_reserved_and_non_scalar(tmp_path):
  writer = metrics.MetricWriter(str(tmp_path), is_primary=True)
  with pytest.raises(ValueError, match="'step' is reserved"):
    writer.write(1, {"step": 3})
  with pytest.raises(ValueError, match=r"shape \(2,\) is not a scalar"):
    writer.write(1, {"loss": np.zeros(2)})
  writer.close()


def test_non_primary_writes_nothing(tmp_path):
  workdir = str(tmp_path / "run")
  writer = metrics.MetricWriter(workdir, is_primary=False)
  writer.write(1, {"loss": 1.0})
  writer.truncate_after(0)
  writer.close()
  assert not os.path.exists(workdir)


def test_truncate_after_drops_later_steps_and_purges_tensorboard(tmp_path):
  workdir = str(tmp_path)
  path = os.path.join(workdir, "metrics.jsonl")
  writer = metrics.MetricWriter(workdir, is_primary=True)
  for step in (1, 2, 3):
    writer.write(step, {"loss": float(step)})
  writer.write(2, {metrics.VAL_KEY: 0.5})  # A validation line of step 2, written after 3.
  writer.close()
  with open(path, "a") as f:
    f.write('{"step": 4, "lo')  # A line cut off by a kill.

  resumed = metrics.MetricWriter(workdir, is_primary=True)
  resumed.truncate_after(2)
  assert [(r["step"], sorted(r)) for r in _lines(path)] == [
      (1, ["loss", "step"]), (2, ["loss", "step"]), (2, ["step", "val/mean_at_k"])]
  assert not [f for f in os.listdir(workdir) if f.endswith(".tmp")]
  resumed.write(3, {"loss": 30.0})
  resumed.close()
  assert [r["step"] for r in _lines(path)] == [1, 2, 2, 3]
  assert _lines(path)[-1]["loss"] == 30.0

  first, second = _read_events(os.path.join(workdir, "tb"))
  assert [s for s, _, _ in _scalars(first)] == [1, 2, 3, 2]
  # The resumed file opens with TensorBoard's purge marker at step 3.
  assert any(e.step == 3 and e.session_log.status == event_pb2.SessionLog.START for e in second)
  assert _scalars(second) == [(3, "loss", 30.0)]


def test_truncate_after_rejects_corrupt_middle_line(tmp_path):
  path = tmp_path / "metrics.jsonl"
  path.write_text('{"step": 1}\nnot json\n{"step": 2}\n')
  with pytest.raises(ValueError, match=r"metrics.jsonl:2: not a metrics line"):
    metrics.MetricWriter(str(tmp_path), is_primary=True).truncate_after(1)
  assert path.read_text() == '{"step": 1}\nnot json\n{"step": 2}\n'


def test_check_finite_names_step_and_keys():
  metrics.check_finite({"loss": 1.0, "count": 3, "v": jnp.ones(2)}, step=5)
  with pytest.raises(FloatingPointError,
                     match=r"step 7: non-finite metrics: loss=nan, grad_norm=inf$"):
    metrics.check_finite({"loss": float("nan"), "ok": 1.0, "grad_norm": jnp.float32(np.inf)},
                         step=7)


def test_matmul_params_hand_count_and_num_params():
  assert metrics.matmul_params(_CFG) == 124
  # Tied, no biases/qk-norm (tiny_cpu): the head is the embedding, so the
  # matmul parameters are exactly the parameters minus the norm scales.
  tied = ModelConfig.from_config(scalerl.get_config("variant=tiny_cpu").model)
  norms = tied.num_layers * 2 * tied.embed_dim + tied.embed_dim
  assert metrics.matmul_params(tied) == tied.num_params() - norms
  # Untied: the embedding table takes part in no matmul.
  untied = ModelConfig(**{**tied.__dict__, "tie_embeddings": False})
  embedding = untied.vocab_size * untied.embed_dim
  assert metrics.matmul_params(untied) == untied.num_params() - norms - embedding


def test_forward_flops_hand_worked():
  # One token attending to 3 keys: 248 + 16 * 3.
  assert metrics.forward_flops_per_token(_CFG, 3) == 296
  # Three tokens from scratch attend to 1 + 2 + 3 = 6 keys: 3 * 248 + 16 * 6.
  assert metrics.forward_flops(_CFG, 3) == 840
  # Two tokens after 2 cached ones attend to 3 + 4 keys: 2 * 248 + 16 * 7.
  assert metrics.forward_flops(_CFG, 2, past=2) == 608
  assert metrics.forward_flops(_CFG, 0, past=5) == 0


def test_generation_flops_hand_worked():
  # Sequence 1: prompt 2, 3 sampled -> tokens at positions 0..3 go through the
  #   model: prefill 2 * 248 + 16 * (1 + 2) = 544, decode 2 * 248 + 16 * (3 + 4) = 608.
  # Sequence 2: prompt 1, 1 sampled -> only the prompt: 248 + 16 * 1 = 264.
  assert metrics.generation_flops(_CFG, [2], [3]) == 544 + 608
  assert metrics.generation_flops(_CFG, np.array([2, 1]), np.array([3, 1])) == 1152 + 264
  with pytest.raises(ValueError, match="2 prompt lengths but 1 completion"):
    metrics.generation_flops(_CFG, [2, 1], [3])


def test_generation_counted_as_it_happens_adds_up_to_generation_flops():
  # Prompt 2, then 3 tokens decoded in calls of 1 and 2 (lengths 2 -> 3 -> 5):
  #   prefill: positions 0, 1 -> 2 * 248 + 16 * (1 + 2) = 544;
  #   first call: the first token's predecessor is the prompt's (prefilled): 0;
  #   second call: tokens at positions 3, 4 feed back positions 2, 3 with 3 and
  #   4 keys -> 2 * 248 + 16 * (3 + 4) = 608.
  assert metrics.prefill_flops(_CFG, [2]) == 544
  assert metrics.decode_flops(_CFG, [2], [2], [3]) == 0
  assert metrics.decode_flops(_CFG, [2], [3], [5]) == 608
  assert 544 + 0 + 608 == metrics.generation_flops(_CFG, [2], [3])
  # Any split of the decoding into calls sums to the same, row by row.
  rng = np.random.RandomState(0)
  prompts, lengths = rng.randint(1, 9, 16), rng.randint(0, 30, 16)
  total = metrics.prefill_flops(_CFG, prompts)
  at = prompts.copy()
  while (at < prompts + lengths).any():
    nxt = np.minimum(at + rng.randint(0, 5, 16), prompts + lengths)
    total += metrics.decode_flops(_CFG, prompts, at, nxt)
    at = nxt
  assert total == metrics.generation_flops(_CFG, prompts, lengths)
  with pytest.raises(ValueError):
    metrics.decode_flops(_CFG, [2, 1], [2], [3])


def test_train_flops_hand_worked():
  # 3 x (5 * 248 + 16 * (1 + 2 + 3 + 4 + 5)) = 3 * (1240 + 240).
  assert metrics.train_flops(_CFG, [5]) == 4440
  assert metrics.train_flops(_CFG, [5, 1]) == 4440 + 3 * (248 + 16)


def test_compute_meter_accumulates_and_resumes():
  meter = metrics.ComputeMeter()
  meter.add(flops=100, wall_seconds=2.0, num_devices=4)
  meter.add(flops=50, wall_seconds=0.5)
  ticks = iter([10.0, 13.0])
  with meter.timed(num_devices=2, flops=25, clock=lambda: next(ticks)):
    pass
  # 8 + 0.5 + 3 * 2 device-seconds.
  assert meter.scalars() == {"compute/flops": 175.0, "compute/device_seconds": 14.5}
  state = json.loads(json.dumps(meter.state_dict()))
  resumed = metrics.ComputeMeter()
  resumed.load_state_dict(state)
  resumed.add(flops=1, wall_seconds=1.0)
  assert resumed.scalars() == {"compute/flops": 176.0, "compute/device_seconds": 15.5}


def test_compute_meter_rejects_bad_input():
  meter = metrics.ComputeMeter()
  with pytest.raises(ValueError, match="num_devices >= 1"):
    meter.add(flops=1, wall_seconds=1.0, num_devices=0)
  with pytest.raises(ValueError, match="keys"):
    meter.load_state_dict({"flops": 1})
  with pytest.raises(ValueError, match=r"device_seconds=-1.0 is not a non-negative"):
    meter.load_state_dict({"flops": 1, "device_seconds": -1.0})


class _Tty(io.StringIO):
  """A text stream that says it is a terminal."""

  def isatty(self):
    return True


def test_progress_plain_lines_are_throttled():
  now = [0.0]
  stream = io.StringIO()
  progress = metrics.Progress(total_steps=10, start_step=2, every_s=5.0, stream=stream,
                              clock=lambda: now[0])
  now[0] = 4.0
  progress.update(4, pass_rate=0.4251)  # First update prints: 2 steps in 4 s.
  now[0] = 6.0
  progress.update(5, pass_rate=0.5)  # 2 s after the last line: silent.
  now[0] = 16.0
  progress.update(10, pass_rate=np.float32(0.75))  # Last step always prints.
  assert stream.getvalue().splitlines() == [
      "step 4/10 | 0.5 steps/s | ETA 0:00:12 | pass_rate 0.4251",
      "step 10/10 | 0.5 steps/s | ETA 0:00:00 | pass_rate 0.75",
  ]


def test_progress_redraws_in_place_on_a_tty():
  now = [0.0]
  stream = _Tty()
  progress = metrics.Progress(total_steps=100, stream=stream, clock=lambda: now[0])
  progress.update(0)
  now[0] = 3600.0
  progress.update(50, loss=float("nan"))
  progress.close()
  first = "step 0/100"
  second = "step 50/100 | 0.0139 steps/s | ETA 1:00:00 | loss nan"
  assert stream.getvalue() == "\r" + first + "\r" + second + "\n"
