"""Torn and corrupted checkpoints: a restart never loads damaged arrays.

Each test writes real orbax checkpoints with `Checkpointer`, damages the files
of one step on disk (truncation, flipped bytes, a lost or an extra file, a
lost manifest) and reopens the directory as a restarted run would.
"""

import logging
import os
import pathlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scalerl_jax.checkpoint import checkpointer


def _state(scale):
  """A small state whose every value depends on `scale`."""
  key = jax.random.key(3)
  return {
      "params": {
          "w": jnp.arange(4096.0).reshape(64, 64) * scale,
          "b": jnp.full((64,), scale, jnp.bfloat16),
      },
      "step": jnp.int32(scale),
      "rng": key,
  }


def _abstract(state):
  return jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
      state,
  )


def _save_steps(directory, steps):
  with checkpointer.Checkpointer(str(directory)) as ckpt:
    for step in steps:
      assert ckpt.save(
          step,
          _state(step),
          extra={"step": step},
          host_state={"tokens": [np.arange(step + 3, dtype=np.int32)]},
      )


def _largest_file(step_dir):
  """Relative name of the step's largest file: the ocdbt chunk holding `w`."""
  files = [p for p in pathlib.Path(step_dir).rglob("*") if p.is_file()]
  return (
      max(files, key=lambda p: p.stat().st_size)
      .relative_to(step_dir)
      .as_posix()
  )


