"""The sandbox's lower layer: bubblewrap (Debian's `bubblewrap` package).

`config.rewards.code_isolation` chooses what confines a candidate program
beneath the audit hook of `sandbox_boot.py` (which a program that reaches C
code can go around):

- `auto`: bubblewrap when it runs here, else the audit hook alone, with a
  warning at start-up (`check`);
- `bwrap`: bubblewrap, or the run stops at start-up;
- `python`: the audit hook and rlimits alone.

Under bubblewrap the program sees a fresh root holding only the system's
read-only `/usr` (and its `/bin`, `/lib` links), the interpreter's own prefix,
read-only, and `SANDBOX_ROOT`, a size-capped tmpfs holding its source, its
input and the boot script; no workdir, checkpoint, home directory or other
process. It runs in new user, PID, network, IPC, UTS and cgroup namespaces
with every capability dropped, and dies with its parent. docs/reliability.md
tabulates which layer stops which attack.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
from typing import Optional, Sequence

from absl import logging

MODES = ("auto", "bwrap", "python")  # What `config.rewards.code_isolation` allows.
SANDBOX_ROOT = "/sandbox"  # The program's directory inside bubblewrap.
TMPFS_BYTES = 64 << 20  # Size of SANDBOX_ROOT: all a program may write.
_CHILD_PID = re.compile(rb'"child-pid":\s*([0-9]+)')
_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32")


def _system_binds() -> list[str]:
  """Read-only binds of the system directories (symlinks kept as symlinks)."""
  args = []
  for path in _SYSTEM_DIRS:
    if os.path.islink(path):
      args += ["--symlink", os.readlink(path), path]
    elif os.path.isdir(path):
      args += ["--ro-bind", path, path]
  prefix = os.path.realpath(sys.base_prefix)
  if not prefix.startswith("/usr/"):
    args += ["--ro-bind", prefix, prefix]
  return args


def interpreter() -> str:
  """The Python the sandbox runs: the base interpreter, without the virtualenv."""
  return os.path.realpath(sys.executable)


def command(files: Sequence[tuple[str, str]], argv: Sequence[str],
            info_fd: Optional[int] = None) -> list[str]:
  """The bubblewrap command line that runs `argv` confined.

  The program is PID 1 of its namespace (`--as-pid-1`): bwrap waits for it
  itself, so no intermediate process outlives a run as a zombie.

  Args:
    files: (path outside, path inside SANDBOX_ROOT) of each file the program
      needs, bound read-only.
    argv: the command to run inside, with paths as the program sees them.
    info_fd: a descriptor bwrap writes the program's pid to (`read_child_pid`).

  Returns:
    The argument list for `subprocess.Popen`.
  """
  args = ["bwrap", "--unshare-all", "--as-pid-1", "--die-with-parent", "--cap-drop", "ALL",
          *_system_binds(), "--proc", "/proc", "--dev", "/dev",
          "--size", str(TMPFS_BYTES), "--tmpfs", SANDBOX_ROOT]
  for outside, inside in files:
    args += ["--ro-bind", outside, os.path.join(SANDBOX_ROOT, inside)]
  if info_fd is not None:
    args += ["--info-fd", str(info_fd)]
  return args + ["--chdir", SANDBOX_ROOT, "--", *argv]


def read_child_pid(info_r: int) -> Optional[int]:
  """The program's pid (outside its namespace) from bwrap's `--info-fd`.

  bwrap writes `{"child-pid": N` in one write once the program starts, and
  the closing brace only as it exits; keep `info_r` open until then (a closed
  pipe would SIGPIPE bwrap). None when bwrap exited before starting it.
  """
  text = b""
  while (match := _CHILD_PID.search(text)) is None:
    chunk = os.read(info_r, 4096)
    if not chunk:
      return None
    text += chunk
  return int(match.group(1))


@functools.cache
def bwrap_works() -> tuple[bool, str]:
  """(whether bubblewrap runs a confined interpreter here, why not)."""
  if shutil.which("bwrap") is None:
    return False, "bwrap is not installed (apt-get install bubblewrap)"
  try:
    run = subprocess.run(command([], [interpreter(), "-I", "-S", "-c", "pass"]),
                         capture_output=True, timeout=30, check=False)
  except (OSError, subprocess.TimeoutExpired) as e:
    return False, f"bwrap did not run: {e}"
  if run.returncode != 0:
    return False, (f"bwrap exited with status {run.returncode}: "
                   f"{run.stderr.decode(errors='replace').strip()[:300]}")
  return True, ""


def use_bwrap(mode: str) -> bool:
  """Whether a program runs under bubblewrap for `code_isolation=mode`."""
  if mode not in MODES:
    raise ValueError(f"rewards.code_isolation: {mode!r} is not one of {MODES}")
  return mode != "python" and bwrap_works()[0]


def check(mode: str) -> None:
  """Start-up check: raises or warns when the lower layer is not there.

  Raises:
    ValueError: an unknown mode.
    RuntimeError: mode `bwrap` and bubblewrap does not run here.
  """
  if use_bwrap(mode) or mode == "python":
    return
  why = bwrap_works()[1]
  if mode == "bwrap":
    raise RuntimeError(f"rewards.code_isolation='bwrap': {why}")
  logging.warning(
      "SANDBOX: %s. Generated code runs under the Python audit hook and rlimits alone, which "
      "code that reaches C (ctypes, _posixsubprocess) can go around, and which let it read "
      "your files (workdir, checkpoints, home). Install bubblewrap, or set "
      "rewards.code_isolation='python' to accept this (docs/reliability.md).", why)
