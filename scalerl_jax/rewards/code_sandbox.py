"""Code verifier: the completion's program run against the record's tests.

Tests are stdin/stdout cases (JSON) or asserts appended to the program; the
score is 1.0 when all pass. `run_program` runs a fresh `python -I -S -B`
under rlimits, sandbox_boot.py's audit hook and isolation.py's lower layer,
and kills its process group after every run. Design: docs/design/sandbox.md.
"""

from __future__ import annotations

import atexit
import base64
import ctypes
import dataclasses
import functools
import json
import os
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from typing import IO, Any, Callable, Mapping, Optional, Union

from scalerl_jax.rewards import extract
from scalerl_jax.rewards import isolation
from scalerl_jax.rewards import registry
from scalerl_jax.rewards import sandbox_boot

_BOOT_SCRIPT = os.path.abspath(sandbox_boot.__file__)
# Run inside the sandbox, never imported here (it imports sandbox_boot as a
# top-level module, as the sandbox's interpreter sees it).
_SERVER_SCRIPT = os.path.join(
    os.path.dirname(_BOOT_SCRIPT), "sandbox_server.py"
)
_SERVER_GRACE_S = 2.0  # Past a program's deadline, for the server's answer.
TEMP_PREFIX = "scalerl_sandbox_"  # Of every sandbox's temporary directory.
MAX_OUTPUT_BYTES = sandbox_boot.MAX_OUTPUT_BYTES
_BWRAP_EXIT_S = 2.0  # How long bwrap may take to exit after its program.
_PR_SET_PDEATHSIG = 1
_CLONE_NEWNET = 0x40000000
_CLONE_NEWUSER = 0x10000000


@dataclasses.dataclass(frozen=True)
class ProgramResult:
  """What one sandboxed run did."""

  returncode: int  # Negative: killed by that signal.
  stdout: bytes  # At most MAX_OUTPUT_BYTES.
  timed_out: bool  # Killed at the wall-clock deadline.

  @property
  def violation(self) -> bool:
    """Whether the audit hook stopped the program."""
    return self.returncode == sandbox_boot.VIOLATION_EXIT_CODE

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


def _confine_child(cpu_s: float, memory_mb: int, own_netns: bool) -> None:
  """preexec_fn: runs in the forked child before it executes Python or bwrap."""
  sandbox_boot.set_limits(cpu_s, memory_mb)
  die_with_parent()
  libc = _libc()
  if own_netns and libc is not None:
    # A private network namespace has no interface but a down loopback.
    # Unavailable without root or unprivileged user namespaces; the audit
    # hook still blocks sockets then.
    if libc.unshare(_CLONE_NEWNET) != 0:
      libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNET)


def _kill(pid: int, kill: Callable[[int, int], None]) -> None:
  try:
    kill(pid, signal.SIGKILL)
  except (ProcessLookupError, PermissionError):
    pass  # Gone already.


def _launch(
    tmp: str,
    program: str,
    stdin: IO[bytes],
    stdout: IO[bytes],
    ctx: registry.VerifyContext,
    info: list[int],
) -> tuple[subprocess.Popen, Optional[int]]:
  """Starts the confined interpreter on `program`.

  Returns the process and, under bubblewrap, its program's pid; appends the
  read end of bwrap's info pipe to `info`, to close once bwrap is gone.
  """
  bwrap = isolation.use_bwrap(ctx.code_isolation)
  if bwrap:
    root = isolation.SANDBOX_ROOT
    info_r, info_w = os.pipe()
    info.append(info_r)
    argv = isolation.command(
        [(program, "main.py"), (_BOOT_SCRIPT, "boot.py")],
        [
            isolation.interpreter(),
            "-I",
            "-S",
            "-B",
            f"{root}/boot.py",
            root,
            f"{root}/main.py",
        ],
        info_fd=info_w,
    )
  else:
    root, info_w = tmp, None
    argv = [sys.executable, "-I", "-S", "-B", _BOOT_SCRIPT, tmp, program]
  try:
    proc = subprocess.Popen(
        argv,
        stdin=stdin,
        stdout=stdout,
        stderr=subprocess.DEVNULL,
        cwd=tmp,
        env=sandbox_boot.program_env(root),
        preexec_fn=functools.partial(
            _confine_child, ctx.code_cpu_s, ctx.code_memory_mb, not bwrap
        ),
        start_new_session=True,
        close_fds=True,
        pass_fds=() if info_w is None else (info_w,),
    )
  finally:
    if info_w is not None:
      os.close(info_w)
  return proc, isolation.read_child_pid(info_r) if bwrap else None


def _wait(proc: subprocess.Popen, timeout: float) -> bool:
  """Waits up to `timeout` s for `proc` to exit, and reaps it; True if it did.

  On a pidfd, not `Popen.wait`'s polling (docs/design/sandbox.md), where
  pidfds exist (Linux 5.3+).
  """
  try:
    pidfd = os.pidfd_open(proc.pid)
  except (AttributeError, OSError):
    try:
      proc.wait(timeout=max(0.0, timeout))
      return True
    except subprocess.TimeoutExpired:
      return False
  try:
    ready, _, _ = select.select([pidfd], [], [], max(0.0, timeout))
  finally:
    os.close(pidfd)
  if ready:
    proc.wait()  # Exited: reaps at once.
    return True
  return proc.poll() is not None


