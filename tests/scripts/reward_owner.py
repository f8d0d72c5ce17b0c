"""The owner of a reward pool for tests/leftovers_test.py: scores two
sandboxed programs that sleep, until killed.

  python -m tests.scripts.reward_owner --fork_server=1

prints `scoring` once the pool is up, then blocks in `RewardPool.score`.
"""

import argparse

from configs import scalerl
from scalerl_jax import rewards

# Two distinct programs: the pool runs a repeated one once per call.
SLEEPERS = [f"```python\nimport time\ntime.sleep({s})\n```" for s in (600, 601)]
RECORD = {"id": "c", "verifier": "code", "answer": "assert f() is None"}


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--fork_server", type=int, required=True)
  args = parser.parse_args()
  config = scalerl.get_config()
  with config.unlocked():
    r = config.rewards
    r.num_workers, r.timeout_s = 2, 600.0
    r.code_isolation, r.code_fork_server = "bwrap", bool(args.fork_server)
  with rewards.RewardPool(config.rewards) as pool:
    print("scoring", flush=True)
    pool.score(SLEEPERS, [RECORD] * 2)


if __name__ == "__main__":
  main()
