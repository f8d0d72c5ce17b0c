"""mesh.layout='disaggregated': the generator on devices of its own, the
weights swapped in at a fixed decode step (docs/design/disaggregated.md).

The runs on two simulated devices (one a role) are in a subprocess
(tests/scripts/disaggregated_runs.py): the device count is fixed when JAX
starts.
"""

import json
import os
import shutil

import jax
import numpy as np
import pytest

from scalerl_jax import config as config_lib
from scalerl_jax import sharding
from scalerl_jax import trainer as trainer_lib
from scalerl_jax.metrics import busy
from scalerl_jax.models import model_config
from scalerl_jax.models import transformer
from scalerl_jax.rl import schedules
from scalerl_jax.rl import weight_sync
from tests import helpers
from tests.scripts import retire_runs

K = 2  # helpers.rl_test_config's buffer.max_off_policy.


@pytest.mark.parametrize(
    "fields, num_devices, field",
    [
        ({"mesh__layout": "split"}, None, "mesh.layout"),
        ({"mesh__generator_devices": 4}, 4, "mesh.generator_devices"),
        ({"mesh__generator_devices": -1}, None, "mesh.generator_devices"),
        ({"mesh__distributed": True}, None, "mesh.layout"),
        ({"mesh__shape": (1, 2, 1)}, 6, "mesh.shape"),
        (
            {
                "buffer__schedule": "ppo_off_policy",
                "buffer__sync_at_decode_step": 16,
            },
            None,
            "buffer.sync_at_decode_step",
        ),
        (
            {"buffer__sync_at_decode_step": -1},
            None,
            "buffer.sync_at_decode_step",
        ),
        ({"mesh__transfer_dtype": "float16"}, None, "mesh.transfer_dtype"),
        # The sampler computes in float32: a bfloat16 copy would change it.
        ({"mesh__transfer_dtype": "bfloat16"}, None, "mesh.transfer_dtype"),
        (
            {"mesh__layout": "colocated", "mesh__transfer_dtype": "bfloat16"},
            None,
            "mesh.transfer_dtype",
        ),
    ],
)
def test_a_bad_layout_is_refused_naming_the_field(fields, num_devices, field):
  with pytest.raises(config_lib.ConfigError, match=f"^{field}:"):
    config_lib.validate(
        helpers.disaggregated_config(**fields), num_devices=num_devices
    )


def test_sync_at_a_decode_step_needs_the_disaggregated_layout():
  config = helpers.rl_test_config("pipeline_rl")
  config.buffer.sync_at_decode_step = 16
  with pytest.raises(
      config_lib.ConfigError, match="^buffer.sync_at_decode_step: 16 needs"
  ):
    config_lib.validate(config)


def test_each_role_lays_the_mesh_over_its_own_devices():
  config = helpers.disaggregated_config(mesh__generator_devices=2)
  config_lib.validate(config, num_devices=6)  # (1, 4, 1) and (1, 2, 1).
  devices = list(range(6))
  assert sharding.role_devices(config.mesh, devices) == ([0, 1, 2, 3], [4, 5])
  config.mesh.generator_devices = 0  # Half.
  assert sharding.role_device_counts(config.mesh, 6) == (3, 3)
  config.mesh.layout = "colocated"
  assert sharding.role_devices(config.mesh, devices) == (devices, devices)


def test_weights_behind_take_room_from_the_backlog():
  schedule = schedules.make(helpers.rl_test_config("pipeline_rl"))  # P = 4
  # (k + 1 - behind) x P - backlog: 12 - 5, then 8 - 5.
  assert schedule.max_starts(3, backlog=5) == 7
  assert schedule.max_starts(3, backlog=5, weights_behind=1) == 3
  assert schedule.max_starts(3, backlog=9, weights_behind=1) == 0


