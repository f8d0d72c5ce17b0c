"""Validation: metrics of scored samples (scalerl_jax.evaluation.summarize)
and the validation batch."""

import numpy as np
import pytest

from configs import scalerl
from scalerl_jax import evaluation


def test_summary_numbers_worked_by_hand():
  scores = np.array([[1, 0, 1, 0], [1, 1, 1, 1], [0, 0, 0, 0]], np.float32)
  got = evaluation.summarize(
      scores, np.array([3] * 6 + [6] * 6), np.array([0] * 11 + [1])
  )
  # Prompt variances (ddof=1): 4 x 0.25 / 3 = 1/3, 0 and 0; k = 4, N = 3.
  stderr = np.sqrt((1 / 3) / 4) / 3
  assert got == pytest.approx(
      {
          "val/mean_at_k": 6 / 12,
          "val/mean_at_k_stderr": stderr,
          "val/pass_at_k": 2 / 3,
          "val/mean_length": 4.5,
          "val/truncation_rate": 1 / 12,
          "val/num_prompts": 3.0,
      },
      rel=1e-12,
  )


def test_stderr_matches_the_spread_of_resampled_evaluations():
  # 200 prompts with fixed pass rates, k = 16: the stderr of one evaluation
  # agrees with the std of mean@k over 2,000 independent resamplings.
  rng = np.random.default_rng(0)
  p_N = rng.uniform(0, 1, 200)
  draws = [
      (rng.random((200, 16)) < p_N[:, None]).astype(np.float32)
      for _ in range(2_000)
  ]
  spread = np.std([d.mean() for d in draws])
  stderrs = [
      evaluation.summarize(d, np.ones(1), np.zeros(1))["val/mean_at_k_stderr"]
      for d in draws[:50]
  ]
  # 2,000 draws: ~1.6% error of the std.
  assert abs(np.mean(stderrs) / spread - 1) < 0.05


def test_validation_batch_is_the_train_batch_unless_set():
  config = scalerl.get_config("qwen3_0.6b")  # 48 x 16 rows, k = 16.
  assert evaluation.prompts_per_batch(config, 16) == 48
  # 768 rows over 64 chips: the next power of two, 1,024 slots.
  assert evaluation.num_slots(config, 64) == 1024
  config.trainer.eval_batch_rows = 256
  assert evaluation.prompts_per_batch(config, 16) == 16
  assert evaluation.num_slots(config, 64) == 256
  # Fewer rows than k: one prompt's k samples still make a batch.
  config.trainer.eval_batch_rows = 8
  assert evaluation.prompts_per_batch(config, 16) == 1