class _ForkServer:
  """One bubblewrap sandbox whose PID 1 forks a warm interpreter per program.

  The protocol and the server's invariants are sandbox_server.py's. The
  sandbox is one process group, reported to `on_spawn` so that the pool kills
  it with a worker it had to kill.
  """

  def __init__(self, on_spawn: Callable[[int, str], None]):
    root = isolation.SANDBOX_ROOT
    info_r, info_w = os.pipe()
    argv = isolation.command(
        [(_BOOT_SCRIPT, "sandbox_boot.py"), (_SERVER_SCRIPT, "server.py")],
        [isolation.interpreter(), "-I", "-S", "-B", f"{root}/server.py", root]
        + ["sandbox_boot.py", "server.py"],
        info_fd=info_w,
    )
    try:
      self.proc = subprocess.Popen(
          argv,
          stdin=subprocess.PIPE,
          stdout=subprocess.PIPE,
          stderr=subprocess.DEVNULL,
          cwd="/",
          env=sandbox_boot.program_env(root),
          # No preexec_fn: Python code between fork and exec can deadlock in
          # a threaded parent, and bubblewrap clears a parent-death signal.
          start_new_session=True,
          close_fds=True,
          pass_fds=(info_w,),
      )
    finally:
      os.close(info_w)
    # Open as long as bwrap lives: bwrap writes to it after the child's pid,
    # and a closed read end killed it by SIGPIPE (about one start in three).
    self._info_r = info_r
    isolation.read_child_pid(info_r)
    on_spawn(self.proc.pid, "")

  def run(
      self, source: str, stdin: str, ctx: registry.VerifyContext
  ) -> Optional[ProgramResult]:
    """The program's result, or None if the server died or did not answer."""
    wall_s = max(0.0, ctx.deadline - time.monotonic())
    request = json.dumps(
        {
            "source": source,
            "stdin": stdin,
            "cpu_s": ctx.code_cpu_s,
            "memory_mb": ctx.code_memory_mb,
            "wall_s": wall_s,
        }
    ).encode()
    try:
      self.proc.stdin.write(struct.pack(">I", len(request)) + request)
      self.proc.stdin.flush()
    except OSError:
      return None
    deadline = time.monotonic() + wall_s + _SERVER_GRACE_S
    header = self._read(4, deadline)
    body = header and self._read(struct.unpack(">I", header)[0], deadline)
    if not body:
      return None
    answer = json.loads(body)
    return ProgramResult(
        answer["returncode"],
        base64.b64decode(answer["stdout"]),
        answer["timed_out"],
    )

  def _read(self, n: int, deadline: float) -> Optional[bytes]:
    fd, chunks = self.proc.stdout.fileno(), []
    while n:
      timeout = max(0.0, deadline - time.monotonic())
      ready, _, _ = select.select([fd], [], [], timeout)
      chunk = os.read(fd, n) if ready else b""
      if not chunk:
        return None
      chunks.append(chunk)
      n -= len(chunk)
    return b"".join(chunks)

  def close(self, on_reap: Callable[[int], None]) -> None:
    """Kills the sandbox (all of its processes) and reaps it."""
    _kill(self.proc.pid, os.killpg)
    self.proc.wait()
    for pipe in (self.proc.stdin, self.proc.stdout):
      try:
        pipe.close()
      except OSError:
        pass
    os.close(self._info_r)
    on_reap(self.proc.pid)


_server: Optional[_ForkServer] = None  # This process's, started on first use.


def uses_fork_server(code_isolation: str, code_fork_server: bool) -> bool:
  """Whether programs run in this process's fork server (under bubblewrap)."""
  return code_fork_server and isolation.use_bwrap(code_isolation)


def start_server(on_spawn: Callable[[int, str], None]) -> None:
  """Starts this process's fork server now rather than at its first program."""
  global _server
  if _server is None:
    _server = _ForkServer(on_spawn)


def stop_server(on_reap: Callable[[int], None] = lambda pgid: None) -> None:
  """Kills this process's fork server, if any (also at interpreter exit).

  bubblewrap drops its capabilities, which clears the parent-death signal
  set for it: the sandbox must be killed by whoever owns it.
  """
  global _server
  if _server is not None:
    _server.close(on_reap)
    _server = None


atexit.register(stop_server)


def _run_in_server(
    source: str, stdin: str, ctx: registry.VerifyContext
) -> ProgramResult:
  """`run_program` through this process's fork server (restarted if dead)."""
  global _server
  for attempt in range(2):
    if _server is not None and _server.proc.poll() is not None:
      _server.close(ctx.on_reap)
      _server = None
    if _server is None:
      _server = _ForkServer(ctx.on_spawn)
    result = _server.run(source, stdin, ctx)
    if result is not None:
      return result
    # Hung or dead: the next program gets a new sandbox. A server killed
    # from outside before its deadline (no program can kill it) is retried
    # once in a new one.
    _server.close(ctx.on_reap)
    _server = None
    timed_out = time.monotonic() >= ctx.deadline
    if timed_out or attempt:
      return ProgramResult(-signal.SIGKILL, b"", timed_out)


