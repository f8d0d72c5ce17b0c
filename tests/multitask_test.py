"""End-to-end runs on a mixture of the arithmetic and code domains:
metrics, exact resume.

The code domain's completions are scored by the sandbox in the reward pool,
so these runs exercise the code verifier inside the RL loop.
"""

import json
import os
import shutil

import jax
import ml_collections
import numpy as np
import pytest

from scalerl_jax import experiment
from scalerl_jax import trainer as trainer_lib
from tests import helpers


def _config(num_steps):
  config = helpers.rl_test_config("pipeline_rl", num_steps=num_steps)
  config.sampling.max_prompt_len, config.sampling.max_new_tokens = 32, 64
  config.trainer.warm_start_steps = 150
  with config.unlocked():
    config.data.mixture = ml_collections.ConfigDict(
        {
            "math": {
                "weight": 0.5,
                "source": "builtin",
                "builtin_difficulty": (1,),
                "builtin_num_train": 231,
                "builtin_num_val": 6,
            },
            "code": {
                "weight": 0.5,
                "source": "builtin_code",
                "builtin_difficulty": (1, 2),
                "builtin_num_train": 200,
                "builtin_num_val": 6,
                "retire_threshold": 0.5,
            },
        }
    )
  return config


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory):
  path = tmp_path_factory.mktemp("base")
  experiment.Experiment.build(_config(4), str(path))
  return path


def _run(base_dir, tmp_path, name, steps):
  workdir = tmp_path / name
  if not workdir.exists():
    shutil.copytree(base_dir, workdir)
  for n in steps:
    trainer_lib.train_and_evaluate(_config(n), str(workdir))
  with open(workdir / "metrics.jsonl") as f:
    return str(workdir), [json.loads(line) for line in f]


@pytest.mark.slow(seconds=55)  # A whole run, resumed.
@pytest.mark.needs_bwrap
def test_two_source_run_logs_each_domain_and_resumes_bit_identically(
    base_dir, tmp_path
):
  straight, rows = _run(base_dir, tmp_path, "straight", [4])
  split, split_rows = _run(base_dir, tmp_path, "split", [2, 4])
  for r in rows[1:]:
    # P = 4, weights 0.5 / 0.5.
    assert r["train/math/count"] == r["train/code/count"] == 2
    for domain in ("math", "code"):
      assert 0 <= r[f"train/{domain}/reward_mean"] <= 1
      assert r[f"train/{domain}/mean_length"] > 0
  for r in (rows[0], rows[2], rows[4]):
    assert r["val/math/num_prompts"] == r["val/code/num_prompts"] == 6
    assert r["val/mean_at_k"] == pytest.approx(
        (r["val/math/mean_at_k"] + r["val/code/mean_at_k"]) / 2
    )
  assert rows[-1]["curriculum/code/groups_seen"] > 0
  strip = lambda rs: [
      {
          k: v
          for k, v in r.items()
          if not k.startswith("time/") and k != "compute/device_seconds"
      }
      for r in rs
  ]
  assert strip(rows) == strip(split_rows)
  params = []
  for workdir in (straight, split):
    trainer = trainer_lib.Trainer(_config(4), workdir)
    try:
      params.append(jax.device_get(trainer.state.params))
      assert trainer.generation.curriculum.metrics() == {
          k: v
          for k, v in rows[-1].items()
          if k in trainer.generation.curriculum.metrics()
      }
    finally:
      trainer.close()
  for a, b in zip(*(jax.tree_util.tree_leaves(p) for p in params)):
    np.testing.assert_array_equal(a, b)
