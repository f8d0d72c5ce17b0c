"""Fork server of the reward workers: imports once, forks workers on request.

`python -m scalerl_jax.rewards.workers.zygote <socket>` connects to the pool,
gets the `WorkerSettings`, runs `worker.warm_up`, replies ("ready",) and
serves:

  ("fork",)      connect a new socket to the pool and fork a child running
                 `worker.worker_main` on it. Reply ("forked", pid).
  ("kill", pid)  SIGKILL and reap that worker if alive. Reply ("killed", pid).

It dies with the pool, its workers with it. Design: docs/design/rewards.md.
"""

from __future__ import annotations

from multiprocessing import connection as mp_connection
import os
import signal
import socket
import sys
import traceback

from scalerl_jax.rewards.sandbox import client
from scalerl_jax.rewards.workers import worker


def connect(path: str) -> mp_connection.Connection:
  """A message connection to the pool's Unix socket at `path`."""
  sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
  sock.connect(path)
  return mp_connection.Connection(sock.detach())


def _reap(children: set[int]) -> None:
  """Forgets workers that exited by themselves (crashed)."""
  for pid in list(children):
    if os.waitpid(pid, os.WNOHANG)[0]:
      children.discard(pid)


def _kill(pid: int, children: set[int]) -> None:
  # Only the parent can kill without racing pid reuse: a dead child stays a
  # zombie until reaped here.
  if pid in children:
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    children.discard(pid)


def _run_worker(
    conn: mp_connection.Connection, settings: worker.WorkerSettings
) -> None:
  """A forked child: serves, then exits without the parent's cleanup."""
  status = 0
  try:
    worker.worker_main(conn, settings)
  except BaseException:  # Report anything, then leave through os._exit below.
    traceback.print_exc()
    status = 1
  finally:
    os._exit(status)


def main(argv: list[str]) -> None:
  """Serves fork and kill requests until the pool closes the connection."""
  # Ctrl-C is the trainer's to handle.
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  client.die_with_parent()
  path = argv[1]
  control = connect(path)
  settings = control.recv()
  worker.warm_up()
  control.send(("ready",))
  children: set[int] = set()
  while True:
    try:
      request = control.recv()
    except (EOFError, ConnectionResetError):  # The pool is gone.
      break
    _reap(children)
    if request[0] == "fork":
      conn = connect(path)
      pid = os.fork()
      if pid == 0:
        control.close()
        _run_worker(conn, settings)
      conn.close()
      children.add(pid)
      control.send(("forked", pid))
    elif request[0] == "kill":
      _kill(request[1], children)
      control.send(("killed", request[1]))
    else:
      raise ValueError(
          f"Unknown request to the reward fork server: {request!r}"
      )
  for pid in list(children):
    _kill(pid, children)


if __name__ == "__main__":
  main(sys.argv)
