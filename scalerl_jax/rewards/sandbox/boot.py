"""The program's process in the sandbox: confinement, the run, its report.

Imported by server.py inside the sandbox (standard library only).
`run_child` confines the forked process (descriptors, rlimits, environment,
an audit hook that exits at once with VIOLATION_EXIT_CODE on sockets,
process creation or signals, rlimit changes, ctypes, and writes or path
changes outside its directory), runs the program as `__main__`, then the
record's calls, and reports on fd 3 one message: a 4-byte big-endian length
and JSON `{"status": ..., "values": [...]}`, each value plain data (`encode`).
It imports no module that imports `re` (json does), which every fresh
sandbox would pay for.
The hook is a guard against accidents, not a boundary; and since everything
here runs in the program's process, the message is the program's to forge:
it carries values only, which the verifier compares with expected values
that never enter the sandbox (code_tests.py). Design: docs/design/sandbox.md.
"""

# The C half of the json package: without it json imports re, which a fresh
# sandbox pays for at every program.
import _json
import binascii
import builtins
import io
import math
import os
import resource
import struct
import sys

# Exit status of a program stopped by the hook.
VIOLATION_EXIT_CODE = 113
# Most bytes of stdout, and of the report, that are read back.
MAX_OUTPUT_BYTES = 8 << 20
RESULT_FD = 3  # The report's descriptor in the program's process.
_MAX_OPEN_FILES = 64
_MAX_DEPTH = 100  # code_tests.MAX_DEPTH.
_SMALL_INT = 1 << 62  # Larger ints travel as hex (no digit limit).
_EXIT = '{"status": "exit"}'

_BLOCKED_EVENTS = frozenset(
    {
        "os.exec",
        "os.fork",
        "os.forkpty",
        "os.posix_spawn",
        "os.spawn",
        "os.system",
        "subprocess.Popen",
        "os.kill",
        "os.killpg",
        "resource.setrlimit",
        "resource.prlimit",
    }
)
_BLOCKED_PREFIXES = ("socket.", "ctypes.")
# Path-changing events -> how many of their leading arguments are paths.
_PATH_EVENTS = {
    "os.chmod": 1,
    "os.chown": 1,
    "os.link": 2,
    "os.mkdir": 1,
    "os.remove": 1,
    "os.removexattr": 1,
    "os.rename": 2,
    "os.rmdir": 1,
    "os.setxattr": 1,
    "os.symlink": 2,
    "os.truncate": 1,
    "os.utime": 1,
    "shutil.rmtree": 1,
}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def program_env(root):
  """The whole environment of a program whose directory is `root`."""
  return {
      "PATH": "/usr/bin:/bin",
      "HOME": root,
      "TMPDIR": root,
      "LANG": "C.UTF-8",
      "PYTHONHASHSEED": "0",
  }


def _set_limit(which, soft, hard):
  """Lowers a limit; a hard limit already below the request is kept."""
  _, current = resource.getrlimit(which)
  if current != resource.RLIM_INFINITY:
    soft, hard = min(soft, current), min(hard, current)
  resource.setrlimit(which, (soft, hard))


def set_limits(cpu_s, memory_mb):
  """A program's rlimits: CPU, address space, file size, processes, files."""
  cpu = max(1, math.ceil(cpu_s))
  # SIGXCPU at the soft limit; SIGKILL a second later if the program catches it.
  _set_limit(resource.RLIMIT_CPU, cpu, cpu + 1)
  _set_limit(resource.RLIMIT_AS, memory_mb << 20, memory_mb << 20)
  _set_limit(resource.RLIMIT_FSIZE, MAX_OUTPUT_BYTES, MAX_OUTPUT_BYTES)
  _set_limit(resource.RLIMIT_NPROC, 0, 0)
  _set_limit(resource.RLIMIT_NOFILE, _MAX_OPEN_FILES, _MAX_OPEN_FILES)
  _set_limit(resource.RLIMIT_CORE, 0, 0)


def _violation(event):
  os.write(2, f"sandbox: {event} is not allowed\n".encode())
  os._exit(VIOLATION_EXIT_CODE)


def make_hook(root):
  """The audit hook (for `sys.addaudithook`) confining changes to `root`."""
  root = os.path.realpath(root)

  def inside(path):
    if isinstance(path, int):
      return True  # A descriptor, opened earlier under this same hook.
    try:
      full = os.path.realpath(os.fsdecode(path))
    except (TypeError, ValueError):
      return False
    return full == root or full.startswith(root + os.sep)

  def hook(event, args):
    if event in _BLOCKED_EVENTS or event.startswith(_BLOCKED_PREFIXES):
      _violation(event)
    elif event == "open":
      path, _, flags = args
      if isinstance(flags, int) and flags & _WRITE_FLAGS and not inside(path):
        _violation(f"writing {path!r}")
    elif event in _PATH_EVENTS:
      for path in args[: _PATH_EVENTS[event]]:
        if not inside(path):
          _violation(f"{event} on {path!r}")

  return hook


