"""jobs.planner.step_estimate: program runs per RL step, worked by hand."""

import pytest

from configs import scalerl
from scalerl_jax.jobs.planner import program_estimates
from scalerl_jax.jobs.planner import step_estimate


def _tiny(**fields):
  config = scalerl.get_config("tiny_cpu")
  with config.unlocked():
    for dotted, value in fields.items():
      section, name = dotted.split("__")
      config[section][name] = value
  return config


def test_counts_of_the_default_tiny_run():
  # tiny_cpu: P = G = 16, so 256 rows a step; pipeline_rl keeps 2 x 256 =
  # 512 slots; completions at the full 96-token budget. A step decodes
  # 256 x 96 tokens over 512 busy slots: 48 decode steps, 3 calls of 16;
  # it fills 256 of the prefill's 512 slots: 0.5 prefills. Validation: 200
  # prompts, 256 rows / 16 samples = 16 prompts a batch, ceil(200 / 16) = 13
  # batches, each 1 prefill and 96 decode steps (1,248), every 10 steps.
  counts = step_estimate.step_counts(scalerl.get_config("tiny_cpu"))
  assert counts.completion_len == 96 and counts.num_slots == 512
  assert counts.decode_calls == 3
  assert counts.per_step == {
      "train_step": 1,
      "prepare": 1,
      "prefill": 0.5,
      "decode": 48,
  }
  assert counts.per_validation == {
      "prepare": 1,
      "val_prefill": 13,
      "val_decode": 1248,
  }
  assert counts.amortised() == pytest.approx(
      {
          "train_step": 1,
          "prepare": 1.1,
          "prefill": 0.5,
          "decode": 48,
          "val_prefill": 1.3,
          "val_decode": 124.8,
      }
  )
  # 60 steps; validations at steps 0, 10, ..., 60: 7.
  assert counts.validations == 7
  assert counts.whole_run() == pytest.approx(
      {
          "train_step": 60,
          "prepare": 67,
          "prefill": 30,
          "decode": 2880,
          "val_prefill": 91,
          "val_decode": 8736,
      }
  )


def test_counts_follow_the_schedule_and_the_config():
  # ppo_off_policy keeps P x G = 256 slots: 256 x 40 / 256 = 40 decode steps
  # (2.5 calls of 16) and one whole prefill a step; 4 microbatches are 4 runs
  # of the loop body the cost analysis counts. 64 validation rows / 16
  # samples = 4 prompts a batch: 50 batches of 1 prefill and 40 steps.
  # 60 steps, validation every 25: at 0, 25, 50 and the last step, 60.
  counts = step_estimate.step_counts(
      _tiny(
          buffer__schedule="ppo_off_policy",
          buffer__max_off_policy=2,
          trainer__microbatches=4,
          trainer__eval_every=25,
          trainer__eval_batch_rows=64,
      ),
      completion_len=40,
  )
  assert counts.num_slots == 256 and counts.decode_calls == 2.5
  assert counts.per_step == {
      "train_step": 4,
      "prepare": 1,
      "prefill": 1,
      "decode": 40,
  }
  assert counts.per_validation == {
      "prepare": 1,
      "val_prefill": 50,
      "val_decode": 2000,
  }
  assert counts.validations == 4
  assert counts.whole_run()["val_decode"] == 8000


def test_counts_name_the_programs_that_are_compiled():
  counts = step_estimate.step_counts(scalerl.get_config("tiny_cpu"))
  assert set(counts.amortised()) == set(
      program_estimates.program_estimates(scalerl.get_config("tiny_cpu"), 1)
  )


def test_estimate_is_runs_times_rooflines():
  counts = step_estimate.step_counts(scalerl.get_config("tiny_cpu"))
  rooflines = {
      "train_step": 2.0,
      "prepare": 0.5,
      "prefill": 1.0,
      "decode": 0.01,
      "val_prefill": 0.2,
      "val_decode": 0.005,
  }
  est = step_estimate.estimate(rooflines, counts)
  # 1 x 2 + 1.1 x 0.5 + 0.5 x 1 + 48 x 0.01 + 1.3 x 0.2 + 124.8 x 0.005
  # = 2 + 0.55 + 0.5 + 0.48 + 0.26 + 0.624.
  assert est.step_seconds == pytest.approx(4.414)
  # 60 x 2 + 67 x 0.5 + 30 x 1 + 2880 x 0.01 + 91 x 0.2 + 8736 x 0.005
  # = 120 + 33.5 + 30 + 28.8 + 18.2 + 43.68.
  assert est.run_seconds == pytest.approx(274.18)
  assert est.missing == ()
  del rooflines["decode"]
  est = step_estimate.estimate(rooflines, counts)
  assert est.missing == ("decode",)
  assert est.step_seconds == pytest.approx(4.414 - 0.48)


@pytest.mark.parametrize("length", [-1, 97])
def test_a_completion_length_outside_the_budget_is_refused(length):
  with pytest.raises(ValueError, match="max_new_tokens=96"):
    step_estimate.step_counts(scalerl.get_config("tiny_cpu"), length)
