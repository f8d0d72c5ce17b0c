"""The run's cumulative counters: `counters/*` in metrics.jsonl, kept in
every checkpoint, read by the loop's non-finite stop
(`trainer.max_nonfinite_steps`)."""

from __future__ import annotations

from typing import Mapping

from absl import logging


def initial() -> dict[str, int]:
  """The counters of a run that has taken no step."""
  return {
      "tokens_trained": 0,
      "nonfinite_steps": 0,
      "consecutive_nonfinite": 0,
      "no_signal_steps": 0,
  }


def count_step(
    counters: dict[str, int], step_metrics: Mapping[str, float], step: int
) -> None:
  """Adds train step `step`'s tokens, skipped update and non-finite loss."""
  counters["tokens_trained"] += int(step_metrics["loss_tokens"])
  # Steps whose update was skipped: no loss token (absent in older
  # checkpoints).
  counters["no_signal_steps"] = counters.get("no_signal_steps", 0) + int(
      step_metrics["no_signal"]
  )
  if step_metrics["nonfinite"]:
    counters["nonfinite_steps"] += 1
    counters["consecutive_nonfinite"] += 1
    logging.warning(
        "step %d: non-finite loss or gradient; update skipped", step
    )
  else:
    counters["consecutive_nonfinite"] = 0