class NotData(Exception):
  """A value that is not plain data."""


_TAGS = {tuple: "t", set: "s", frozenset: "f"}


def encode(value, depth=0):
  """Plain data as JSON text; raises NotData for anything else.

  Exact types only (a subclass may carry its own __eq__): None, bool, int,
  float, str, bytes, complex, and lists, tuples, sets, frozensets and dicts
  of them. Non-JSON types are tagged, as code_tests._decode reads them.
  """
  kind = type(value)
  if value is None:
    return "null"
  if kind is bool:
    return "true" if value else "false"
  if kind is str:
    return _json.encode_basestring_ascii(value)
  if kind is float:
    return _float(value)
  if kind is int:
    if -_SMALL_INT < value < _SMALL_INT:
      return int.__repr__(value)
    return '{"i": "%s"}' % hex(value)
  if kind is bytes:
    return '{"b": "%s"}' % binascii.b2a_base64(value, newline=False).decode()
  if kind is complex:
    return '{"c": [%s, %s]}' % (_float(value.real), _float(value.imag))
  if depth >= _MAX_DEPTH:
    raise NotData("nested too deeply")
  if kind is list:
    return "[%s]" % ", ".join(encode(v, depth + 1) for v in value)
  if kind in _TAGS:
    items = ", ".join(encode(v, depth + 1) for v in value)
    return '{"%s": [%s]}' % (_TAGS[kind], items)
  if kind is dict:
    pairs = ", ".join(
        "[%s, %s]" % (encode(k, depth + 1), encode(v, depth + 1))
        for k, v in value.items()
    )
    return '{"d": [%s]}' % pairs
  raise NotData(kind.__name__)


def _float(value):
  if value != value:
    return "NaN"
  if value in (math.inf, -math.inf):
    return "Infinity" if value > 0 else "-Infinity"
  return float.__repr__(value)


def _execute(request, namespace):
  """Runs the program, then its calls; the report's message."""
  calls = request["calls"]
  code = compile(request["source"], sys.argv[0], "exec")
  compiled = []
  if calls is not None:
    setup = compile(calls["setup"], "<tests>", "exec")
    for call in calls["calls"]:
      compiled.append(
          compile(call["expr"], "<tests>", "eval") if "expr" in call else call
      )
  sys.addaudithook(make_hook(os.getcwd()))
  try:
    exec(code, namespace)  # pylint: disable=exec-used
  except SystemExit as e:
    # Leaving early is how a stdin/stdout program may end; a program whose
    # functions are called has not answered before they are.
    if calls is not None or e.code not in (None, 0):
      return _EXIT
  if calls is None:
    sys.stdout.flush()
    return '{"status": "ok"}'
  exec(setup, namespace)  # pylint: disable=exec-used
  values = []
  for call in compiled:
    if isinstance(call, dict):
      value = namespace[call["fn"]](*call["args"])
    else:
      value = eval(call, namespace)  # pylint: disable=eval-used
    values.append(encode(value))
  return '{"status": "ok", "values": [%s]}' % ", ".join(values)


def _report(message, write):
  try:
    body = message.encode()
  except Exception:  # pylint: disable=broad-except
    body = b'{"status": "not_data"}'
  data = struct.pack(">I", len(body)) + body
  while data:
    data = data[write(RESULT_FD, data) :]


def _descriptors(stdout_fd, result_fd):
  """0: the input file, 1: stdout, 2: /dev/null, 3: the report; no others."""
  fds = [
      os.open("stdin", os.O_RDONLY),
      stdout_fd,
      os.open("/dev/null", os.O_WRONLY),
      result_fd,
  ]
  # Above every target first, so that no dup2 overwrites a source.
  high = [os.dup(fd) for fd in fds]
  for target, fd in enumerate(high):
    os.dup2(fd, target)
  os.closerange(len(fds), 1 << 16)


def run_child(run_dir, request, stdout_fd, result_fd):
  """The forked program's process: confines it, runs it, reports; never returns.

  Exits 0 after a run to its end, the status of a SystemExit, else 1.
  """
  exit_, write = os._exit, os.write  # Bound before the program may patch os.
  status, message = 1, '{"status": "error"}'
  try:
    os.setsid()
    os.chdir(run_dir)
    _descriptors(stdout_fd, result_fd)
    set_limits(request["cpu_s"], request["memory_mb"])
    os.environ.clear()
    os.environ.update(program_env(run_dir))
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False))
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False))
    sys.argv = [os.path.join(run_dir, "main.py")]
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    message = _execute(request, namespace)
    status = 0 if message.startswith('{"status": "ok"') else 1
  except SystemExit as e:
    message = _EXIT
    status = e.code if isinstance(e.code, int) else 1
  except NotData:
    message = '{"status": "not_data"}'
  except BaseException:  # pylint: disable=broad-except
    message = '{"status": "raised"}'
  try:
    sys.stdout.flush()
  except BaseException:  # pylint: disable=broad-except
    status = status or 1
  try:
    _report(message, write)
  finally:
    exit_(status & 0xFF)
