"""A seeded sample of generated hostile programs through `RewardPool.score`,
under both fork-server settings (benchmarks/hostile_programs.py).

benchmarks/hostile.py runs thousands (docs/reliability.md); this keeps 160
of them in CI: no reward won, nothing outside reached (a secret and a
canary file, a path that must not come to exist, a listening port, the
pool's own processes), nothing left behind (processes below this one,
sandbox cgroups, temporary directories), and the pool still scores an
honest program 1.
"""

import os
import socket
import threading

import numpy as np
import psutil
import pytest

from benchmarks import hostile_programs
from configs import scalerl
from scalerl_jax import rewards
from scalerl_jax.rewards.sandbox import isolation

# Seconds of worker time on 2 cores: README's test command leaves it out.
pytestmark = [pytest.mark.slow(seconds=25), pytest.mark.needs_bwrap]

_NUM, _SEED = 160, 20261127


@pytest.fixture(scope="module")
def outside(tmp_path_factory):
  """What the programs aim at, and a port counting its connections."""
  root = tmp_path_factory.mktemp("outside")
  server = socket.create_server(("127.0.0.1", 0))
  connections = []

  def serve():
    while True:
      conn, _ = server.accept()
      connections.append(conn)

  threading.Thread(target=serve, daemon=True).start()
  targets = hostile_programs.Outside(
      secret=str(root / "secret.txt"),
      canary=str(root / "canary.txt"),
      new_file=str(root / "new.txt"),
      port=server.getsockname()[1],
  )
  for path, text in ((targets.secret, "SECRET"), (targets.canary, "canary")):
    with open(path, "w") as f:
      f.write(text)
  yield targets, connections
  server.close()


@pytest.mark.parametrize("fork_server", [False, True])
def test_generated_attacks_win_nothing_reach_nothing_leave_nothing(
    outside, fork_server
):
  targets, connections = outside
  programs = hostile_programs.generate(_NUM, _SEED, targets)
  # Every part of the generator is in the sample.
  for part, values in (
      ("entry", hostile_programs.ENTRIES),
      ("action", hostile_programs.ACTIONS),
      ("target", hostile_programs.TARGETS),
  ):
    assert {getattr(p, part) for p in programs} == set(values)
  config = scalerl.get_config()
  with config.unlocked():
    r = config.rewards
    r.num_workers, r.timeout_s = 2, 2.0
    r.code_isolation, r.code_fork_server = "bwrap", fork_server
  before = {p.pid for p in psutil.Process().children(recursive=True)}
  with rewards.RewardPool(config.rewards) as pool:
    scores, stats = pool.score(
        [p.completion for p in programs],
        [hostile_programs.RECORD] * len(programs),
    )
    honest, _ = pool.score([hostile_programs.HONEST], [hostile_programs.RECORD])
  won = [p.source for p, s in zip(programs, scores) if s > 0]
  assert won == []
  np.testing.assert_array_equal(honest, [1.0])
  assert stats["num_crashes"] == 0  # No worker was killed from inside.
  with open(targets.secret) as f:
    assert f.read() == "SECRET"
  with open(targets.canary) as f:
    assert f.read() == "canary"
  assert not os.path.exists(targets.new_file)
  assert connections == []
  _, alive = psutil.wait_procs(
      [
          p
          for p in psutil.Process().children(recursive=True)
          if p.pid not in before
      ],
      timeout=5,
  )
  assert alive == []
  # Cgroups are named for the worker that made them; its death must not
  # leave them.
  parent, _ = isolation.pids_cgroup_parent()
  if parent is not None:
    owners = [
        n.split("_")[2]
        for n in os.listdir(parent)
        if n.startswith("scalerl_sandbox_")
    ]
    assert [o for o in owners if not os.path.exists(f"/proc/{o}")] == []
