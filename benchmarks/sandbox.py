"""Per-program cost of the code sandbox: fork server and fresh sandbox.

  python -m benchmarks.sandbox
  python -m benchmarks.sandbox --runs=100 --isolation=python

Times `code_sandbox.run_program` on `print(sum(range(10)))` (what
docs/design/sandbox.md quotes) and `code_sandbox.verify_code` on a function
record of three calls, each `--runs` times after one warm-up run, through
the fork server and through a fresh bubblewrap sandbox per program. Prints
the median and the 90th percentile in ms. Nothing else should run on the
machine while it does.
"""

import statistics
import time

from absl import app
from absl import flags

from scalerl_jax.rewards import code_sandbox
from scalerl_jax.rewards import registry

_RUNS = flags.DEFINE_integer("runs", 50, "Timed runs per case.")
_ISOLATION = flags.DEFINE_enum(
    "isolation", "bwrap", ["bwrap", "python"], "rewards.code_isolation."
)

_PROGRAM = "print(sum(range(10)))"
_COMPLETION = "```python\ndef f(x):\n  return x * 3 - 4\n```"
_RECORD = {"answer": "assert f(2)==2\nassert f(5)==11\nassert f(9)==23"}


def _ctx(fork_server: bool) -> registry.VerifyContext:
  return registry.VerifyContext(
      deadline=time.monotonic() + 10.0,
      code_isolation=_ISOLATION.value,
      code_fork_server=fork_server,
  )


def _time(fn, runs: int) -> tuple[float, float]:
  """(median, 90th percentile) of `fn()`'s wall time, in ms."""
  fn()  # Warm-up: starts the fork server.
  times = []
  for _ in range(runs):
    start = time.perf_counter()
    fn()
    times.append(1e3 * (time.perf_counter() - start))
  times.sort()
  return statistics.median(times), times[int(0.9 * (len(times) - 1))]


def main(argv):
  del argv
  for fork_server in (True, False):
    if fork_server and _ISOLATION.value == "python":
      continue
    cases = {
        "run_program": lambda: code_sandbox.run_program(
            _PROGRAM, "", _ctx(fork_server)  # pylint: disable=cell-var-from-loop
        ),
        "verify_code": lambda: code_sandbox.verify_code(
            _COMPLETION, _RECORD, _ctx(fork_server), ""  # pylint: disable=cell-var-from-loop
        ),
    }
    for name, fn in cases.items():
      try:
        median, p90 = _time(fn, _RUNS.value)
      except Exception as e:  # A case the code under test cannot run yet.
        print(f"{name:12s} fork_server={fork_server!s:5s}: {e}")
        continue
      print(
          f"{name:12s} fork_server={fork_server!s:5s}: median {median:6.2f} ms,"
          f" p90 {p90:6.2f} ms ({_RUNS.value} runs)"
      )
  code_sandbox.stop_server()


if __name__ == "__main__":
  app.run(main)
