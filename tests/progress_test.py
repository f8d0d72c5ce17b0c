"""Tests of scalerl_jax.metrics.progress: plain lines off a terminal,
one redrawn line on it."""

import io

import numpy as np

from scalerl_jax.metrics import progress as progress_lib


class _Tty(io.StringIO):
  """A text stream that says it is a terminal."""

  def isatty(self):
    return True


def _counts(lines):
  """The 'step/total' count of each line."""
  return [line.split(" [")[0].split()[-1] for line in lines]


def test_plain_lines_are_throttled_and_the_last_step_is_shown():
  stream = io.StringIO()
  progress = progress_lib.Progress(
      total_steps=10, start_step=2, every_s=3600, stream=stream
  )
  # Within the hour after the first line: silent.
  progress.update(4, pass_rate=0.4251)
  progress.update(10, pass_rate=np.float32(0.75))
  progress.close()
  lines = stream.getvalue().splitlines()
  assert "\r" not in stream.getvalue()
  assert _counts(lines) == ["2/10", "10/10"]
  assert lines[1].endswith("step/s, pass_rate=0.75]"), lines


def test_plain_lines_every_update_do_not_repeat_the_last():
  stream = io.StringIO()
  progress = progress_lib.Progress(
      total_steps=10, start_step=2, every_s=0, stream=stream
  )
  progress.update(4, pass_rate=0.4251)
  progress.update(10, pass_rate=0.75)
  progress.close()
  lines = stream.getvalue().splitlines()
  assert _counts(lines) == ["2/10", "4/10", "10/10"]
  assert lines[1].endswith("pass_rate=0.425]"), lines


def test_a_terminal_line_is_redrawn_in_place_and_ended():
  stream = _Tty()
  progress = progress_lib.Progress(total_steps=100, stream=stream)
  progress.update(0)
  progress.update(50, loss=float("nan"))
  progress.close()
  text = stream.getvalue()
  assert text.startswith("\r") and text.endswith("\n") and text.count("\n") == 1
  last = text.rstrip("\n").split("\r")[-1]
  assert "50/100" in last and last.rstrip().endswith("loss=nan]"), last


def test_a_value_not_given_keeps_the_last_one_shown():
  stream = io.StringIO()
  progress = progress_lib.Progress(total_steps=10, every_s=0, stream=stream)
  progress.update(0, val=0.25)  # Validation at step 0 ...
  # ... stays shown between evaluations.
  progress.update(1, reward=0.5, val=None)
  progress.update(2, reward=0.625, val=0.375)
  progress.close()
  lines = stream.getvalue().splitlines()
  assert _counts(lines) == ["0/10", "1/10", "2/10"]
  assert lines[1].endswith("val=0.25, reward=0.5]"), lines
  assert lines[2].endswith("val=0.375, reward=0.625]"), lines
