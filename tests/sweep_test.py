"""Tests of the ablation grids (configs/ablations/*.py), the sweep runner
and launch/sweep.py."""

import glob
import importlib.util
import os
import shlex
import subprocess
import sys

from absl import flags
import ml_collections
from ml_collections import config_flags
import pytest

from configs import scalerl
from scalerl_jax import config as config_lib
from scalerl_jax.jobs import sweep

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ABLATIONS = sorted(
    p
    for p in glob.glob(os.path.join(REPO, "configs", "ablations", "*.py"))
    if not p.endswith("__init__.py")
)
NAMES = [os.path.basename(p)[:-3] for p in ABLATIONS]


def _leaves(cfg, prefix=""):
  """Dotted field name -> value of every leaf of a ConfigDict."""
  out = {}
  for key, value in cfg.items():
    if isinstance(value, ml_collections.ConfigDict):
      out.update(_leaves(value, f"{prefix}{key}."))
    else:
      out[f"{prefix}{key}"] = value
  return out


def _module(path):
  spec = importlib.util.spec_from_file_location(
      os.path.basename(path)[:-3], path
  )
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_every_ablation_of_the_issue_has_a_file():
  assert set(NAMES) == {
      "loss_type",
      "off_policy",
      "aggregation",
      "adv_norm",
      "fp32_head",
      "zero_variance_filter",
      "no_positive_resampling",
      "batch_size",
      "generations_per_prompt",
      "generation_length",
      "model_size",
      "leave_one_out",
  }


@pytest.mark.parametrize("path", ABLATIONS, ids=NAMES)
def test_overrides_name_real_fields_and_validate(path):
  module = _module(path)
  assert "python -m launch.sweep --sweep=configs/ablations/" in module.__doc__
  base = module.get_config()
  fields = _leaves(base)
  points = module.get_sweep()
  assert len(points) >= 2 and len({p["name"] for p in points}) == len(points)
  for point in points:
    overrides = {k: v for k, v in point.items() if k != "name"}
    config = scalerl.get_config(
        f"variant={overrides.pop('variant', base.variant)}"
    )
    for key, value in overrides.items():
      assert key in fields, (point, key)
      assert type(value) is type(fields[key]), (point, key)  # pylint: disable=unidiomatic-typecheck
      *parents, leaf = key.split(".")
      node = config
      for part in parents:
        node = node[part]
      node[leaf] = value
    config_lib.validate(config)


def _parse_train_flags(argv):
  """The config launch/train.py would build from `argv`
  (its flags, no program)."""
  flag_values = flags.FlagValues()
  config_flags.DEFINE_config_file(
      "config",
      None,
      flag_values=flag_values,
      lock_config=True,
      sys_argv=["train"] + argv,
  )
  flags.DEFINE_string("workdir", None, "", flag_values=flag_values)
  flag_values(["train"] + argv)
  return flag_values.config, flag_values.workdir


@pytest.mark.parametrize("path", ABLATIONS, ids=NAMES)
def test_commands_rebuild_each_point_exactly(path, tmp_path, monkeypatch):
  points = sweep.load_sweep(path, scalerl.get_config)
  lines = sweep.write_commands(
      points, str(tmp_path / "sweep"), str(tmp_path / "commands.sh"), REPO
  )
  assert len(lines) == len(points)
  written = (tmp_path / "commands.sh").read_text().splitlines()
  assert written[0].startswith("#") and written[1:] == lines
  # The commands name configs/scalerl.py relative to the repository.
  monkeypatch.chdir(REPO)
  for point, line in zip(points, lines):
    argv = shlex.split(line)
    assert argv[:3] == ["python", "-m", "launch.train"]
    config, workdir = _parse_train_flags(argv[3:])
    assert workdir == str(tmp_path / "sweep" / point.name)
    assert (
        config.to_dict()
        == sweep.build_config(point, scalerl.get_config).to_dict()
    )


