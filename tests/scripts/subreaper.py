"""The harness of tests/leftovers_test.py: kills reward processes and
sandboxes, and lists what outlived them.

  python -m tests.scripts.subreaper SCENARIO

It makes itself the child subreaper of everything it starts
(PR_SET_CHILD_SUBREAPER), so that a process orphaned by a kill is
reparented to it instead of to init: after each kill and a grace period,
its descendants other than the processes it still owns are leftovers. It
prints one JSON line per case: {"case": ..., "leftovers": ["pid name", ...]}
and kills the leftovers. Scenarios:

  sandbox_start  40 times: a process starts a bubblewrap sandbox
                 (`client.Sandbox`) and is SIGKILLed 0 to 20 ms
                 after it began to, inside bubblewrap's set-up among them.
  pool           for each fork-server setting: a reward pool scores two
                 sandboxed programs that sleep (tests/scripts/reward_owner.py);
                 once both run, one worker is SIGKILLed (what it started must
                 go while the pool lives), then the pool's owner.
"""

import ctypes
import json
import os
import signal
import subprocess
import sys
import time

import psutil

_PR_SET_CHILD_SUBREAPER = 36
_GRACE_S = 5.0
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
_START_SANDBOX = (
    "from scalerl_jax.rewards.sandbox import client\n"
    "print('spawning', flush=True)\n"
    "client.Sandbox(True, lambda pgid, tmp: None)\n"
    "print('up', flush=True)\n"
    "import time; time.sleep(600)\n"
)


def _start(args):
  return subprocess.Popen(
      [sys.executable, *args],
      cwd=_ROOT,
      env=dict(os.environ, PYTHONPATH=_ROOT),
      stdout=subprocess.PIPE,
      start_new_session=True,
  )


def _orphans(keep):
  """This process's descendants outside `keep` once the grace period is
  over (or none is left), reaping the dead ones."""
  deadline = time.monotonic() + _GRACE_S
  while True:
    alive = []
    for p in psutil.Process().children(recursive=True):
      try:
        if p.pid in keep:
          continue
        if p.status() == psutil.STATUS_ZOMBIE:
          if p.ppid() == os.getpid():
            os.waitpid(p.pid, os.WNOHANG)
          continue
        alive.append(p)
      except psutil.NoSuchProcess:
        pass
    if not alive or time.monotonic() > deadline:
      return alive


def _report(case, orphans):
  names = []
  for p in orphans:
    try:
      names.append(f"{p.pid} {p.name()}")
      p.kill()
    except psutil.NoSuchProcess:
      pass
  psutil.wait_procs(orphans, timeout=10)
  print(json.dumps({"case": case, "leftovers": names}), flush=True)


def sandbox_start():
  for n in range(40):
    owner = _start(["-c", _START_SANDBOX])
    assert owner.stdout.readline().strip() == b"spawning"
    time.sleep(n * 0.0005)
    owner.kill()
    owner.wait()
    _report(f"sandbox_start {n * 0.5:.1f} ms", _orphans(set()))


def _busy_workers(owner, fork_server):
  """The pool's workers once each runs its program."""
  idle = 2 if fork_server else 0  # A standing sandbox: bwrap, its server.
  deadline = time.monotonic() + 120
  while time.monotonic() < deadline:
    zygotes = [
        p
        for p in owner.children()
        if "scalerl_jax.rewards.workers.zygote" in " ".join(p.cmdline())
    ]
    workers = zygotes[0].children() if zygotes else []
    if len(workers) == 2 and all(
        len(w.children(recursive=True)) > idle for w in workers
    ):
      return workers
    time.sleep(0.05)
  raise TimeoutError("the pool's programs did not start in 120 s")


def pool():
  for fork_server in (0, 1):
    owner = _start(
        ["-m", "tests.scripts.reward_owner", f"--fork_server={fork_server}"]
    )
    assert owner.stdout.readline().strip() == b"scoring"
    process = psutil.Process(owner.pid)
    workers = _busy_workers(process, fork_server)
    below = workers[0].children(recursive=True)
    workers[0].kill()
    _, alive = psutil.wait_procs([workers[0], *below], timeout=_GRACE_S)
    _report(
        f"fork_server={fork_server}: worker killed, its pool alive",
        [p for p in alive if p.pid != workers[0].pid],
    )
    owner.kill()
    owner.wait()
    _report(f"fork_server={fork_server}: owner killed", _orphans(set()))


def main():
  libc = ctypes.CDLL(None, use_errno=True)
  if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1) != 0:
    raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")
  {"sandbox_start": sandbox_start, "pool": pool}[sys.argv[1]]()


if __name__ == "__main__":
  main()
