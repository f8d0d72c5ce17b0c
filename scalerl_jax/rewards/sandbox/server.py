"""A sandbox's server: `server.py <root> <keep>...`, one program per request.

Run by `python -I -S -B` (standard library only), under bubblewrap as PID 1
of the sandbox's namespaces, or without it (rewards.code_isolation='python')
as a plain process. Requests come on fd 0, one at a time: a 12-byte header
(big-endian body length, wall-clock seconds as a double) and a `marshal`ed
dict `{source, stdin, calls, cpu_s, memory_mb}` from the host; each answer
on fd 1 is `ANSWER` (return code, timed out, the two lengths) followed by
the program's stdout and its report (boot.py).

Per request the server forks a runner, which forks the program's process
(boot.run_child) in a fresh directory under `root` and collects its
output and report. Invariants: the server runs no program code and holds no
program data (the request is spliced into a memfd, the answer sent from
one), so a program that reads the server's memory finds nothing of another;
after every run, as PID 1, it kills every other process of the sandbox and
empties `root` but for its `keep` entries, and stops if it cannot, so
nothing one program leaves reaches the next. Design: docs/design/sandbox.md.
"""

# The C half of `signal`, which imports enum, which every fresh sandbox would
# pay for.
import _signal as signal
import marshal
import os
import select
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import boot  # pylint: disable=g-import-not-at-top,wrong-import-position

_HEADER = struct.Struct(">Id")
# Return code, timed out, stdout's and the report's lengths.
ANSWER = struct.Struct(">i?II")
_RUNNER_GRACE_S = 1.0  # Past the program's deadline, for its runner.
# The answer when the runner died before answering (a program may kill it).
_NO_ANSWER = ANSWER.pack(-signal.SIGKILL, False, 0, 0)


def _read_exactly(fd, n):
  chunks = []
  while n:
    chunk = os.read(fd, min(n, 1 << 16))
    if not chunk:
      return None
    chunks.append(chunk)
    n -= len(chunk)
  return b"".join(chunks)


def _write_all(fd, data):
  while data:
    data = data[os.write(fd, data) :]


def _read(fd, chunks):
  """Appends the next chunk of `fd`; False at EOF or past MAX_OUTPUT_BYTES."""
  chunk = os.read(fd, 1 << 16)
  chunks.append(chunk)
  return bool(chunk) and sum(map(len, chunks)) <= boot.MAX_OUTPUT_BYTES


def _drain(fd, chunks):
  """Appends what `fd` holds now; a writer left alive is not waited for."""
  os.set_blocking(fd, False)
  try:
    while _read(fd, chunks):
      pass
  except BlockingIOError:
    pass


def _collect(pid, pipes, wall_s):
  """Reads the program's pipes until it exits, overflows one, or its deadline.

  Kills its process group (as PID 1 the server kills the rest). Returns what
  each pipe held (capped), its return code, and whether the deadline passed.
  """
  deadline = time.monotonic() + wall_s
  pidfd = os.pidfd_open(pid)
  chunks = {fd: [] for fd in pipes}
  open_ = set(pipes)
  timed_out = overflowed = False
  while not overflowed:
    timeout = deadline - time.monotonic()
    ready, _, _ = select.select([pidfd, *open_], [], [], max(0.0, timeout))
    if not ready:
      timed_out = True
      break
    for fd in set(ready) & open_:
      if not _read(fd, chunks[fd]):
        open_.discard(fd)
        overflowed = bool(chunks[fd][-1])
    if pidfd in ready:
      break
  for kill in (os.kill, os.killpg):
    try:
      kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
      pass
  _, status = os.waitpid(pid, 0)
  os.close(pidfd)
  for fd in open_:
    _drain(fd, chunks[fd])
  returncode = (
      -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
  )
  out = [b"".join(chunks[fd])[: boot.MAX_OUTPUT_BYTES] for fd in pipes]
  return out, returncode, timed_out


