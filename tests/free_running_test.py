"""buffer.sync_mode='free': the generator on a host thread of its own, never
waiting for the trainer; weights swapped in between decode calls as they
arrive (docs/design/disaggregated.md, "Free-running generation").

The runs on two simulated devices (one a role) are in a subprocess
(tests/scripts/free_running_runs.py): the device count is fixed when JAX
starts.
"""

import json
import os

import pytest

from scalerl_jax import config as config_lib
from tests import helpers
from tests.scripts.free_running_runs import MOVE_FAILS_AT

K = 2  # helpers.rl_test_config's buffer.max_off_policy.
STEPS = 6


@pytest.mark.parametrize(
    "fields, field",
    [
        ({"buffer__sync_mode": "async"}, "buffer.sync_mode"),
        ({"mesh__layout": "colocated"}, "buffer.sync_mode"),
        ({"buffer__schedule": "ppo_off_policy"}, "buffer.sync_mode"),
        ({"buffer__sync_at_decode_step": 16}, "buffer.sync_mode"),
    ],
)
def test_a_free_running_generator_needs_its_own_devices(fields, field):
  with pytest.raises(config_lib.ConfigError, match=f"^{field}:"):
    config_lib.validate(
        helpers.disaggregated_config(**{"buffer__sync_mode": "free", **fields})
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  return helpers.two_device_runs(
      "tests.scripts.free_running_runs",
      str(tmp_path_factory.mktemp("free_running")),
  )


def _metrics(runs, name):
  with open(os.path.join(runs["dir"], name, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


@pytest.mark.slow(seconds=240)  # Five runs on two devices.
@pytest.mark.parametrize("name", ["free", "free_split"])
def test_every_token_lags_the_trainer_by_k_at_most(runs, name):
  """Every group trained: each token tagged with the version that sampled
  it, none newer than the trainer's and none more than k older."""
  run = runs[name]
  assert run["error"] is None and run["done"], run["error"]
  assert run["threads"] == []  # The generator's and the clocks' stopped.
  assert {b["step"] for b in run["batches"]} == set(range(STEPS))
  for batch in run["batches"]:
    assert batch["untagged"] == 0, batch
    assert 0 <= batch["min"] <= batch["max"] <= batch["step"], batch
    assert batch["step"] - batch["min"] <= K, batch
  rows = [r for r in _metrics(runs, name) if "train/loss" in r]
  assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
  for r in rows:
    assert r["staleness/max"] <= K and r["staleness/over_k"] == 0, r
    assert r["buffer/evicted_stale"] == 0, r


@pytest.mark.slow(seconds=240)
def test_swaps_come_between_calls_at_decode_steps_that_vary(runs):
  """Each new version swapped in once it arrived, at most once, in order;
  the decode steps after its batch's take at which it came follow the
  generator's timing (slowed at odd versions), not a fixed step (else it
  would be the fixed mode)."""
  run = runs["free"]
  versions = [version for version, _, _, _ in run["swaps"]]
  assert versions == sorted(set(versions)) and versions[0] >= 1
  assert len({since for _, _, since, _ in run["swaps"]}) > 1, run["swaps"]
  rows = [r for r in _metrics(runs, "free") if "train/loss" in r]
  swapped = [r for r in rows if r["generator/swaps"]]
  assert sum(r["generator/swaps"] for r in rows) <= len(versions)
  assert {r["generator/swap_decode_step"] for r in swapped} <= {
      since for _, _, since, _ in run["swaps"]
  }
  # Slowed, the generator had sequences in flight when new weights came:
  # they continued with them, so completions of several versions.
  assert any(in_flight for _, _, _, in_flight in run["swaps"]), run["swaps"]
  assert any(r["staleness/mixed_version_frac"] > 0 for r in rows)


@pytest.mark.slow(seconds=240)
def test_a_generator_failure_stops_the_run_naming_it(runs):
  run = runs["generator_fails"]
  assert run["error"]["type"] == "GeneratorError"
  assert run["error"]["message"].startswith("generator: its host thread")
  assert "injected harvest" in run["error"]["message"]
  assert not run["done"]
  assert run["threads"] == []  # No thread of ours outlives the run.


@pytest.mark.slow(seconds=240)
def test_a_trainer_failure_stops_the_generator(runs):
  run = runs["trainer_fails"]
  assert run["error"]["message"] == "injected train step"
  assert any(n.startswith("trainer:") for n in run["error"]["notes"])
  assert not run["done"]
  assert run["threads"] == []


@pytest.mark.slow(seconds=240)
def test_a_swap_takes_every_leaf_of_one_version(runs):
  """Each move put the leaves one at a time, 200 ms apart halfway, and the
  move of version 4 failed halfway; the generator decoded on meanwhile.
  Every tree the sampler regrouped equals one version's parameters in
  every leaf, every decode call's tokens are tagged with the version its
  weights are, and the half-moved version was never regrouped nor decoded
  with; the run stopped naming the trainer's step
  (tests/scripts/move_hooks.py)."""
  run = runs["move_split"]
  assert sum(run["halfway"]) > 0, run["halfway"]  # Decoded mid-move.
  assert run["prepares"] and all(run["prepares"]), run["prepares"]
  assert run["dispatches"]
  for tag, versions in run["dispatches"]:
    assert tag in versions, (tag, versions)
  regrouped = {v for versions in run["prepares"] for v in versions}
  assert regrouped <= set(range(MOVE_FAILS_AT)) and len(regrouped) > 1
  assert all(version < MOVE_FAILS_AT for version, *_ in run["swaps"])
  assert run["error"]["message"] == "injected failure halfway through a move"
  assert f"trainer: step {MOVE_FAILS_AT - 1} failed" in " ".join(
      run["error"]["notes"]
  )
  assert not run["done"] and run["threads"] == []
