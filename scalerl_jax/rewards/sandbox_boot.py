"""Runs a program under an audit hook: `sandbox_boot.py <root_dir> <program>`.

Run by `python -I -S -B` (standard library only). Before the program starts,
a hook is installed that exits at once with VIOLATION_EXIT_CODE on sockets,
process creation or signals, rlimit changes, ctypes, and writes or path
changes outside root_dir; reads pass. A guard against accidents, not a
security boundary. It also holds a program's rlimits and environment, for
code_sandbox.py and sandbox_server.py alike. Design: docs/design/sandbox.md.
"""

import math
import os
import resource
import sys

# Exit status of a program stopped by the hook.
VIOLATION_EXIT_CODE = 113
# RLIMIT_FSIZE: the largest file (stdout included) a program may write.
MAX_OUTPUT_BYTES = 8 << 20
_MAX_OPEN_FILES = 64

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


def main(argv):
  """Reads the program, installs the hook, runs the program as __main__."""
  root, program = argv[1], argv[2]
  with open(program, encoding="utf-8", errors="replace") as f:
    source = f.read()
  sys.argv = [program]
  code = compile(source, program, "exec")
  sys.addaudithook(make_hook(root))
  exec(code, {"__name__": "__main__", "__builtins__": __builtins__})


if __name__ == "__main__":
  main(sys.argv)