def run_program(
    source: str, stdin: str, ctx: registry.VerifyContext
) -> ProgramResult:
  """Runs `source` as a sandboxed Python program, fed `stdin`.

  `ctx` gives the deadline, the CPU and memory limits and the spawn/reap
  hooks. The process group is killed and the temp dir removed on return.
  """
  if uses_fork_server(ctx.code_isolation, ctx.code_fork_server):
    return _run_in_server(source, stdin, ctx)
  _libc()  # Load libc before forking, not inside the child.
  tmp = tempfile.mkdtemp(prefix=TEMP_PREFIX)
  info = []  # bwrap's info pipe.
  try:
    program = os.path.join(tmp, "main.py")
    with open(program, "w", encoding="utf-8", errors="replace") as f:
      f.write(source)
    with open(
        os.path.join(tmp, "stdin"), "w", encoding="utf-8", errors="replace"
    ) as f:
      f.write(stdin)
    out_path = os.path.join(tmp, "stdout")
    with open(os.path.join(tmp, "stdin"), "rb") as fin, open(
        out_path, "wb"
    ) as fout:
      proc, child = _launch(tmp, program, fin, fout, ctx, info)
    ctx.on_spawn(proc.pid, tmp)
    timed_out = True
    try:
      timed_out = not _wait(proc, ctx.deadline - time.monotonic())
    finally:
      if child is not None and proc.poll() is None:
        # bubblewrap's program first, so that bwrap reaps it and exits; what
        # is left is killed with its group below.
        _kill(child, os.kill)
        _wait(proc, _BWRAP_EXIT_S)
      _kill(proc.pid, os.killpg)
      proc.wait()
      ctx.on_reap(proc.pid)
    with open(out_path, "rb") as f:
      stdout = f.read(MAX_OUTPUT_BYTES)
    returncode = proc.returncode
    if child is not None and returncode > 128:
      # bwrap exits 128 + the signal that killed its program.
      returncode = 128 - returncode
    return ProgramResult(returncode, stdout, timed_out)
  finally:
    for fd in info:
      os.close(fd)
    shutil.rmtree(tmp, ignore_errors=True)


def _text(value: Any, what: str) -> str:
  if isinstance(value, str):
    return value
  if isinstance(value, list) and all(isinstance(v, str) for v in value):
    return "\n".join(value)
  raise ValueError(
      f"Code test {what} must be a string or a list of strings, "
      f"got {type(value).__name__}"
  )


def parse_tests(answer: str) -> Union[str, list[tuple[str, str]]]:
  """A code record's tests: [(stdin, expected stdout)], or Python test code.

  JSON cases are `{"inputs": [...], "outputs": [...]}` or
  `[{"input": ..., "output": ...}, ...]`; anything else is test code.

  Raises:
    ValueError: no tests, or JSON that is not one of the case forms.
  """
  text = answer.strip()
  if not text:
    raise ValueError("A code record has no tests in its 'answer' field")
  if not text.startswith(("{", "[")):
    return answer
  try:
    spec = json.loads(text)
  except json.JSONDecodeError as e:
    raise ValueError(f"Code tests look like JSON but do not parse: {e}") from e
  if isinstance(spec, dict) and {"inputs", "outputs"} <= spec.keys():
    pairs = list(zip(spec["inputs"], spec["outputs"], strict=True))
  elif isinstance(spec, list) and all(
      isinstance(c, dict) and {"input", "output"} <= c.keys() for c in spec
  ):
    pairs = [(c["input"], c["output"]) for c in spec]
  else:
    raise ValueError(
        'Code tests must be {"inputs": [...], "outputs": [...]} or '
        '[{"input": ..., "output": ...}, ...]'
    )
  if not pairs:
    raise ValueError("A code record has an empty list of test cases")
  return [(_text(i, "input"), _text(o, "output")) for i, o in pairs]


def _lines(text: str) -> list[str]:
  lines = [line.rstrip() for line in text.splitlines()]
  while lines and not lines[-1]:
    lines.pop()
  return lines


@registry.register_verifier("code", kind="code")
def verify_code(
    completion: str,
    record: Mapping[str, Any],
    ctx: registry.VerifyContext,
    option: str,
) -> float:
  """1.0 if the completion's program passes every test of the record."""
  del option
  tests = parse_tests(record["answer"])
  program = extract.extract_code(completion)
  if program is None:
    return 0.0
  if isinstance(tests, str):
    return float(run_program(f"{program}\n\n{tests}\n", "", ctx).ok)
  for stdin, expected in tests:
    result = run_program(program, stdin, ctx)
    if not result.ok:
      return 0.0
    if _lines(result.stdout.decode("utf-8", errors="replace")) != _lines(
        expected
    ):
      return 0.0
  return 1.0
