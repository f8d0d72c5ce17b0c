"""The host's side of one sandbox: starts server.py, sends programs.

Under bubblewrap the server is PID 1 of the sandbox (isolation.command);
with rewards.code_isolation='python' it is a plain process in a session of
its own with a temporary directory. The protocol is server.py's.
Design: docs/design/sandbox.md.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import marshal
import os
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Optional

from scalerl_jax.rewards.sandbox import boot
from scalerl_jax.rewards.sandbox import isolation

_BOOT_SCRIPT = os.path.abspath(boot.__file__)
# Run inside the sandbox, never imported here (it imports boot as a
# top-level module, as the sandbox's interpreter sees it).
_SERVER_SCRIPT = os.path.join(os.path.dirname(_BOOT_SCRIPT), "server.py")
# The server's own files under bubblewrap, which it keeps when it empties
# SANDBOX_ROOT.
_KEEP = ("boot.py", "server.py")
_HEADER = struct.Struct(">Id")  # server._HEADER.
_ANSWER = struct.Struct(">i?II")  # server.ANSWER.
_SERVER_GRACE_S = 2.0  # Past a program's deadline, for the server's answer.
_BWRAP_EXIT_S = 2.0  # How long bwrap may take to exit after its child.
TEMP_PREFIX = "scalerl_sandbox_"  # Of the temporary directory, python mode.
_PR_SET_PDEATHSIG = 1
_CLONE_NEWNET = 0x40000000
_CLONE_NEWUSER = 0x10000000


@dataclasses.dataclass(frozen=True)
class ProgramResult:
  """What one sandboxed run did."""

  returncode: int  # Negative: killed by that signal.
  stdout: bytes  # At most boot.MAX_OUTPUT_BYTES.
  timed_out: bool  # Killed at the wall-clock deadline.
  # The program's report (boot.py): the only source of its values.
  result: bytes = b""

  @property
  def violation(self) -> bool:
    """Whether the audit hook stopped the program."""
    return self.returncode == boot.VIOLATION_EXIT_CODE

  @property
  def ok(self) -> bool:
    """Exited by itself with status 0."""
    return not self.timed_out and self.returncode == 0


@functools.cache
def _libc() -> Optional[ctypes.CDLL]:
  return (
      ctypes.CDLL(None, use_errno=True)
      if sys.platform.startswith("linux")
      else None
  )


def die_with_parent() -> None:
  """Has Linux SIGKILL this process when its parent exits (no-op elsewhere)."""
  libc = _libc()
  if libc is not None:
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _confine_python_server() -> None:
  """preexec_fn of a server without bubblewrap: dies with its parent, and
  gets a private network namespace where the kernel grants one (as root, or
  through an unprivileged user namespace; the audit hook blocks sockets
  without it)."""
  die_with_parent()
  libc = _libc()
  if libc is not None and libc.unshare(_CLONE_NEWNET) != 0:
    libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNET)


def _children(pid: int) -> list[int]:
  """The children of process `pid` (none if it is gone)."""
  try:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
      return [int(child) for child in f.read().split()]
  except OSError:
    return []


def _kill(pid: int, kill: Callable[[int, int], None]) -> None:
  try:
    kill(pid, signal.SIGKILL)
  except (ProcessLookupError, PermissionError):
    pass  # Gone already.


class Sandbox:
  """One sandbox process, serving programs one at a time until closed.

  Reports its process group (and temporary directory) to `on_spawn`, so that
  the pool kills it with a worker it had to kill.

  Raises:
    RuntimeError: bubblewrap asked for and not running here.
  """

  def __init__(self, bwrap: bool, on_spawn: Callable[[int, str], None]):
    _libc()  # Loaded before forking, not inside the child.
    pass_fds, preexec_fn = (), None
    self.tmp = ""
    self._bwrap = bwrap
    # Every process of the sandbox, the program's forks below the audit hook
    # included, counts against the cgroup's ceiling (isolation.MAX_TASKS).
    self.cgroup = isolation.pids_cgroup()
    if bwrap:
      root = isolation.SANDBOX_ROOT
      filter_fd = isolation.seccomp_fd()
      argv = isolation.command(
          [(_BOOT_SCRIPT, _KEEP[0]), (_SERVER_SCRIPT, _KEEP[1])],
          [isolation.interpreter(), "-I", "-S", "-B", f"{root}/{_KEEP[1]}"]
          + [root, *_KEEP],
          filter_fd,
      )
      pass_fds = (filter_fd,)
    else:
      root = self.tmp = tempfile.mkdtemp(prefix=TEMP_PREFIX)
      argv = [sys.executable, "-I", "-S", "-B", _SERVER_SCRIPT, root]
      preexec_fn = _confine_python_server
    try:
      self.proc = subprocess.Popen(
          isolation.in_cgroup(self.cgroup, argv),
          stdin=subprocess.PIPE,
          stdout=subprocess.PIPE,
          stderr=subprocess.DEVNULL,
          cwd=root if not bwrap else "/",
          env=boot.program_env(root),
          # Under bwrap no preexec_fn: Python code between fork and exec can
          # deadlock in a threaded parent, and the server leaves when this
          # process's end of its stdin closes (isolation.command).
          preexec_fn=preexec_fn,
          start_new_session=True,
          close_fds=True,
          pass_fds=pass_fds,
      )
    except BaseException:
      isolation.remove_cgroup(self.cgroup)
      raise
    finally:
      for fd in pass_fds:
        os.close(fd)
    on_spawn(self.proc.pid, self.tmp)

  def alive(self) -> bool:
    return self.proc.poll() is None

  def run(
      self,
      source: str,
      stdin: str,
      calls: Optional[dict[str, Any]],
      cpu_s: float,
      memory_mb: int,
      deadline: float,
  ) -> Optional[ProgramResult]:
    """The program's result, or None if the server died or did not answer."""
    wall_s = max(0.0, deadline - time.monotonic())
    # marshal: the sandbox's interpreter reads it without an import.
    body = marshal.dumps(
        {
            "source": source,
            "stdin": stdin,
            "calls": calls,
            "cpu_s": float(cpu_s),
            "memory_mb": int(memory_mb),
        }
    )
    try:
      self.proc.stdin.write(_HEADER.pack(len(body), wall_s) + body)
      self.proc.stdin.flush()
    except OSError:
      return None
    until = time.monotonic() + wall_s + _SERVER_GRACE_S
    header = self._read(_ANSWER.size, until)
    if header is None:
      return None
    returncode, timed_out, stdout_size, result_size = _ANSWER.unpack(header)
    if max(stdout_size, result_size) > boot.MAX_OUTPUT_BYTES:
      return None
    data = self._read(stdout_size + result_size, until)
    if data is None:
      return None
    return ProgramResult(
        returncode, data[:stdout_size], timed_out, data[stdout_size:]
    )

  def _read(self, n: int, until: float) -> Optional[bytes]:
    """`n` bytes of the server's answer; None at EOF or past `until`."""
    fd, chunks = self.proc.stdout.fileno(), []
    while n:
      timeout = max(0.0, until - time.monotonic())
      ready, _, _ = select.select([fd], [], [], timeout)
      chunk = os.read(fd, min(n, 1 << 20)) if ready else b""
      if not chunk:
        return None
      chunks.append(chunk)
      n -= len(chunk)
    return b"".join(chunks)

  def close(self, on_reap: Callable[[int], None]) -> None:
    """Kills the sandbox (all of its processes) and reaps it."""
    if self._bwrap and self.alive():
      # bwrap's child first: PID 1 of the namespace (in its set-up, or the
      # server), whose death takes every process of the namespace with it,
      # and which bwrap then reaps before it exits. Killed together, the
      # child would be left a zombie for init to reap.
      for child in _children(self.proc.pid):
        _kill(child, os.kill)
      try:
        self.proc.wait(timeout=_BWRAP_EXIT_S)
      except subprocess.TimeoutExpired:
        pass
    _kill(self.proc.pid, os.killpg)
    self.proc.wait()
    for pipe in (self.proc.stdin, self.proc.stdout):
      try:
        pipe.close()
      except OSError:
        pass
    if self.tmp:
      shutil.rmtree(self.tmp, ignore_errors=True)
    isolation.remove_cgroup(self.cgroup)
    on_reap(self.proc.pid)
