"""Reading metrics.jsonl (scalerl_jax/metrics/rows.py): lines and one row
per step."""

import os

from scalerl_jax import workdir as workdir_lib
from scalerl_jax.metrics import rows


def _write(tmp_path, text):
  with open(os.path.join(tmp_path, workdir_lib.METRICS_FILE), "w") as f:
    f.write(text)
  return str(tmp_path)


def test_lines_name_each_unusable_line_and_by_step_keeps_each_steps_last(
    tmp_path,
):
  workdir = _write(
      tmp_path,
      '{"step": 1, "a": 1}\n'
      "\n"
      '{"step": 0, "a": 0}\n'
      '{"step": 1, "a": 2}\n'
      '{"step": 2, "a": 3\n'
      "[2]\n"
      '{"step": true, "a": 4}\n'
      '{"step": "3", "a": 5}\n',
  )
  path = rows.path_of(workdir)
  got = list(rows.lines(workdir))
  assert [where for where, _ in got] == [
      f"{path}:{n}" for n in (1, 3, 4, 5, 6, 7, 8)
  ]
  assert got[3][1].startswith("not valid JSON")
  assert got[4][1] == "not a JSON object"
  # Blank, broken, non-object and non-integer-step lines left out; step 1's
  # later line wins.
  assert rows.by_step(workdir) == [{"step": 0, "a": 0}, {"step": 1, "a": 2}]


def test_a_line_being_written_is_one_incomplete_last_line_not_two(tmp_path):
  # A live run: the writer has put down half of step 1's line. Reading the
  # open file line by line returned that half at the end of the file and,
  # once the writer finished the line, its rest as a line of its own.
  workdir = _write(tmp_path, '{"step": 0, "a": 0}\n{"step": 1, "a": 1')
  read = rows.lines(workdir)
  assert next(read) == (f"{rows.path_of(workdir)}:1", {"step": 0, "a": 0})
  assert next(read) == (f"{rows.path_of(workdir)}:2", rows.INCOMPLETE)
  with open(rows.path_of(workdir), "a") as f:
    f.write('2345, "b": 2}\n')
  assert list(read) == []
  # Read again, the finished line is whole.
  assert rows.by_step(workdir) == [
      {"step": 0, "a": 0},
      {"step": 1, "a": 12345, "b": 2},
  ]
  # A cut line before others is broken, not incomplete.
  workdir = _write(tmp_path, '{"step": 0, "a": 0\n{"step": 1, "a": 1}\n')
  assert list(rows.lines(workdir))[0][1].startswith("not valid JSON")