def test_values_survive_the_command_line(tmp_path, monkeypatch):
  point = sweep.Point(
      "odd",
      "tiny_cpu",
      {
          "data.builtin_difficulty": (2,),
          "model.hf_path": "/ckpt dir/it's here",
          "rl.zero_variance_filter": False,
          "optim.learning_rate": 3e-6,
          "rl.tis_cap": 2,
          "mesh.logical_axis_rules": (
              ("act_batch", ("data", "fsdp")),
              ("vocab", None),
          ),
      },
  )
  (line,) = sweep.write_commands(
      [point], str(tmp_path), str(tmp_path / "c.sh"), REPO
  )
  monkeypatch.chdir(REPO)
  config, _ = _parse_train_flags(shlex.split(line)[3:])
  assert (
      config.to_dict()
      == sweep.build_config(point, scalerl.get_config).to_dict()
  )


def test_model_size_points_pick_variants():
  points = sweep.load_sweep(
      os.path.join(REPO, "configs/ablations/model_size.py"), scalerl.get_config
  )
  assert [(p.name, p.variant, p.overrides) for p in points] == [
      ("tiny_cpu", "tiny_cpu", {}),
      ("small_cpu", "small_cpu", {}),
  ]
  line = shlex.join(sweep.train_command(points[1], "/w"))
  assert "--config=configs/scalerl.py:variant=small_cpu" in line


def test_leave_one_out_reverts_one_choice_per_point():
  base = _leaves(scalerl.get_config())
  points = sweep.load_sweep(
      os.path.join(REPO, "configs/ablations/leave_one_out.py"),
      scalerl.get_config,
  )
  assert points[0].overrides == {}
  for point in points[1:]:
    ((key, value),) = point.overrides.items()
    assert base[key] != value, point


def test_sweep_base_edits_reach_every_point(tmp_path):
  path = tmp_path / "short_runs.py"
  path.write_text(
      "from configs import scalerl\n"
      "def get_config(arg=None):\n"
      "  c = scalerl.get_config(arg)\n"
      "  c.trainer.num_steps = 7\n"
      "  return c\n"
      "def get_sweep(arg=None):\n"
      "  return [{'name': 'a', 'rl.loss': 'grpo'}, {'name': 'b'}]\n"
  )
  points = sweep.load_sweep(f"{path}:variant=small_cpu", scalerl.get_config)
  assert [p.overrides for p in points] == [
      {"trainer.num_steps": 7, "rl.loss": "grpo"},
      {"trainer.num_steps": 7},
  ]
  assert {p.variant for p in points} == {"small_cpu"}


@pytest.mark.parametrize(
    "points, match",
    [
        (
            "[{'name': 'a', 'rl.los': 'grpo'}]",
            r"point 'a': 'rl.los' is not a field",
        ),
        ("[{'name': 'a', 'rl.loss': 3}]", r"point 'a': rl.loss=3"),
        (
            "[{'name': 'a', 'rl.loss': 'ppo'}]",
            r"point 'a': rl.loss: 'ppo' is not one of",
        ),
        ("[{'name': 'a'}, {'name': 'a'}]", "unique 'name'"),
        ("[{'rl.loss': 'grpo'}]", "unique 'name'"),
        ("[{'name': 'a/b'}]", "unique 'name'"),
        ("[]", "no points"),
    ],
)
def test_bad_sweep_files_fail_with_file_point_and_field(
    tmp_path, points, match
):
  path = tmp_path / "bad.py"
  path.write_text(
      "from configs import scalerl\nget_config = scalerl.get_config\n"
      f"def get_sweep(arg=None):\n  return {points}\n"
  )
  with pytest.raises(ValueError, match=match) as info:
    sweep.load_sweep(str(path), scalerl.get_config)
  assert str(path) in str(info.value)


_FAKE_TRAINER = """
import pathlib, sys
workdir, mode = sys.argv[1:]
print("training", mode)
if mode == "ok":
  pathlib.Path(workdir, "DONE").touch()
sys.exit(3 if mode == "fail" else 0)
"""