def _metrics(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """The script's runs, and the colocated run of the same config."""
  result = helpers.two_device_runs(
      "tests.scripts.disaggregated_runs",
      str(tmp_path_factory.mktemp("disaggregated")),
  )
  result["colocated"] = helpers.pipeline_rl_run_dir()
  return result


def _params(path):
  with np.load(path) as f:
    return [f[f"arr_{i}"] for i in range(len(f.files))]


@pytest.mark.slow(seconds=240)  # Four disaggregated runs on two devices.
def test_the_roles_hold_disjoint_devices(runs):
  assert runs["trainer_devices"] == [0]
  assert runs["generator_devices"] == [1]


def _param_counts():
  """(every parameter, the float32 ones of a bfloat16 transfer: the norm
  scales and the embedding, which is the tied FP32 head) of the runs'
  model, from its shapes."""
  cfg = model_config.ModelConfig.from_config(helpers.rl_test_config().model)
  assert cfg.tie_embeddings and cfg.fp32_lm_head
  shapes = jax.eval_shape(
      lambda: helpers.init_params(transformer.Transformer(cfg))
  )
  total, kept = 0, 0
  for path, x in jax.tree_util.tree_flatten_with_path(shapes)[0]:
    total += x.size
    name = jax.tree_util.keystr(path)
    kept += x.size * ("norm" in name or name == "['embedding']")
  return total, kept


def _without_sync(rows):
  """Rows without the transfer's bytes, which colocated runs lack."""
  return [
      {k: v for k, v in r.items() if k != weight_sync.BYTES_KEY} for r in rows
  ]


@pytest.mark.slow(seconds=240)
def test_swapped_before_the_first_step_it_is_the_colocated_run(runs, tmp_path):
  """Same tokens, versions, rewards, losses and validation: every metric
  but wall time and the transfer's bytes, and the final parameters bit for
  bit. Every step moved the float32 weights once: 4 bytes a parameter on
  the generator's one device."""
  colocated = str(tmp_path / "colocated")  # A Trainer opens it.
  shutil.copytree(runs["colocated"], colocated)
  sync0 = helpers.metrics_without_times(os.path.join(runs["dir"], "sync0"))
  assert _without_sync(sync0) == helpers.metrics_without_times(colocated)
  total, _ = _param_counts()
  assert [r.get(weight_sync.BYTES_KEY) for r in sync0] == [None] + [
      4.0 * total
  ] * (len(sync0) - 1)
  config = helpers.rl_test_config("pipeline_rl", num_steps=4)
  trainer = trainer_lib.Trainer(config, colocated)
  try:
    want = jax.tree.leaves(jax.device_get(trainer.state.params))
  finally:
    trainer.close()
  for a, b in zip(want, _params(runs["params"]["sync0"]), strict=True):
    np.testing.assert_array_equal(a, b)


@pytest.mark.slow(seconds=240)
def test_decoding_ahead_keeps_every_lag_within_k(runs):
  """Swapped in after one decode call under the previous weights: tokens
  of older versions reach the batches, never more than k behind."""
  sync0 = helpers.metrics_without_times(os.path.join(runs["dir"], "sync0"))
  ahead = helpers.metrics_without_times(os.path.join(runs["dir"], "ahead"))
  # Step 0's validation and step 0's batch precede any decoding ahead, which
  # then decodes during step 0's train step: more tokens by step 1's line.
  assert ahead[0] == sync0[0]
  assert ahead[1]["train/loss"] == sync0[1]["train/loss"]
  assert (
      ahead[1]["counters/tokens_generated"]
      > sync0[1]["counters/tokens_generated"]
  )
  for row in ahead[1:]:
    assert row["staleness/max"] <= K and row["staleness/over_k"] == 0, row
    assert row["buffer/evicted_stale"] == 0, row
  # The decoding ahead changed what later batches hold.
  losses = lambda rows: [r["train/loss"] for r in rows[2:]]
  assert losses(ahead) != losses(sync0)


@pytest.mark.slow(seconds=240)
def test_decoding_ahead_resumes_bit_identically(runs):
  """2 steps, a checkpoint (slots decoded ahead, decoded_ahead), 2 more:
  the straight run's metrics and parameters."""
  straight = os.path.join(runs["dir"], "ahead")
  split = os.path.join(runs["dir"], "ahead_split")
  assert helpers.metrics_without_times(split) == (
      helpers.metrics_without_times(straight)
  )
  for a, b in zip(
      _params(runs["params"]["ahead"]),
      _params(runs["params"]["ahead_split"]),
      strict=True,
  ):
    np.testing.assert_array_equal(a, b)


@pytest.mark.slow(seconds=240)
def test_weights_sent_in_bfloat16_sample_what_float32_ones_do(runs):
  """model.compute_dtype='bfloat16': sent cast (mesh.transfer_dtype), the
  sampler's regroup holds the same values, so every token, log-prob, reward,
  loss and validation score is the float32 transfer's; the bytes halve but
  for the float32 norm scales and FP32 head (the tied embedding)."""
  sent = {
      dtype: helpers.metrics_without_times(
          os.path.join(runs["dir"], f"bf16_{dtype}")
      )
      for dtype in weight_sync.TRANSFER_DTYPES
  }
  assert _without_sync(sent["bfloat16"]) == _without_sync(sent["float32"])
  total, kept = _param_counts()
  # 394,496 bytes, then 4 x 24,896 + 2 x 73,728 = 247,040.
  want = {"float32": 4 * total, "bfloat16": 4 * kept + 2 * (total - kept)}
  for dtype, rows in sent.items():
    got = [r.get(weight_sync.BYTES_KEY) for r in rows]
    assert got == [None] + [float(want[dtype])] * (len(rows) - 1), dtype


@pytest.mark.slow(seconds=240)
@pytest.mark.parametrize("run", ["colocated", "sync0", "ahead"])
def test_each_role_reports_its_busy_and_idle_time(runs, run):
  """Every step line: each role's busy and idle seconds over the same wall
  time (generate + train), its idle fraction in [0, 1]; both roles worked."""
  path = runs[run] if run == "colocated" else os.path.join(runs["dir"], run)
  rows = [r for r in _metrics(path) if "train/loss" in r]
  assert rows
  for r in rows:
    walls = []
    for role in busy.ROLES:
      busy_s, idle_s = r[f"time/{role}_busy_s"], r[f"time/{role}_idle_s"]
      assert busy_s > 0 and idle_s >= 0, r
      assert r[f"time/{role}_idle_frac"] == pytest.approx(
          idle_s / (busy_s + idle_s)
      )
      walls.append(busy_s + idle_s)
    assert walls[0] == pytest.approx(walls[1]), r  # One step's wall time.
    assert (weight_sync.SECONDS_KEY in r) == (run != "colocated")


@pytest.mark.slow(seconds=300)
def test_a_run_whose_pool_is_retired_stops_with_its_steps_counted(tmp_path):
  """Every prompt retired (No-Positive-Resampling) a few steps in, colocated
  and disaggregated with decoding ahead: the run stops early and writes
  DONE, and the checkpoint it stops with holds exactly the steps it wrote
  (the train state's count, the last metrics line and the checkpoint's step
  agree). Here the pool runs out in a step's own generation; where it runs
  out in the decoding ahead instead, `Trainer.train` counts the dispatched
  step first (`retired_ahead`), a branch this pool does not reach."""
  out = json.loads(
      helpers.run_on_devices(
          "tests.scripts.retire_runs",
          2,
          helpers.rl_base_dir(),
          str(tmp_path),
          timeout=1200,
      )
      .strip()
      .splitlines()[-1]
  )
  for name, run in out.items():
    last = run["metric_steps"][-1]
    assert run["done"], name
    assert run["curriculum"]["prompts_retired"] == 4, name
    assert 0 < last < retire_runs.NUM_STEPS, name  # It stopped early.
    assert run["metric_steps"] == list(range(last + 1)), name
    assert run["restored_step"] == run["state_step"] == last, name
