"""Thousands of generated hostile programs through `RewardPool.score`.

  python -m benchmarks.hostile --num=5000
  python -m benchmarks.hostile --num=200 --seed=1 --fork_server=true

Draws `--num` programs (benchmarks/hostile_programs.py) and scores them, in
batches, with a pool of 2 workers under bubblewrap, once per fork-server
setting (or the one named). Outside the sandbox it keeps what the programs
aim at: a secret file, a canary file, a path that must not come to exist and
a TCP port listening on 127.0.0.1. This process is the child subreaper of
all it starts, so a process a program leaves behind comes to it. Prints one
JSON line per setting: programs, rewards won (score 1), escapes (a file
read-modified or created, a connection, a process outside the sandbox
killed), leftovers (processes, cgroups, temporary directories once the pool
closed), the pool's timeouts and crashes, wall time, and the programs per
entry, action and target. After every batch the pool scores an honest
program, which must score 1. docs/reliability.md quotes the results.
"""

import collections
import ctypes
import glob
import json
import os
import socket
import tempfile
import threading
import time

from absl import app
from absl import flags
import psutil

from benchmarks import hostile_programs
from configs import scalerl
from scalerl_jax import rewards
from scalerl_jax.rewards.sandbox import client
from scalerl_jax.rewards.sandbox import isolation

_NUM = flags.DEFINE_integer("num", 5000, "Programs per fork-server setting.")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the generator.")
_BATCH = flags.DEFINE_integer("batch", 100, "Programs per score call.")
_FORK_SERVER = flags.DEFINE_enum(
    "fork_server", "both", ["both", "true", "false"], "Settings to run."
)
_PR_SET_CHILD_SUBREAPER = 36


class _Listener:
  """A TCP port on 127.0.0.1 that counts the connections it accepts."""

  def __init__(self):
    self.sock = socket.create_server(("127.0.0.1", 0))
    self.port = self.sock.getsockname()[1]
    self.connections = 0
    threading.Thread(target=self._serve, daemon=True).start()

  def _serve(self):
    while True:
      conn, _ = self.sock.accept()
      self.connections += 1
      conn.close()


def _outside(root: str, port: int) -> hostile_programs.Outside:
  outside = hostile_programs.Outside(
      secret=os.path.join(root, "secret.txt"),
      canary=os.path.join(root, "canary.txt"),
      new_file=os.path.join(root, "new.txt"),
      port=port,
  )
  for path, text in ((outside.secret, "SECRET"), (outside.canary, "canary")):
    with open(path, "w") as f:
      f.write(text)
  return outside


def _escapes(outside, listener, crashes) -> dict[str, int]:
  """What reached past the sandbox, by kind."""
  read = lambda path: open(path).read() if os.path.exists(path) else None
  return {
      "secret_changed": int(read(outside.secret) != "SECRET"),
      "canary_changed": int(read(outside.canary) != "canary"),
      "file_created": int(os.path.exists(outside.new_file)),
      "connections": listener.connections,
      "outside_process_killed": crashes,
  }


def _leftovers(owned: set[int]) -> dict[str, list[str]]:
  """Processes, cgroups and temporary directories left behind."""
  processes = []
  for p in psutil.Process().children(recursive=True):
    try:
      if p.pid in owned:
        continue
      if p.status() == psutil.STATUS_ZOMBIE:
        os.waitpid(p.pid, os.WNOHANG)
        continue
      processes.append(f"{p.pid} {p.name()}")
    except (psutil.NoSuchProcess, ChildProcessError):
      pass
  parent, _ = isolation.pids_cgroup_parent()
  cgroups = (
      [n for n in os.listdir(parent) if n.startswith("scalerl_sandbox_")]
      if parent
      else []
  )
  tmp = glob.glob(os.path.join(tempfile.gettempdir(), client.TEMP_PREFIX + "*"))
  return {"processes": processes, "cgroups": cgroups, "temp_dirs": tmp}


def _run(fork_server: bool, programs, outside, listener) -> dict:
  config = scalerl.get_config()
  with config.unlocked():
    r = config.rewards
    r.num_workers, r.timeout_s = 2, 2.0
    r.code_isolation, r.code_fork_server = "bwrap", fork_server
  totals = collections.Counter()
  won = []
  start = time.perf_counter()
  with rewards.RewardPool(config.rewards) as pool:
    for i in range(0, len(programs), _BATCH.value):
      batch = programs[i : i + _BATCH.value]
      scores, stats = pool.score(
          [p.completion for p in batch], [hostile_programs.RECORD] * len(batch)
      )
      won += [p for p, s in zip(batch, scores) if s > 0]
      for key in ("num_timeouts", "num_crashes", "num_errors"):
        totals[key] += int(stats[key])
      honest, _ = pool.score(
          [hostile_programs.HONEST], [hostile_programs.RECORD]
      )
      if honest[0] != 1.0:
        raise RuntimeError(f"batch {i}: the pool scored the honest program 0")
  wall = time.perf_counter() - start
  time.sleep(1.0)  # Killed processes leave the table.
  return {
      "fork_server": fork_server,
      "programs": len(programs),
      "won": len(won),
      "won_examples": [p.source for p in won[:3]],
      "escapes": _escapes(outside, listener, totals["num_crashes"]),
      "leftovers": _leftovers(set()),
      "timeouts": totals["num_timeouts"],
      "crashes": totals["num_crashes"],
      "errors": totals["num_errors"],
      "wall_s": round(wall, 1),
      "hook_off": sum(p.hook_off for p in programs),
      **{
          part: collections.Counter(getattr(p, part) for p in programs)
          for part in ("entry", "action", "target")
      },
  }


def main(argv):
  del argv
  libc = ctypes.CDLL(None, use_errno=True)
  if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1) != 0:
    raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")
  listener = _Listener()
  settings = {"both": (False, True), "true": (True,), "false": (False,)}
  with tempfile.TemporaryDirectory() as root:
    outside = _outside(root, listener.port)
    programs = hostile_programs.generate(_NUM.value, _SEED.value, outside)
    for fork_server in settings[_FORK_SERVER.value]:
      print(
          json.dumps(_run(fork_server, programs, outside, listener)),
          flush=True,
      )


if __name__ == "__main__":
  app.run(main)
