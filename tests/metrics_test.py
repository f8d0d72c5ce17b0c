"""Tests of scalerl_jax.metrics.writer: metrics.jsonl and
TensorBoard writers."""

import glob
import json
import os
import struct
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest
from tensorboardX.proto import event_pb2

from scalerl_jax.metrics import writer as metrics_writer


def _read_events(tb_dir):
  """Every Event in the TFRecord files of `tb_dir`,
  file by file in name order."""
  files = []
  for path in sorted(glob.glob(os.path.join(tb_dir, "events.out.tfevents.*"))):
    events = []
    with open(path, "rb") as f:
      data = f.read()
    pos = 0
    while pos < len(data):
      (length,) = struct.unpack("<Q", data[pos : pos + 8])
      pos += 12  # length + its CRC
      events.append(event_pb2.Event.FromString(data[pos : pos + length]))
      pos += length + 4  # payload + its CRC
    files.append(events)
  return files


def _scalars(events):
  return [
      (e.step, v.tag, round(v.simple_value, 5))
      for e in events
      for v in e.summary.value
  ]


def _lines(path):
  with open(path) as f:
    return [json.loads(line) for line in f]


def test_writer_jsonl_and_tensorboard(tmp_path):
  workdir = str(tmp_path / "run")
  with metrics_writer.MetricWriter(workdir, is_primary=True) as writer:
    writer.write(
        1,
        {
            "loss": jnp.float32(0.5),
            "train/pass_rate": np.float64(0.25),
            "tokens": np.int64(7),
        },
    )
    # Flushed per write: readable before the writer is closed.
    assert _lines(os.path.join(workdir, "metrics.jsonl")) == [
        {"step": 1, "loss": 0.5, "train/pass_rate": 0.25, "tokens": 7}
    ]
    writer.write(2, {"val/mean_at_k": 0.75})
  assert _lines(os.path.join(workdir, "metrics.jsonl"))[1] == {
      "step": 2,
      "val/mean_at_k": 0.75,
  }
  (events,) = _read_events(os.path.join(workdir, "tb"))
  assert _scalars(events) == [
      (1, "loss", 0.5),
      (1, "train/pass_rate", 0.25),
      (1, "tokens", 7.0),
      (2, "val/mean_at_k", 0.75),
  ]


def test_a_run_process_writes_tensorboard_without_importing_torch(tmp_path):
  # tensorboardX imports torch (installed by the hf extras) only to accept
  # torch tensors, 2.4 s of every run's start; the writer hides it for that
  # import. A fresh process, as a run is, where nothing imported torch first.
  workdir = str(tmp_path / "run")
  script = (
      "import sys\n"
      "from scalerl_jax import trainer\n"
      "from scalerl_jax.metrics import writer\n"
      "assert 'torch' not in sys.modules, 'imported torch'\n"
      f"with writer.MetricWriter({workdir!r}, is_primary=True) as w:\n"
      "  w.write(3, {'loss': 0.5})\n"
      "import torch\n"  # Importable again afterwards.
      "print(torch.ones(2).sum().item())\n"
  )
  out = subprocess.run(
      [sys.executable, "-c", script],
      capture_output=True,
      text=True,
      timeout=120,
      check=False,
  )
  assert out.returncode == 0, out.stderr[-2000:]
  assert out.stdout.split()[-1] == "2.0"
  (events,) = _read_events(os.path.join(workdir, "tb"))
  assert _scalars(events) == [(3, "loss", 0.5)]


def test_writer_rejects_reserved_and_non_scalar(tmp_path):
  writer = metrics_writer.MetricWriter(str(tmp_path), is_primary=True)
  with pytest.raises(ValueError, match="'step' is reserved"):
    writer.write(1, {"step": 3})
  with pytest.raises(ValueError, match=r"shape \(2,\) is not a scalar"):
    writer.write(1, {"loss": np.zeros(2)})
  writer.close()


def test_non_primary_writes_nothing(tmp_path):
  workdir = str(tmp_path / "run")
  writer = metrics_writer.MetricWriter(workdir, is_primary=False)
  writer.write(1, {"loss": 1.0})
  writer.truncate_after(0)
  writer.close()
  assert not os.path.exists(workdir)


def test_truncate_after_drops_later_steps_and_purges_tensorboard(tmp_path):
  workdir = str(tmp_path)
  path = os.path.join(workdir, "metrics.jsonl")
  writer = metrics_writer.MetricWriter(workdir, is_primary=True)
  for step in (1, 2, 3):
    writer.write(step, {"loss": float(step)})
  # A validation line of step 2, written after 3.
  writer.write(2, {"val/mean_at_k": 0.5})
  writer.close()
  with open(path, "a") as f:
    f.write('{"step": 4, "lo')  # A line cut off by a kill.

  resumed = metrics_writer.MetricWriter(workdir, is_primary=True)
  resumed.truncate_after(2)
  assert [(r["step"], sorted(r)) for r in _lines(path)] == [
      (1, ["loss", "step"]),
      (2, ["loss", "step"]),
      (2, ["step", "val/mean_at_k"]),
  ]
  assert not [f for f in os.listdir(workdir) if f.endswith(".tmp")]
  resumed.write(3, {"loss": 30.0})
  resumed.close()
  assert [r["step"] for r in _lines(path)] == [1, 2, 2, 3]
  assert _lines(path)[-1]["loss"] == 30.0

  first, second = _read_events(os.path.join(workdir, "tb"))
  assert [s for s, _, _ in _scalars(first)] == [1, 2, 3, 2]
  # The resumed file opens with TensorBoard's purge marker at step 3.
  assert any(
      e.step == 3 and e.session_log.status == event_pb2.SessionLog.START
      for e in second
  )
  assert _scalars(second) == [(3, "loss", 30.0)]


def test_truncate_after_rejects_corrupt_middle_line(tmp_path):
  path = tmp_path / "metrics.jsonl"
  path.write_text('{"step": 1}\nnot json\n{"step": 2}\n')
  with pytest.raises(ValueError, match=r"metrics.jsonl:2: not a metrics line"):
    metrics_writer.MetricWriter(str(tmp_path), is_primary=True).truncate_after(
        1
    )
  assert path.read_text() == '{"step": 1}\nnot json\n{"step": 2}\n'