def test_run_local_runs_resumes_and_reports_failures(tmp_path):
  points = [
      sweep.Point(name, "tiny_cpu", {})
      for name in ("ok", "fail", "no_done", "ok2")
  ]
  (tmp_path / "ok2").mkdir()
  (tmp_path / "ok2" / "DONE").touch()  # Finished by an earlier sweep.
  mode = {"ok": "ok", "fail": "fail", "no_done": "quiet", "ok2": "ok"}
  fake = lambda p, w: [sys.executable, "-c", _FAKE_TRAINER, w, mode[p.name]]
  outcomes = sweep.run_local(
      points, str(tmp_path), REPO, parallel=2, poll_s=0.05, command=fake
  )
  assert {n: (o.state, o.returncode) for n, o in outcomes.items()} == {
      "ok": ("finished", 0),
      "fail": ("failed", 3),
      "no_done": ("incomplete", 0),
      "ok2": ("skipped", None),
  }
  assert "training fail" in (tmp_path / "fail" / "log.txt").read_text()
  assert (
      outcomes["fail"].tail.endswith("training fail")
      and outcomes["ok"].tail == ""
  )
  assert not (tmp_path / "ok2" / "log.txt").exists()
  again = sweep.run_local(
      points, str(tmp_path), REPO, parallel=2, poll_s=0.05, command=fake
  )
  assert again["ok"].state == "skipped" and again["fail"].state == "failed"
  assert (tmp_path / "fail" / "log.txt").read_text().count("training fail") == 2


def test_sweep_launcher_writes_commands(tmp_path):
  proc = subprocess.run(
      [
          sys.executable,
          "-m",
          "launch.sweep",
          "--sweep=configs/ablations/loss_type.py",
          f"--workdir={tmp_path}",
          "--mode=commands",
      ],
      cwd=REPO,
      capture_output=True,
      text=True,
      timeout=120,
  )
  assert proc.returncode == 0, proc.stderr
  lines = proc.stdout.splitlines()
  assert [shlex.split(line)[-2:] for line in lines] == [
      [
          f"--config.rl.loss={loss}",
          f"--config.trainer.warm_start_dir={tmp_path}/base_policy",
      ]
      for loss in ("grpo", "dapo", "gspo", "cispo")
  ]
  assert (tmp_path / "commands.sh").read_text().splitlines()[1:] == lines


def test_sweep_launcher_names_a_bad_sweep_file(tmp_path):
  proc = subprocess.run(
      [
          sys.executable,
          "-m",
          "launch.sweep",
          "--sweep=configs/ablations/nope.py",
          f"--workdir={tmp_path}",
          "--mode=commands",
      ],
      cwd=REPO,
      capture_output=True,
      text=True,
      timeout=120,
  )
  assert proc.returncode != 0 and "nope.py: no such sweep file" in proc.stderr


def test_set_overrides_reach_every_point_and_are_validated():
  points = sweep.load_sweep(
      os.path.join(REPO, "configs/ablations/loss_type.py"), scalerl.get_config
  )
  extra = sweep.parse_overrides(
      [
          "trainer.eval_every=5",
          "data.builtin_difficulty=(1,)",
          "model.hf_path=/ckpt",
      ]
  )
  assert extra == {
      "trainer.eval_every": 5,
      "data.builtin_difficulty": (1,),
      "model.hf_path": "/ckpt",
  }
  for p in sweep.with_overrides(points, extra, scalerl.get_config):
    config = sweep.build_config(p, scalerl.get_config)
    assert config.trainer.eval_every == 5 and config.rl.loss == p.name
  with pytest.raises(ValueError, match="trainer.eval_every"):
    sweep.with_overrides(points, {"trainer.eval_every": 0}, scalerl.get_config)
  with pytest.raises(ValueError, match="expected field=value"):
    sweep.parse_overrides(["trainer.eval_every"])


def test_points_select_part_of_a_grid_by_name():
  points = sweep.load_sweep(
      os.path.join(REPO, "configs/ablations/off_policy.py"), scalerl.get_config
  )
  chosen = sweep.select(points, ["ppo_k8", "pipeline_k8"])
  # The grid's order.
  assert [p.name for p in chosen] == ["ppo_k8", "pipeline_k8"]
  assert sweep.select(points, []) == points
  with pytest.raises(
      ValueError, match="no point named 'pipeline_k9'; the grid has ppo_k4, "
  ):
    sweep.select(points, ["pipeline_k8", "pipeline_k9"])
