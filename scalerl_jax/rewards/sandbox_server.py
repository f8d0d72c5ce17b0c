"""A fork server in one bubblewrap sandbox: `server.py <root> <keep>...`.

Run by `python -I -S -B` as PID 1 of the sandbox's namespaces (standard
library only). It reads requests from fd 0 and answers on fd 1, one at a time,
each a 4-byte big-endian length and a JSON object: `{source, stdin, cpu_s,
memory_mb, wall_s}` in, `{returncode, stdout (base64), timed_out}` out. Each
program runs in a forked child of this clean interpreter, in a fresh
directory under `root` (whose `keep` entries, the server's own read-only
files, stay), with the rlimits and the audit hook of a fresh
sandboxed run (sandbox_boot.py), so its start-up is a fork, not an
interpreter. Invariants: the server runs no program code itself; after every
run it kills every other process in the namespace (SIGKILL to PID 1 from
inside is ignored by the kernel) and empties `root`, so nothing one program
leaves reaches the next. Design: docs/design/sandbox.md.
"""

import base64
import ctypes
import io
import json
import os
import select
import shutil
import signal
import struct
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sandbox_boot  # pylint: disable=g-import-not-at-top,wrong-import-position

_PR_SET_DUMPABLE = 4
_CLONE_NEWUSER = 0x10000000
_CLONE_NEWPID = 0x20000000
_unshare = None  # libc's unshare, bound before ctypes leaves sys.modules.


def _read_message(fd):
  """The next request, or None when the host has closed the pipe."""
  header = _read_exactly(fd, 4)
  if header is None:
    return None
  body = _read_exactly(fd, struct.unpack(">I", header)[0])
  return None if body is None else json.loads(body)


def _read_exactly(fd, n):
  chunks = []
  while n:
    chunk = os.read(fd, min(n, 1 << 20))
    if not chunk:
      return None
    chunks.append(chunk)
    n -= len(chunk)
  return b"".join(chunks)


def _write_message(fd, message):
  body = json.dumps(message).encode()
  data = struct.pack(">I", len(body)) + body
  while data:
    data = data[os.write(fd, data) :]


def _child(run_dir, source, cpu_s, memory_mb):
  """The forked child: confines itself, then runs `source` as __main__."""
  status = 1
  try:
    os.setsid()
    os.chdir(run_dir)
    os.dup2(os.open("stdin", os.O_RDONLY), 0)
    os.dup2(os.open("stdout", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), 1)
    os.dup2(os.open("/dev/null", os.O_WRONLY), 2)
    os.closerange(3, 1 << 16)  # The request and answer pipes among them.
    sandbox_boot.set_limits(cpu_s, memory_mb)
    os.environ.clear()
    os.environ.update(sandbox_boot.program_env(run_dir))
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False))
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False))
    sys.argv = [os.path.join(run_dir, "main.py")]
    code = compile(source, sys.argv[0], "exec")
    sys.addaudithook(sandbox_boot.make_hook(run_dir))
    exec(code, {"__name__": "__main__", "__builtins__": __builtins__})  # pylint: disable=exec-used
    status = 0
  except SystemExit as e:
    if e.code is None or isinstance(e.code, int):
      status = e.code or 0
    else:
      print(e.code, file=sys.stderr)
  except BaseException:  # pylint: disable=broad-except
    traceback.print_exc()
  try:
    sys.stdout.flush()
  except BaseException:  # pylint: disable=broad-except
    status = status or 1
  os._exit(status & 0xFF)


def _intermediate(run_dir, request):
  """Starts the program as PID 1 of a pid namespace of its own; its status.

  As in a fresh sandbox, the program's parent is out of its sight
  (getppid() is 0), it can signal neither this process nor the server, and
  every process it starts dies with it.
  """
  try:
    # A user namespace for the right to make the pid namespace; its ids are
    # left unmapped (mapping uid 0 needs CAP_SETFCAP, dropped), so the
    # program sees itself as uid 65534 while the kernel checks its files
    # access as before.
    if _unshare(_CLONE_NEWUSER | _CLONE_NEWPID) != 0:
      os._exit(1)
    pid = os.fork()
    if pid == 0:
      _child(run_dir, request["source"], request["cpu_s"], request["memory_mb"])
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):  # Dies the same death, for the server to read.
      sig = os.WTERMSIG(status)
      if sig not in (signal.SIGKILL, signal.SIGSTOP):
        signal.signal(sig, signal.SIG_DFL)
      os.kill(os.getpid(), sig)
    os._exit(os.WEXITSTATUS(status))
  finally:
    os._exit(1)  # Never back into the server's loop.


def _others():
  """Every process of the namespace but this one (PID 1)."""
  return [int(p) for p in os.listdir("/proc") if p.isdigit() and p != "1"]


def _sweep():
  """Kills and reaps every other process in the namespace."""
  for _ in range(100):
    pids = _others()
    if not pids:
      break
    for pid in pids:
      try:
        os.kill(pid, signal.SIGKILL)
      except ProcessLookupError:
        pass
    _reap_any()
    time.sleep(0.001)
  _reap_any()


def _reap_any():
  while True:
    try:
      pid, _ = os.waitpid(-1, os.WNOHANG)
    except ChildProcessError:
      return
    if pid == 0:
      return


def _run(root, keep, n, request):
  run_dir = os.path.join(root, f"run{n}")
  os.mkdir(run_dir, 0o700)
  with open(os.path.join(run_dir, "stdin"), "w", encoding="utf-8") as f:
    f.write(request["stdin"])
  pid = os.fork()
  if pid == 0:
    _intermediate(run_dir, request)
  pidfd = os.pidfd_open(pid)
  try:
    ready, _, _ = select.select([pidfd], [], [], max(0.0, request["wall_s"]))
  finally:
    os.close(pidfd)
  timed_out = not ready
  if timed_out:
    os.kill(pid, signal.SIGKILL)
  _, status = os.waitpid(pid, 0)
  _sweep()
  try:
    with open(os.path.join(run_dir, "stdout"), "rb") as f:
      stdout = f.read(sandbox_boot.MAX_OUTPUT_BYTES)
  except OSError:
    stdout = b""
  for entry in set(os.listdir(root)) - keep:
    path = os.path.join(root, entry)
    if os.path.isdir(path) and not os.path.islink(path):
      shutil.rmtree(path, ignore_errors=True)
    else:
      try:
        os.remove(path)
      except OSError:
        pass
  returncode = (
      -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
  )
  return {
      "returncode": returncode,
      "stdout": base64.b64encode(stdout).decode(),
      "timed_out": timed_out,
  }


def main(argv):
  """Serves requests until the host closes fd 0."""
  root, keep = argv[1], set(argv[2:])
  global _unshare
  libc = ctypes.CDLL(None, use_errno=True)
  # No process here may read this one's memory or descriptors.
  libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
  _unshare = libc.unshare
  # A program's `import ctypes` must import it afresh, which the audit hook
  # stops, as in a fresh interpreter.
  for name in [
      m for m in sys.modules if m == "ctypes" or m.startswith("ctypes.")
  ]:
    del sys.modules[name]
  requests, answers = os.dup(0), os.dup(1)
  null = os.open("/dev/null", os.O_RDWR)
  os.dup2(null, 0)
  os.dup2(null, 1)
  n = 0
  while True:
    request = _read_message(requests)
    if request is None:
      return
    n += 1
    _write_message(answers, _run(root, keep, n, request))


if __name__ == "__main__":
  main(sys.argv)
