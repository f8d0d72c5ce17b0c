"""The sandbox's lower layer: bubblewrap (Debian's `bubblewrap` package).

rewards.code_isolation: `auto` uses bubblewrap where it runs, else warns at
start-up (`check`); `bwrap` requires it; `python` keeps the audit hook and
rlimits alone. Design: docs/design/sandbox.md; attacks: docs/reliability.md.
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

# What `config.rewards.code_isolation` allows.
MODES = ("auto", "bwrap", "python")
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
  """The Python the sandbox runs: the base interpreter, not the virtualenv."""
  return os.path.realpath(sys.executable)


def command(
    files: Sequence[tuple[str, str]],
    argv: Sequence[str],
    info_fd: Optional[int] = None,
) -> list[str]:
  """The bubblewrap argv that runs `argv` confined, as PID 1 of its namespace.

  `files` are (path outside, path inside SANDBOX_ROOT), bound read-only;
  `argv` names paths as the program sees them; bwrap writes the program's
  pid to `info_fd` (`read_child_pid`).
  """
  args = [
      "bwrap",
      "--unshare-all",
      "--as-pid-1",
      "--die-with-parent",
      "--cap-drop",
      "ALL",
      *_system_binds(),
      "--proc",
      "/proc",
      "--dev",
      "/dev",
      "--size",
      str(TMPFS_BYTES),
      "--tmpfs",
      SANDBOX_ROOT,
  ]
  for outside, inside in files:
    args += ["--ro-bind", outside, os.path.join(SANDBOX_ROOT, inside)]
  if info_fd is not None:
    args += ["--info-fd", str(info_fd)]
  return args + ["--chdir", SANDBOX_ROOT, "--", *argv]


def read_child_pid(info_r: int) -> Optional[int]:
  """The program's pid (outside its namespace) from bwrap's `--info-fd`.

  None when bwrap exited first. Keep `info_r` open until bwrap exits: a
  closed pipe would SIGPIPE it.
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
    run = subprocess.run(
        command([], [interpreter(), "-I", "-S", "-c", "pass"]),
        capture_output=True,
        timeout=30,
        check=False,
    )
  except (OSError, subprocess.TimeoutExpired) as e:
    return False, f"bwrap did not run: {e}"
  if run.returncode != 0:
    return False, (
        f"bwrap exited with status {run.returncode}: "
        f"{run.stderr.decode(errors='replace').strip()[:300]}"
    )
  return True, ""


def use_bwrap(mode: str) -> bool:
  """Whether a program runs under bubblewrap for `code_isolation=mode`."""
  if mode not in MODES:
    raise ValueError(f"rewards.code_isolation: {mode!r} is not one of {MODES}")
  return mode != "python" and bwrap_works()[0]


def check(mode: str) -> None:
  """Start-up check: raises, or under `auto` warns, without bubblewrap.

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
      "rewards.code_isolation='python' to accept this (docs/reliability.md).",
      why,
  )
