"""Crafted Hugging Face checkpoints: each fails with an error naming the file.

Every case starts from a real tiny Llama checkpoint written by `transformers`
and replaces or edits one file: headers claiming gigabytes, unsupported
dtypes, non-finite weights, pickles where safetensors belong, and shard
indexes that point outside the directory.
"""

import builtins
import json
import os
import pickle
import shutil
import struct

import numpy as np
import pytest
from safetensors.numpy import load_file
from safetensors.numpy import save_file
import torch
import transformers

from scalerl_jax.models import hf_io


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory):
  torch.manual_seed(0)
  config = transformers.LlamaConfig(
      vocab_size=61,
      hidden_size=16,
      intermediate_size=24,
      num_hidden_layers=1,
      num_attention_heads=2,
      num_key_value_heads=1,
      max_position_embeddings=32,
  )
  path = tmp_path_factory.mktemp("hf") / "llama"
  transformers.LlamaForCausalLM(config).save_pretrained(str(path))
  return path


@pytest.fixture
def ckpt(base_dir, tmp_path):
  """A fresh copy of the tiny checkpoint to tamper with."""
  path = tmp_path / "ckpt"
  shutil.copytree(base_dir, path)
  hf_io.load_checkpoint(str(path))  # Loads cleanly before it is tampered with.
  return path


def _header(path):
  """(header dict, data bytes) of a safetensors file."""
  raw = path.read_bytes()
  (size,) = struct.unpack("<Q", raw[:8])
  return json.loads(raw[8 : 8 + size]), raw[8 + size :]


def _write_raw(path, header, data):
  """A safetensors file with exactly this header and data, unchecked."""
  encoded = json.dumps(header).encode()
  path.write_bytes(struct.pack("<Q", len(encoded)) + encoded + data)


class _Payload:
  """Unpickling it creates the marker file: proof that a pickle was loaded."""

  def __init__(self, marker):
    self.marker = marker

  def __reduce__(self):
    return builtins.open, (self.marker, "w")


def _plant_pickle(path, marker):
  path.write_bytes(pickle.dumps(_Payload(str(marker)), protocol=4))


def _error(path):
  with pytest.raises(hf_io.CheckpointError) as err:
    hf_io.load_checkpoint(str(path))
  return str(err.value)


def test_header_length_claiming_gigabytes(ckpt):
  st = ckpt / "model.safetensors"
  raw = bytearray(st.read_bytes())
  raw[:8] = struct.pack("<Q", 3 << 30)
  st.write_bytes(bytes(raw))
  message = _error(ckpt)
  assert message.startswith(
      f"{st}: its header claims 3221225472 bytes but the file holds "
      f"{len(raw)}"
  )


def test_data_offsets_beyond_the_file(ckpt):
  st = ckpt / "model.safetensors"
  header, data = _header(st)
  entry = header["model.layers.0.mlp.up_proj.weight"]
  begin = entry["data_offsets"][0]
  # 4 GiB of F32.
  entry.update(shape=[1 << 20, 1024], data_offsets=[begin, begin + (4 << 30)])
  _write_raw(st, header, data)
  message = _error(ckpt)
  assert message == (
      f"{st}: tensor model.layers.0.mlp.up_proj.weight: data_offsets "
      f"[{begin}, {begin + (4 << 30)}] reach past the {len(data)} data bytes the "
      "file holds (truncated, or a crafted header)"
  )


def test_data_offsets_that_disagree_with_the_shape(ckpt):
  st = ckpt / "model.safetensors"
  header, data = _header(st)
  header["model.norm.weight"]["shape"] = [17]  # 16 float32 values are stored.
  _write_raw(st, header, data)
  assert (
      "tensor model.norm.weight: F32 of shape [17] needs 68 bytes, its data_offsets span 64"
      in _error(ckpt)
  )


def test_uncovered_trailing_bytes_are_named_by_file(ckpt):
  # Our checks pass; the safetensors library's stricter ones fail, and the
  # error still names the file.
  st = ckpt / "model.safetensors"
  st.write_bytes(st.read_bytes() + b"\0" * 16)
  message = _error(ckpt)
  assert message.startswith(f"{st}: cannot be read as safetensors (")
  assert "not fully covered" in message


def test_integer_dtype_is_refused(ckpt):
  st = ckpt / "model.safetensors"
  tensors = load_file(str(st))
  tensors["model.norm.weight"] = np.ones(16, np.int8)
  save_file(tensors, str(st))
  assert _error(ckpt) == (
      f"{st}: tensor model.norm.weight has dtype 'I8'; supported: F16, BF16, F32, F64 "
      "(quantized or integer checkpoints cannot be loaded)"
  )


def test_unknown_dtype_string_is_refused(ckpt):
  st = ckpt / "model.safetensors"
  header, data = _header(st)
  header["model.norm.weight"]["dtype"] = "Q4_K"
  _write_raw(st, header, data)
  assert f"{st}: tensor model.norm.weight has dtype 'Q4_K'" in _error(ckpt)


def test_half_precision_loads(ckpt):
  st = ckpt / "model.safetensors"
  tensors = load_file(str(st))
  save_file({k: v.astype(np.float16) for k, v in tensors.items()}, str(st))
  _, params = hf_io.load_checkpoint(str(ckpt))
  np.testing.assert_array_equal(
      params["final_norm"]["scale"],
      tensors["model.norm.weight"].astype(np.float16),
  )


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_weights_are_refused(ckpt, bad):
  st = ckpt / "model.safetensors"
  tensors = load_file(str(st))
  tensors["model.layers.0.self_attn.k_proj.weight"][3, :2] = bad
  save_file(tensors, str(st))
  assert _error(ckpt) == (
      f"{st}: tensor model.layers.0.self_attn.k_proj.weight holds 2 NaN or Inf values "
      "(of 128); a policy with such weights computes NaN everywhere"
  )


