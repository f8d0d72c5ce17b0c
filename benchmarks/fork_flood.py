"""What a fork flood in one sandbox costs the trainer's scoring.

  python -m benchmarks.fork_flood
  python -m benchmarks.fork_flood --honest=48 --timeout_s=5

A flood program switches the audit hook off and starts `/bin/sleep`
processes below it (`_posixsubprocess.fork_exec`) as fast as it can, until
the kernel refuses or its deadline kills it. For each fork-server setting,
through `RewardPool.score` with 2 workers (as a run scores), it times a batch
of `--honest` distinct honest programs alone, then the flood and the same
batch together: the scoring call's wall time and the honest programs scored
per second beside the flood. Alone, through `code_sandbox.run_program`, it
reports how many processes the flood held and how long it ran.
docs/reliability.md quotes the results. Nothing else should run on the
machine while it does.
"""

import json
import time

from absl import app
from absl import flags

from configs import scalerl
from scalerl_jax import rewards
from scalerl_jax.rewards import code_sandbox
from scalerl_jax.rewards import registry

_HONEST = flags.DEFINE_integer("honest", 24, "Honest programs per batch.")
_TIMEOUT_S = flags.DEFINE_float("timeout_s", 5.0, "rewards.timeout_s.")

FLOOD = """
import boot
boot._violation = lambda event: None
import _posixsubprocess, os
held = 0
try:
  while True:
    r, w = os.pipe()
    _posixsubprocess.fork_exec(
        ['/bin/sleep', '60'], [b'/bin/sleep'], True, (), None, None,
        -1, -1, -1, -1, -1, -1, r, w, True, False, -1, None, None, None,
        -1, None, False)
    os.close(r)
    os.close(w)
    held += 1
    if held % 100 == 0:
      print(held, flush=True)
except BaseException as e:
  print(held, type(e).__name__, flush=True)
"""
_RECORD = {"id": "f", "verifier": "code", "answer": "assert f(2) == 2"}


def _honest(n: int) -> list[str]:
  # Distinct texts: the pool runs a repeated program once per call.
  return [
      f"```python\ndef f(x):\n  return x * 3 - 4  # {i}\n```" for i in range(n)
  ]


def _flood_alone(fork_server: bool) -> dict:
  """Processes the flood held, its last words and its wall time."""
  ctx = registry.VerifyContext(
      deadline=time.monotonic() + 0.8 * _TIMEOUT_S.value,
      code_isolation="bwrap",
      code_fork_server=fork_server,
  )
  start = time.perf_counter()
  result = code_sandbox.run_program(FLOOD, "", ctx)
  # The last count printed; the refusal's name after it, if it ran into one.
  words = result.stdout.decode().split()
  counts = [int(w) for w in words if w.isdigit()]
  return {
      "held": counts[-1] if counts else 0,
      "ended_by": "deadline" if result.timed_out else words[-1],
      "flood_s": round(time.perf_counter() - start, 2),
  }


def _batch(pool, flood: bool) -> dict:
  honest = _honest(_HONEST.value)
  completions = ([f"```python\n{FLOOD}\n```"] if flood else []) + honest
  start = time.perf_counter()
  scores, stats = pool.score(completions, [_RECORD] * len(completions))
  wall = time.perf_counter() - start
  honest_s = stats["wall_s"] if not flood else wall
  return {
      "wall_s": round(wall, 2),
      "honest_scored_1": int(scores[-len(honest) :].sum()),
      "honest_per_s": round(len(honest) / honest_s, 1),
      "slowest_s": round(stats["slowest_s"], 2),
  }


def main(argv):
  del argv
  for fork_server in (False, True):
    config = scalerl.get_config()
    with config.unlocked():
      r = config.rewards
      r.num_workers, r.timeout_s = 2, _TIMEOUT_S.value
      r.code_isolation, r.code_fork_server = "bwrap", fork_server
    row = {"fork_server": fork_server, **_flood_alone(fork_server)}
    with rewards.RewardPool(config.rewards) as pool:
      _batch(pool, flood=False)  # Warm-up.
      row["alone"] = _batch(pool, flood=False)
      row["beside_flood"] = _batch(pool, flood=True)
    print(json.dumps(row), flush=True)
  code_sandbox.stop_server()


if __name__ == "__main__":
  app.run(main)
