"""Training monitors on synthetic metric streams, and
stop-on-alert in a tiny run."""

import json
import os

import pytest

from configs import scalerl
from scalerl_jax import trainer as trainer_lib
from scalerl_jax import workdir as workdir_lib
from scalerl_jax.checkpoint import checkpointer as checkpoint_lib
from scalerl_jax.metrics import monitors
from tests import helpers


def _monitors(**fields):
  config = scalerl.get_config()
  config.monitor.update(fields)
  return monitors.Monitors.from_config(config)


def _healthy(step):
  """A train row that no default check objects to."""
  return {
      "train/loss_tokens": 100.0,
      "train/entropy": 0.8,
      "train/truncation_rate": 0.05,
      "train/train_gen_logp_abs_diff": 0.01,
      "train/ratio_max": 1.5,
      "staleness/over_k": 0.0,
      "buffer/evicted_stale": 0.0,
      "train/reward_mean": 0.25 + 0.01 * (step % 3),
  }


def _fired(mon, rows, first_step=1):
  """(step, check name) of every alert over a stream of rows."""
  return [
      (a.step, a.name)
      for step, row in enumerate(rows, first_step)
      for a in mon.check(step, row)
  ]


def test_a_healthy_stream_raises_nothing_and_every_check_reports_zero():
  mon = _monitors()
  rows = [{"val/mean_at_k": 0.3}] + [_healthy(s) for s in range(1, 40)]
  assert _fired(mon, rows, first_step=0) == []
  # The default config enables every registered check, and each reports 0.
  assert mon.scalars([]) == {f"alert/{n}": 0.0 for n in monitors.CHECKS.names()}
  assert monitors.CHECKS.names() == (
      "entropy_collapse",
      "truncation",
      "logp_mismatch",
      "is_ratio",
      "reward_stuck",
      "val_drop",
      "staleness",
  )


def test_a_lag_above_k_or_an_eviction_is_a_staleness_fault():
  mon = _monitors()
  rows = [
      {
          **_healthy(s),
          "buffer/evicted_stale": e,
          "staleness/over_k": o,
          "staleness/max": 9.0 if o else 8.0,
      }
      for s, (e, o) in enumerate(
          [(0, 0), (0, 12), (0, 0), (2, 0), (2, 0), (3, 0)]
      )
  ]
  alerts = [a for s, r in enumerate(rows, 1) for a in mon.check(s, r)]
  # Step 2 trained 12 tokens lagging 9 > k = 8; steps 4 and 6 evicted groups.
  assert [(a.step, a.name) for a in alerts] == [
      (2, "staleness"),
      (4, "staleness"),
      (6, "staleness"),
  ]
  assert alerts[0].message.startswith(
      "staleness/over_k 12: tokens trained with a lag above "
      "k (buffer.max_off_policy; staleness/max 9)"
  )
  assert alerts[1].message.startswith("buffer/evicted_stale rose by 2")


def test_entropy_collapse_is_relative_to_the_first_step():
  mon = _monitors(entropy_min_fraction=0.1)
  entropies = [1.0, 0.5, 0.11, 0.1, 0.09, 0.5]
  rows = [{**_healthy(s), "train/entropy": e} for s, e in enumerate(entropies)]
  # Every group zero-variance: no loss token, but the entropy covers every
  # generated token (rl/train_step.py), so this step still sets the reference.
  rows[0]["train/loss_tokens"] = 0.0
  # 0.1 x the first value 1.0 = 0.1: only 0.09 is below it.
  assert _fired(mon, rows) == [(5, "entropy_collapse")]


def test_truncation_above_20_percent_alerts_with_the_field_named():
  mon = _monitors()
  rows = [
      {**_healthy(s), "train/truncation_rate": t}
      for s, t in enumerate([0.1, 0.2, 0.25])
  ]
  alerts = [a for s, r in enumerate(rows, 1) for a in mon.check(s, r)]
  assert [(a.step, a.name) for a in alerts] == [(3, "truncation")]
  assert alerts[0].message.startswith(
      "train/truncation_rate 0.25 > monitor.truncation_rate_max 0.2"
  )
  assert mon.scalars(alerts) == {**mon.scalars([]), "alert/truncation": 1.0}


def test_train_gen_mismatch_and_is_ratio_max_alert():
  mon = _monitors(logp_diff_max=0.5, ratio_max=10.0)
  rows = [
      # At the limit: quiet.
      {**_healthy(1), "train/train_gen_logp_abs_diff": 0.5},
      {**_healthy(2), "train/train_gen_logp_abs_diff": 0.7},
      {**_healthy(3), "train/ratio_max": 12.0},
      # TIS on.
      {**_healthy(4), "train/ratio_max": 1.0, "train/tis_ratio_max": 11.0},
      # No loss token: the step's statistics are empty, whatever they read.
      {
          **_healthy(5),
          "train/loss_tokens": 0.0,
          "train/ratio_max": 50.0,
          "train/train_gen_logp_abs_diff": 9.0,
      },
  ]
  assert _fired(mon, rows) == [
      (2, "logp_mismatch"),
      (3, "is_ratio"),
      (4, "is_ratio"),
  ]