def test_pytorch_bin_is_named_and_never_unpickled(ckpt, tmp_path):
  marker = tmp_path / "unpickled"
  os.remove(ckpt / "model.safetensors")
  _plant_pickle(ckpt / "pytorch_model.bin", marker)
  # Sorts first; the weights are named.
  _plant_pickle(ckpt / "optimizer.pt", marker)
  message = _error(ckpt)
  assert message.startswith(
      f"{ckpt / 'pytorch_model.bin'}: a pickled PyTorch checkpoint "
      "where safetensors is expected; it is not read"
  )
  assert "Convert it to safetensors" in message
  assert not marker.exists()
  # The payload is live.
  pickle.loads((ckpt / "pytorch_model.bin").read_bytes())
  assert marker.exists()


@pytest.mark.parametrize("writer", ["pickle", "torch.save"])
def test_pickle_named_model_safetensors_is_never_unpickled(
    ckpt, tmp_path, writer
):
  marker, st = tmp_path / "unpickled", ckpt / "model.safetensors"
  if writer == "pickle":
    _plant_pickle(st, marker)
  else:
    torch.save({"model.norm.weight": torch.ones(16)}, str(st))
  message = _error(ckpt)
  assert message.startswith(
      f"{st}: is a pickled PyTorch file, not safetensors; it is not read"
  )
  assert "Convert it to safetensors" in message and not marker.exists()


def _shard(ckpt, names):
  """Splits model.safetensors into two shards plus an
  index; returns its path."""
  tensors = load_file(str(ckpt / "model.safetensors"))
  os.remove(ckpt / "model.safetensors")
  first = sorted(tensors)[:3]
  save_file({k: tensors[k] for k in first}, str(ckpt / names[0]))
  save_file(
      {k: v for k, v in tensors.items() if k not in first}, str(ckpt / names[1])
  )
  index = ckpt / "model.safetensors.index.json"
  index.write_text(
      json.dumps(
          {
              "weight_map": {
                  k: names[0] if k in first else names[1] for k in tensors
              }
          }
      )
  )
  hf_io.load_checkpoint(str(ckpt))
  return index, first[0]


@pytest.mark.parametrize(
    "target", ["../outside.safetensors", "absolute", "sub/x.safetensors"]
)
def test_index_pointing_outside_the_directory(ckpt, tmp_path, target):
  index, moved = _shard(ckpt, ["a.safetensors", "b.safetensors"])
  # A valid shard really lies there: only its location is wrong.
  outside = tmp_path / "outside.safetensors"
  shutil.copy(ckpt / "a.safetensors", outside)
  (ckpt / "sub").mkdir()
  shutil.copy(ckpt / "a.safetensors", ckpt / "sub" / "x.safetensors")
  target = str(outside) if target == "absolute" else target
  weight_map = json.loads(index.read_text())["weight_map"]
  weight_map[moved] = target
  index.write_text(json.dumps({"weight_map": weight_map}))
  assert _error(ckpt) == (
      f"{index}: tensor {moved} maps to {target!r}, outside the checkpoint directory; "
      f"shards must be plain file names in {ckpt}"
  )


def test_index_pointing_at_a_pickle_shard(ckpt, tmp_path):
  marker = tmp_path / "unpickled"
  index, moved = _shard(ckpt, ["a.safetensors", "b.safetensors"])
  _plant_pickle(ckpt / "pytorch_model-00001-of-00002.bin", marker)
  weight_map = json.loads(index.read_text())["weight_map"]
  weight_map[moved] = "pytorch_model-00001-of-00002.bin"
  index.write_text(json.dumps({"weight_map": weight_map}))
  message = _error(ckpt)
  assert message.startswith(
      f"{index}: tensor {moved} maps to 'pytorch_model-00001-of-00002.bin',"
      " not a .safetensors file; pickled weights are never read"
  )
  assert not marker.exists()


def test_index_naming_a_shard_that_lacks_the_tensor(ckpt):
  index, moved = _shard(ckpt, ["a.safetensors", "b.safetensors"])
  weight_map = json.loads(index.read_text())["weight_map"]
  weight_map[moved] = "b.safetensors"
  index.write_text(json.dumps({"weight_map": weight_map}))
  assert (
      _error(ckpt)
      == f"{index}: maps tensor {moved} to {ckpt / 'b.safetensors'}, which lacks it"
  )


def test_symlinked_shards_of_the_hub_cache_load(ckpt, tmp_path):
  # The Hub cache links snapshot files to blobs outside the directory: only
  # the names in the index are confined, not where links lead.
  _shard(ckpt, ["a.safetensors", "b.safetensors"])
  (tmp_path / "blobs").mkdir()
  for name in ("a.safetensors", "b.safetensors"):
    os.replace(ckpt / name, tmp_path / "blobs" / name)
    os.symlink(tmp_path / "blobs" / name, ckpt / name)
  _, params = hf_io.load_checkpoint(str(ckpt))
  np.testing.assert_array_equal(
      params["final_norm"]["scale"],
      load_file(str(tmp_path / "blobs" / "b.safetensors"))["model.norm.weight"],
  )