def _runner(request_fd, answer_fd, run_dir, wall_s):
  """The forked runner: runs one request's program, writes the answer."""
  status = 1
  try:
    size = os.fstat(request_fd).st_size
    request = marshal.loads(os.pread(request_fd, size, 0))
    os.mkdir(run_dir, 0o700)
    with open(
        os.path.join(run_dir, "stdin"), "w", encoding="utf-8", errors="replace"
    ) as f:
      f.write(request["stdin"])
    stdout_r, stdout_w = os.pipe()
    result_r, result_w = os.pipe()
    pid = os.fork()
    if pid == 0:
      boot.run_child(run_dir, request, stdout_w, result_w)
    os.close(stdout_w)
    os.close(result_w)
    (stdout, result), returncode, timed_out = _collect(
        pid, [stdout_r, result_r], wall_s
    )
    header = ANSWER.pack(returncode, timed_out, len(stdout), len(result))
    _write_all(answer_fd, header + stdout + result)
    status = 0
  finally:
    os._exit(status)  # Never back into the server's loop.


def _sweep():
  """As PID 1: kills and reaps every other process of the namespace."""
  while True:
    try:
      os.kill(-1, signal.SIGKILL)  # All but this one, as PID 1.
    except ProcessLookupError:
      pass
    try:
      os.waitpid(-1, 0)
    except ChildProcessError:
      return


def _remove(path):
  """Removes a tree as its owner, whatever modes the program left on it."""
  if os.path.isdir(path) and not os.path.islink(path):
    os.chmod(path, 0o700)
    for entry in os.listdir(path):
      _remove(os.path.join(path, entry))
    os.rmdir(path)
  else:
    os.unlink(path)


def _empty(root, keep):
  """Removes every entry of `root` but `keep`; False if one stays."""
  os.chmod(root, 0o700)
  for entry in set(os.listdir(root)) - keep:
    try:
      _remove(os.path.join(root, entry))
    except (OSError, RecursionError):
      return False
  return not set(os.listdir(root)) - keep


def _serve(requests, answers, root, keep, n):
  """Serves one request; False when the host has closed the pipe."""
  header = _read_exactly(requests, _HEADER.size)
  if header is None:
    return False
  size, wall_s = _HEADER.unpack(header)
  request_fd = os.memfd_create("request")
  answer_fd = os.memfd_create("answer")
  try:
    while size:  # From pipe to memfd in the kernel, past this heap.
      moved = os.splice(requests, request_fd, size)
      if not moved:
        return False
      size -= moved
    pid = os.fork()
    if pid == 0:
      os.close(requests)
      os.close(answers)
      _runner(request_fd, answer_fd, os.path.join(root, f"run{n}"), wall_s)
    pidfd = os.pidfd_open(pid)
    # The host writes nothing while a request runs: `requests` readable is
    # its end closing, its owner gone (killed: its death signal reaches no
    # further). The server leaves at once, as PID 1 taking the program along.
    ready, _, _ = select.select(
        [pidfd, requests], [], [], wall_s + _RUNNER_GRACE_S
    )
    os.close(pidfd)
    if pidfd not in ready:
      os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    if requests in ready and pidfd not in ready:
      return False
    if os.getpid() == 1:
      _sweep()
    if not _empty(root, keep):
      raise RuntimeError(f"the sandbox's {root} could not be emptied")
    size = os.fstat(answer_fd).st_size
    if status == 0 and size:
      offset = 0
      while offset < size:
        offset += os.sendfile(answers, answer_fd, offset, size - offset)
    else:
      _write_all(answers, _NO_ANSWER)
  finally:
    os.close(request_fd)
    os.close(answer_fd)
  return True


def main(argv):
  """Serves requests until the host closes fd 0."""
  root, keep = argv[1], set(argv[2:])
  # A program's signals to PID 1 are dropped unless it has a handler.
  signal.signal(signal.SIGINT, signal.SIG_DFL)
  requests, answers = os.dup(0), os.dup(1)
  null = os.open("/dev/null", os.O_RDWR)
  os.dup2(null, 0)
  os.dup2(null, 1)
  n = 0
  while _serve(requests, answers, root, keep, n):
    n += 1


if __name__ == "__main__":
  main(sys.argv)
