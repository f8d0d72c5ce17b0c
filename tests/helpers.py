"""Small configs for tests, made from the real `configs/scalerl.py`, jitted
parameter init, workdirs built once per test session (the RL tests' base),
and a multi-device runner."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Any, Callable

import filelock
import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest

from configs import scalerl
from scalerl_jax import experiment
from scalerl_jax import trainer as trainer_lib
from scalerl_jax import workdir as workdir_lib
from scalerl_jax.metrics import compute
from scalerl_jax.rewards.sandbox import isolation
from tests import session_env


def tiny_config(**model_overrides):
  """The tiny_cpu config with a smaller model (2 layers, width 64)."""
  config = scalerl.get_config("variant=tiny_cpu")
  model = dict(
      vocab_size=128,
      embed_dim=64,
      num_layers=2,
      num_heads=4,
      num_kv_heads=2,
      head_dim=16,
      mlp_dim=128,
      max_seq_len=256,
  )
  model.update(model_overrides)
  with config.unlocked():
    config.model.update(model)
  return config


def rl_test_config(schedule="pipeline_rl", num_steps=4):
  """A whole RL experiment small enough for a test:
  2-layer model, 4 x 4 rollouts."""
  config = tiny_config(vocab_size=384, max_seq_len=128)
  s, d, t = config.sampling, config.data, config.trainer
  s.max_prompt_len, s.max_new_tokens, s.decode_steps_per_call = 16, 48, 16
  d.prompts_per_step, d.generations_per_prompt = 4, 4
  # Level 1 only (231 training problems): the warm start reaches ~10% there.
  d.builtin_difficulty, d.builtin_num_train, d.builtin_num_val = (1,), 231, 12
  t.warm_start_steps, t.warm_start_lr, t.warm_start_batch = 300, 3e-3, 32
  t.num_steps, t.eval_every, t.eval_num_prompts, t.eval_samples = (
      num_steps,
      2,
      12,
      4,
  )
  t.checkpoint_every = 2
  config.optim.learning_rate, config.optim.warmup_steps = 1e-4, 0
  config.buffer.schedule, config.buffer.max_off_policy = schedule, 2
  config.rewards.num_workers, config.rewards.timeout_s = 1, 5.0
  return config


def disaggregated_config(**fields):
  """`rl_test_config("pipeline_rl")` with mesh.layout='disaggregated' and
  `fields`, each named `<group>__<field>` (`mesh__generator_devices=1`)."""
  config = rl_test_config("pipeline_rl")
  config.mesh.layout = "disaggregated"
  for name, value in fields.items():
    group, field = name.split("__")
    config[group][field] = value
  return config


def init_params(model: nn.Module, seed: int = 0) -> Any:
  """`model`'s unboxed parameters, initialised on a [1, 1] token batch under
  jit: run eagerly, every operation of the init (the layers' scan included)
  compiles and runs on its own, several seconds a model on 2 cores."""
  tokens = jnp.zeros((1, 1), jnp.int32)
  return nn.unbox(jax.jit(model.init)(jax.random.key(seed), tokens))["params"]


def built_once(name: str, build: Callable[[str], None]) -> str:
  """`<session_env.SHARED_DIR_ENV>/<name>`, made by `build(path)` the first
  time any test, pytest-xdist worker or pytest session sharing that directory
  asks for it; a file lock makes the others wait for it. Whole or not at all:
  built aside, then renamed into place. Tests read it or copy it, never write
  to it."""
  root = os.environ[session_env.SHARED_DIR_ENV]
  path = os.path.join(root, name)
  with filelock.FileLock(path + ".lock"):
    if not os.path.isdir(path):
      building = tempfile.mkdtemp(prefix=f"{name}_", dir=root)
      build(building)
      os.rename(building, path)
  return path


def rl_base_dir() -> str:
  """A workdir holding `rl_test_config()`'s tokenizer and warm-started base
  policy (`base_policy/`), as `Experiment.build` leaves it: warm-started once
  (`built_once`) where each test module used to warm-start its own. Tests
  copy it into their workdirs, and the trainer finds and reuses it there."""
  return built_once(
      "rl_test_base",
      lambda path: experiment.Experiment.build(rl_test_config(), path),
  )


def copy_rl_base(workdir: str) -> str:
  """`workdir` (new, or empty), a copy of `rl_base_dir()`."""
  shutil.copytree(rl_base_dir(), workdir, dirs_exist_ok=True)
  return workdir


def _pipeline_rl_run_in(workdir: str) -> None:
  copy_rl_base(workdir)
  config = rl_test_config("pipeline_rl", num_steps=4)
  last = trainer_lib.train_and_evaluate(config, workdir)
  with open(os.path.join(workdir, "last.json"), "w") as f:
    json.dump(last, f, default=float)


def pipeline_rl_run_dir() -> str:
  """A workdir where `rl_test_config("pipeline_rl", num_steps=4)` ran, with
  its final metrics in last.json: run once a session (`built_once`) for the
  tests that read it (tests/trainer_test.py, tests/disaggregated_test.py).
  Read it or copy it, never write to it."""
  return built_once("trainer_test_e2e_run", _pipeline_rl_run_in)


def run_on_devices(
    module: str, num_devices: int, *args: str, timeout: float = 600
) -> str:
  """`python -m <module> <args>` with `num_devices` simulated CPU devices
  (fixed when JAX starts, hence the separate process); its stdout. Fails the
  test, with the end of its stderr, if it fails."""
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env = dict(
      os.environ,
      XLA_FLAGS=session_env.xla_flags(
          f"--xla_force_host_platform_device_count={num_devices}"
      ),
      JAX_PLATFORMS="cpu",
      PYTHONPATH=root,
  )
  out = subprocess.run(
      [sys.executable, "-m", module, *args],
      cwd=root,
      env=env,
      capture_output=True,
      text=True,
      timeout=timeout,
  )
  assert out.returncode == 0, out.stderr[-4000:]
  return out.stdout


def two_device_runs(module: str, out_dir: str) -> dict:
  """`python -m <module> <rl_base_dir()> <out_dir>` on 2 simulated devices
  (one a role of mesh.layout='disaggregated'): the JSON of its last stdout
  line, with "dir": `out_dir`, where its runs are."""
  stdout = run_on_devices(module, 2, rl_base_dir(), out_dir, timeout=1200)
  result = json.loads(stdout.strip().splitlines()[-1])
  result["dir"] = out_dir
  return result


def run_on_8_devices(module: str) -> dict:
  """Runs `python -m <module>` with 8 simulated CPU devices;
  its JSON rows by shape.

  The script prints one JSON object per line with a "shape" key. It runs
  once a test session (`built_once`: sharding_test's tests are in both of
  CI's sessions), its output kept in the shared directory.
  """

  def run(path: str) -> None:
    stdout = run_on_devices(module, 8)
    with open(os.path.join(path, "stdout.txt"), "w") as f:
      f.write(stdout)

  with open(
      os.path.join(built_once(f"8_devices_{module}", run), "stdout.txt")
  ) as f:
    rows = [json.loads(line) for line in f if line.startswith("{")]
  return {tuple(r["shape"]): r for r in rows}


class StatsDevice:
  """A JAX device as far as allocator statistics go: `memory_stats()` returns
  `stats` (a dict, or None as on a CPU)."""

  def __init__(self, stats):
    self.stats = stats

  def memory_stats(self):
    return self.stats


def needs_bwrap():
  """Skips the current test, saying why, where bubblewrap does not run here.

  tests/conftest.py calls it for each test marked `needs_bwrap`, before the
  test's fixtures start a reward pool or a sandbox. Fails it instead under
  SCALERL_REQUIRE_BWRAP=1 (.ci/run sets it), so that no sandbox test skips
  silently in CI.
  """
  works, why = isolation.bwrap_works()
  if works:
    return
  if os.environ.get("SCALERL_REQUIRE_BWRAP") == "1":
    pytest.fail(f"SCALERL_REQUIRE_BWRAP=1 and bubblewrap does not run: {why}")
  pytest.skip(f"bubblewrap does not run here: {why}")


def metrics_without_times(workdir: str) -> list[dict]:
  """A run's metrics.jsonl rows without the wall-clock measurements (time/*
  and the device-seconds meter), which no two runs share."""
  with open(os.path.join(workdir, workdir_lib.METRICS_FILE)) as f:
    rows = [json.loads(line) for line in f]
  return [
      {
          k: v
          for k, v in r.items()
          if not k.startswith("time/") and k != compute.DEVICE_SECONDS_KEY
      }
      for r in rows
  ]