@pytest.mark.parametrize("incorrect,correct", [(0.0, 1.0), (-1.0, 1.0)])
def test_reward_all_failed_or_all_passed_for_n_steps(incorrect, correct):
  config = scalerl.get_config()
  config.monitor.reward_stuck_steps = 3
  config.rl.reward_incorrect, config.rl.reward_correct = incorrect, correct
  mon = monitors.Monitors.from_config(config)
  mixed = (incorrect + correct) / 2
  rewards = [
      incorrect,
      incorrect,
      mixed,
      incorrect,
      incorrect,
      incorrect,
      incorrect,
      correct,
      correct,
      correct,
      mixed,
  ]
  rows = [
      {**_healthy(s), "train/reward_mean": r} for s, r in enumerate(rewards)
  ]
  # The first streak of 2 is broken; the second reaches 3 at step 6 and goes
  # on firing at step 7; all-passed reaches 3 at step 10.
  assert _fired(mon, rows) == [
      (6, "reward_stuck"),
      (7, "reward_stuck"),
      (10, "reward_stuck"),
  ]


def test_validation_falling_below_its_best_alerts():
  mon = _monitors(val_drop_max=0.15)
  rows = [
      {"val/mean_at_k": 0.3},
      _healthy(1),
      {**_healthy(2), "val/mean_at_k": 0.5},
      {**_healthy(3), "val/mean_at_k": 0.36},
      {**_healthy(4), "val/mean_at_k": 0.34},
      {**_healthy(5), "val/mean_at_k": 0.6},
  ]
  # Best 0.5: 0.36 is 0.14 below it (quiet), 0.34 is 0.16 below (alert).
  assert _fired(mon, rows, first_step=0) == [(4, "val_drop")]


def test_a_zero_threshold_turns_a_check_off():
  mon = _monitors(truncation_rate_max=0.0, reward_stuck_steps=0)
  assert set(mon.checks) == set(monitors.CHECKS.names()) - {
      "truncation",
      "reward_stuck",
  }
  row = {**_healthy(1), "train/truncation_rate": 1.0}
  assert mon.check(1, row) == [] and "alert/truncation" not in mon.scalars([])


def test_state_survives_a_checkpoint_round_trip():
  rows = (
      [{"val/mean_at_k": 0.5}]
      + [
          {
              **_healthy(s),
              "train/reward_mean": 0.0,
              "train/entropy": 1.0 - 0.1 * s,
          }
          for s in range(1, 12)
      ]
      + [{**_healthy(12), "val/mean_at_k": 0.3}]
  )
  # A running count: rises at 3, then at 9.
  for i, row in enumerate(rows[1:], 1):
    row["buffer/evicted_stale"] = float((i >= 3) + (i >= 9))
  straight = _fired(_monitors(reward_stuck_steps=4), rows, first_step=0)
  first = _monitors(reward_stuck_steps=4)
  head = _fired(first, rows[:5], first_step=0)
  resumed = _monitors(reward_stuck_steps=4)
  resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
  tail = _fired(resumed, rows[5:], first_step=5)
  assert head + tail == straight
  assert {name for _, name in straight} == {
      "reward_stuck",
      "entropy_collapse",
      "val_drop",
      "staleness",
  }


def test_stop_on_alert_checkpoints_the_step_and_stops(tmp_path):
  config = helpers.rl_test_config("pipeline_rl", num_steps=4)
  # An untrained policy: no warm start, so nearly every completion runs to the
  # 48-token budget and the truncation check fires at step 1.
  config.trainer.warm_start_steps = 0
  config.trainer.checkpoint_every = 4
  config.trainer.eval_num_prompts = 4
  config.monitor.truncation_rate_max = 0.5
  config.monitor.stop_on_alert = True
  workdir = str(tmp_path)
  with pytest.raises(
      monitors.AlertStop,
      match=r"^step 1: monitor.stop_on_alert: " r"train/truncation_rate",
  ):
    trainer_lib.train_and_evaluate(config, workdir)
  assert os.listdir(os.path.join(workdir, "checkpoints")) == ["1"]
  assert not workdir_lib.is_finished(workdir)
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  assert [r["step"] for r in rows] == [0, 1]
  assert (
      rows[1]["alert/truncation"] == 1.0 and rows[0]["alert/truncation"] == 0.0
  )
  with checkpoint_lib.Checkpointer(
      os.path.join(workdir, "checkpoints")
  ) as saved:
    assert saved.latest_step() == 1  # Complete and intact.
