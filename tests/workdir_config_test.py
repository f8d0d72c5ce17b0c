"""Tests of scalerl_jax.workdir's recorded config: the config a run records,
and changed resumes."""

import json
import os

from absl import logging as absl_logging
import pytest

from configs import scalerl
from scalerl_jax import config as config_lib
from scalerl_jax import workdir as workdir_lib


def test_recorded_config_reads_back_equal_and_locked(tmp_path):
  config = scalerl.get_config()
  config.data.prompts_per_step = 4
  assert workdir_lib.record_config(config, str(tmp_path)) == []
  with open(tmp_path / workdir_lib.CONFIG_FILE) as f:
    assert json.load(f)["data"]["prompts_per_step"] == 4
  loaded = workdir_lib.load_config(str(tmp_path))
  # Tuples come back as tuples (mesh.shape, logical_axis_rules), not JSON lists.
  assert loaded.to_dict() == config.to_dict()
  assert loaded.mesh.shape == (1, -1, 1)
  with pytest.raises(AttributeError):
    loaded.data.not_a_field = 1  # Locked like a config built from a file.


def test_a_process_reads_the_record_with_its_own_process_id(tmp_path):
  config = scalerl.get_config()
  config.mesh.process_id = 0  # Process 0 writes the record.
  workdir_lib.record_config(config, str(tmp_path))
  assert workdir_lib.load_config(str(tmp_path)).mesh.process_id == 0
  assert (
      workdir_lib.load_config(str(tmp_path), process_id=3).mesh.process_id == 3
  )


def test_differences_name_each_field_with_both_values():
  old, new = scalerl.get_config(), scalerl.get_config()
  new.data.prompts_per_step = 4
  new.rl.loss = "dapo"
  new.data.builtin_difficulty = (1,)
  assert workdir_lib.config_differences(old, new) == [
      f"data.builtin_difficulty: {old.data.builtin_difficulty!r} -> (1,)",
      f"data.prompts_per_step: {old.data.prompts_per_step} -> 4",
      "rl.loss: 'cispo' -> 'dapo'",
  ]
  assert workdir_lib.config_differences(old, scalerl.get_config()) == []


def test_a_changed_resume_warns_naming_the_field_and_records_the_new_config(
    tmp_path, monkeypatch
):
  first = scalerl.get_config()
  workdir_lib.record_config(first, str(tmp_path))
  warnings = []
  monkeypatch.setattr(
      absl_logging, "warning", lambda msg, *args: warnings.append(msg % args)
  )
  resumed = scalerl.get_config()
  resumed.trainer.num_steps = first.trainer.num_steps + 10
  changed = workdir_lib.record_config(resumed, str(tmp_path))
  expected = f"trainer.num_steps: {first.trainer.num_steps} -> {first.trainer.num_steps + 10}"
  assert changed == [expected]
  (warning,) = warnings
  assert (
      expected in warning
      and "differs from the recorded one in 1 fields" in warning
  )
  assert (
      workdir_lib.load_config(str(tmp_path)).trainer.num_steps
      == resumed.trainer.num_steps
  )
  assert (
      workdir_lib.record_config(resumed, str(tmp_path)) == []
      and len(warnings) == 1
  )


def test_a_workdir_without_a_record_is_named(tmp_path):
  with pytest.raises(
      FileNotFoundError, match=f"{tmp_path}/config.json: no recorded config"
  ):
    workdir_lib.load_config(str(tmp_path))
  assert not os.path.exists(tmp_path / workdir_lib.CONFIG_FILE)


def test_a_record_that_predates_fields_is_read_with_todays_defaults(
    tmp_path, monkeypatch
):
  config = scalerl.get_config("variant=tiny_cpu")
  config.data.prompts_per_step = 4
  config.buffer.sync_mode = "fixed"
  workdir_lib.record_config(config, str(tmp_path))
  path = tmp_path / workdir_lib.CONFIG_FILE
  recorded = json.loads(path.read_text())
  # A run recorded before two fields (and a whole section's field) existed.
  del recorded["buffer"]["sync_mode"], recorded["mesh"]["transfer_dtype"]
  path.write_text(json.dumps(recorded))
  with pytest.raises(config_lib.ConfigError, match="missing config field"):
    config_lib.validate(workdir_lib.load_config(str(tmp_path)))
  warnings = []
  monkeypatch.setattr(
      absl_logging, "warning", lambda msg, *args: warnings.append(msg % args)
  )
  loaded = workdir_lib.load_config(str(tmp_path), defaults=scalerl.get_config)
  config_lib.validate(loaded)
  (warning,) = warnings
  assert "records no buffer.sync_mode, mesh.transfer_dtype" in warning
  default = scalerl.get_config("variant=tiny_cpu")
  assert loaded.buffer.sync_mode == default.buffer.sync_mode
  assert loaded.mesh.transfer_dtype == default.mesh.transfer_dtype
  # What the run recorded stays as recorded.
  assert loaded.data.prompts_per_step == 4
  assert loaded.variant == "tiny_cpu"
  # A complete record warns of nothing.
  workdir_lib.record_config(config, str(tmp_path / "complete"))
  workdir_lib.load_config(
      str(tmp_path / "complete"), defaults=scalerl.get_config
  )
  assert len(warnings) == 1