def _truncate(path):
  data = path.read_bytes()
  path.write_bytes(data[: len(data) // 2])


def _flip(path):
  """Inverts 8 bytes in the middle: the size stays, the contents change."""
  data = bytearray(path.read_bytes())
  mid = len(data) // 2
  data[mid : mid + 8] = bytes(b ^ 0xFF for b in data[mid : mid + 8])
  path.write_bytes(bytes(data))


def _assert_state(got, scale):
  want = _state(scale)
  np.testing.assert_array_equal(got["params"]["w"], want["params"]["w"])
  np.testing.assert_array_equal(got["params"]["b"], want["params"]["b"])
  assert int(got["step"]) == scale


@pytest.mark.parametrize(
    "damage, expected",
    [
        (_truncate, r"holds \d+ bytes where \d+ were saved"),
        (_flip, r"differs from the bytes saved \(sha256 mismatch\)"),
    ],
)
@pytest.mark.parametrize("target", ["largest", "extra/metadata"])
def test_damaged_latest_falls_back_then_is_set_aside(
    tmp_path, caplog, damage, expected, target
):
  _save_steps(tmp_path, [10, 20])
  name = _largest_file(tmp_path / "20") if target == "largest" else target
  damage(tmp_path / "20" / name)
  damaged_bytes = (tmp_path / "20" / name).read_bytes()

  caplog.set_level(logging.WARNING)
  with checkpointer.Checkpointer(str(tmp_path)) as ckpt:
    assert ckpt.all_steps() == [10, 20]  # Complete, but not intact.
    assert ckpt.latest_step() == 10
    assert f"{tmp_path / '20'} is damaged and skipped" in caplog.text
    assert (
        name in caplog.text
        and "The newest intact one is step 10" in caplog.text
    )
    restored = ckpt.restore(None, _abstract(_state(1)))
    _assert_state(restored.state, 10)
    assert restored.extra == {"step": 10}
    with pytest.raises(checkpointer.DamagedCheckpointError) as err:
      ckpt.restore(20, _abstract(_state(1)))
    message = str(err.value)
    assert (
        f"{tmp_path / '20'} cannot be restored, nothing was loaded" in message
    )
    assert name in message and "Intact checkpoints: [10]" in message
    assert re.search(expected, message)

    # The resumed run reaches step 20 again: the damaged copy moves aside,
    # byte for byte, and the new one is saved and restorable.
    assert ckpt.save(20, _state(21), extra={"step": 21})
    ckpt.wait()
    assert ckpt.latest_step() == 20 and ckpt.all_steps() == [10, 20]
    _assert_state(ckpt.restore(20, _abstract(_state(1))).state, 21)
  assert sorted(os.listdir(tmp_path)) == ["10", "20", "20.damaged"]
  assert (tmp_path / "20.damaged" / name).read_bytes() == damaged_bytes


def test_save_of_an_earlier_step_sets_aside_all_damaged_later_ones(tmp_path):
  # A run resumed from step 10 and stopped early at 15 (forced save): orbax
  # would skip any step up to a newer directory, so both damaged ones go.
  _save_steps(tmp_path, [10, 20, 30])
  _flip(tmp_path / "20" / _largest_file(tmp_path / "20"))
  (tmp_path / "30" / "integrity.json").unlink()
  (tmp_path / "20.damaged").mkdir()  # Left by an earlier fallback.
  with checkpointer.Checkpointer(str(tmp_path)) as ckpt:
    assert ckpt.latest_step() == 10
    assert ckpt.save(15, _state(15), force=True)
    ckpt.wait()
    assert ckpt.all_steps() == [10, 15] and ckpt.latest_step() == 15
  assert sorted(os.listdir(tmp_path)) == [
      "10",
      "15",
      "20.damaged",
      "20.damaged-2",
      "30.damaged",
  ]


def test_step_without_manifest_is_incomplete(tmp_path):
  # A step directory without its manifest: the save never sealed it.
  _save_steps(tmp_path, [10, 20])
  (tmp_path / "20" / "integrity.json").unlink()
  with checkpointer.Checkpointer(str(tmp_path)) as ckpt:
    assert ckpt.all_steps() == [10] and ckpt.latest_step() == 10
    with pytest.raises(
        checkpointer.DamagedCheckpointError,
        match=r"has no integrity\.json: its save did not finish",
    ):
      ckpt.restore(20, _abstract(_state(1)))


def test_missing_unexpected_and_unreadable_manifest_are_named(tmp_path):
  _save_steps(tmp_path, [10, 20, 30])
  (tmp_path / "10" / "extra" / "metadata").unlink()
  (tmp_path / "10" / "state" / "stray").write_bytes(b"x")
  manifest = tmp_path / "20" / "integrity.json"
  manifest.write_bytes(manifest.read_bytes()[:100])
  with checkpointer.Checkpointer(str(tmp_path)) as ckpt:
    assert ckpt.latest_step() == 30
    with pytest.raises(checkpointer.DamagedCheckpointError) as err:
      ckpt.restore(10, _abstract(_state(1)))
    assert (
        "extra/metadata is missing; state/stray was not written by the save"
        in str(err.value)
    )
    assert "Intact checkpoints: [30]" in str(err.value)
    with pytest.raises(
        checkpointer.DamagedCheckpointError,
        match=r"its integrity\.json is unreadable \(JSONDecodeError",
    ):
      ckpt.restore(20, _abstract(_state(1)))


def test_no_intact_checkpoint_stops_with_the_damage_of_each(tmp_path):
  _save_steps(tmp_path, [10, 20])
  _truncate(tmp_path / "10" / _largest_file(tmp_path / "10"))
  _flip(tmp_path / "20" / _largest_file(tmp_path / "20"))
  with checkpointer.Checkpointer(str(tmp_path)) as ckpt:
    assert ckpt.all_steps() == [10, 20]
    for attempt in (
        ckpt.latest_step,
        lambda: ckpt.restore(None, _abstract(_state(1))),
    ):
      with pytest.raises(checkpointer.DamagedCheckpointError) as err:
        attempt()
      message = str(err.value)
      assert "no checkpoint can be restored, nothing was loaded" in message
      assert "step 20: " in message and "sha256 mismatch" in message
      assert "step 10: " in message and "were saved" in message
      assert f"move them out of {tmp_path} to start the run afresh" in message
  assert sorted(os.listdir(tmp_path)) == ["10", "20"]  # Reading moved nothing.
