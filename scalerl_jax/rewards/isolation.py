"""The sandbox's boundary: bubblewrap (Debian's `bubblewrap` package).

rewards.code_isolation: `auto` and `bwrap` run generated code under
bubblewrap and stop, naming the install command, where it does not run;
`python` runs it under the audit hook and rlimits alone, which is no security
boundary (trusted code only). There is no fallback from one to the other.
Design: docs/design/sandbox.md; attacks: docs/reliability.md.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from typing import Any, Sequence

from absl import logging

from scalerl_jax.rewards import seccomp

# What `config.rewards.code_isolation` allows.
MODES = ("auto", "bwrap", "python")
SANDBOX_ROOT = "/sandbox"  # The program's directory inside bubblewrap.
TMPFS_BYTES = 64 << 20  # Size of SANDBOX_ROOT: all a program may write.
INSTALL = "apt-get install bubblewrap"
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


def seccomp_fd() -> int:
  """A pipe's read end holding the seccomp filter, for `command`.

  The caller passes it to bwrap and closes it once bwrap has started.

  Raises:
    RuntimeError: no filter for this machine's architecture.
  """
  filter_ = seccomp.program()
  if filter_ is None:
    raise RuntimeError(
        f"the sandbox's seccomp filter does not cover {os.uname().machine}"
    )
  read_end, write_end = os.pipe()
  try:
    os.write(write_end, filter_)  # Smaller than a pipe's buffer.
  finally:
    os.close(write_end)
  return read_end


def command(
    files: Sequence[tuple[str, str]],
    argv: Sequence[str],
    seccomp_read_end: int,
) -> list[str]:
  """The bubblewrap argv that runs `argv` confined, as PID 1 of its namespace.

  `files` are (path outside, path inside SANDBOX_ROOT), bound read-only;
  `argv` names paths as the program sees them; `seccomp_read_end` is
  `seccomp_fd()`'s. Only SANDBOX_ROOT, a size-capped tmpfs, is writable:
  `/` and `/dev` are remounted read-only, and there is no `/proc`.

  No `--die-with-parent` and no `--info-fd`: either let bwrap die alone
  (SIGKILL when its parent dies, SIGPIPE when the reader of its info pipe
  is gone) while its child, PID 1 of the new namespace, waited in its set-up
  for a word from it, and that child then waited forever (a `bwrap` whose
  parent is init, immune to SIGTERM). The sandbox ends with its owner
  instead because its PID 1, the server, exits once the owner's end of its
  request pipe closes (sandbox_server.py), taking the namespace with it;
  its owner kills bwrap's whole process group, that child included.
  """
  args = [
      "bwrap",
      "--unshare-all",
      "--as-pid-1",
      "--cap-drop",
      "ALL",
      *_system_binds(),
      "--dev",
      "/dev",
      "--size",
      str(TMPFS_BYTES),
      "--tmpfs",
      SANDBOX_ROOT,
  ]
  for outside, inside in files:
    args += ["--ro-bind", outside, os.path.join(SANDBOX_ROOT, inside)]
  args += ["--remount-ro", "/dev", "--remount-ro", "/"]
  args += ["--seccomp", str(seccomp_read_end)]
  return args + ["--chdir", SANDBOX_ROOT, "--", *argv]


@functools.cache
def bwrap_works() -> tuple[bool, str]:
  """(whether bubblewrap runs a confined interpreter here, why not)."""
  if shutil.which("bwrap") is None:
    return False, f"bwrap is not installed ({INSTALL})"
  try:
    filter_fd = seccomp_fd()
  except RuntimeError as e:
    return False, str(e)
  try:
    run = subprocess.run(
        command([], [interpreter(), "-I", "-S", "-c", "pass"], filter_fd),
        capture_output=True,
        timeout=30,
        check=False,
        pass_fds=(filter_fd,),
    )
  except (OSError, subprocess.TimeoutExpired) as e:
    return False, f"bwrap did not run: {e}"
  finally:
    os.close(filter_fd)
  if run.returncode != 0:
    return False, (
        f"bwrap exited with status {run.returncode}: "
        f"{run.stderr.decode(errors='replace').strip()[:300]}"
    )
  return True, ""


def use_bwrap(mode: str) -> bool:
  """Whether a program runs under bubblewrap for `code_isolation=mode`.

  Raises:
    ValueError: an unknown mode.
    RuntimeError: mode `auto` or `bwrap`, and bubblewrap does not run here.
  """
  if mode not in MODES:
    raise ValueError(f"rewards.code_isolation: {mode!r} is not one of {MODES}")
  if mode == "python":
    _warn_no_boundary()
    return False
  works, why = bwrap_works()
  if not works:
    raise RuntimeError(
        f"rewards.code_isolation={mode!r}: {why}. Generated code runs only "
        f"under bubblewrap: install it ({INSTALL}), or, for trusted code only, "
        "set rewards.code_isolation='python', which is no security boundary "
        "(docs/design/sandbox.md)"
    )
  return True


@functools.cache
def _warn_no_boundary() -> None:
  logging.warning(
      "SANDBOX: rewards.code_isolation='python': generated code runs under the "
      "Python audit hook and rlimits alone, which is no security boundary; "
      "use it for trusted code only (docs/design/sandbox.md)."
  )


def check(mode: str, scores_code: bool = True) -> None:
  """Start-up check of `code_isolation=mode` for a run.

  Raises where `use_bwrap` would, if the run `scores_code`; mode `bwrap`
  requires bubblewrap whatever the run scores.
  """
  if scores_code or mode == "bwrap":
    use_bwrap(mode)
  elif mode not in MODES:
    raise ValueError(f"rewards.code_isolation: {mode!r} is not one of {MODES}")


def config_scores_code(config: Any) -> bool:
  """Whether a run's config sends records to the code verifier.

  What the config names: `rewards.verifier='code'`, or a source or mixture
  domain of the built-in code domain or with verifier `code`. Records of a
  JSONL or TFDS source that name `code` themselves are caught by the pool
  (`RewardPool.score` raises on the first one).
  """
  if config.rewards.verifier == "code" or config.data.source == "builtin_code":
    return True
  return any(
      domain.get("source") == "builtin_code" or domain.get("verifier") == "code"
      for domain in (config.data.get("mixture", None) or {}).values()
  )
