"""Nothing outlives its owner: reward processes and sandboxes killed.

`tests/scripts/subreaper.py` is the child subreaper of all it starts, so
that whatever a kill orphans is reparented to it and counted, then killed:

  * 40 processes each SIGKILLed 0 to 20 ms after it began to start a
    bubblewrap sandbox, inside bubblewrap's set-up among them (before the
    fix, one in four left a `bwrap` stuck for good: its parent died while it
    waited for a word from it, and as PID 1 of its namespace it ignored
    SIGTERM; that is the `bwrap` a CI run left behind);
  * under each fork-server setting, a reward pool scoring two sandboxed
    programs that sleep: one worker SIGKILLed (its sandbox and program must
    go while the pool lives), then the pool's owner (its fork server, the
    other worker, its sandbox and program must go).
"""

import json
import os
import subprocess
import sys

import pytest

# Seconds of worker time on 2 cores: README's test command leaves it out.
pytestmark = [pytest.mark.slow(seconds=20), pytest.mark.needs_bwrap]

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _cases(scenario: str) -> list[dict]:
  out = subprocess.run(
      [sys.executable, "-m", "tests.scripts.subreaper", scenario],
      cwd=_ROOT,
      env=dict(os.environ, PYTHONPATH=_ROOT),
      capture_output=True,
      text=True,
      timeout=300,
      check=False,
  )
  assert out.returncode == 0, out.stderr[-3000:]
  return [json.loads(line) for line in out.stdout.splitlines()]


def test_a_process_killed_while_starting_a_sandbox_leaves_nothing():
  cases = _cases("sandbox_start")
  assert len(cases) == 40
  assert [c for c in cases if c["leftovers"]] == []


def test_a_killed_worker_or_pool_owner_leaves_nothing():
  cases = _cases("pool")
  assert len(cases) == 4
  assert [c for c in cases if c["leftovers"]] == []
