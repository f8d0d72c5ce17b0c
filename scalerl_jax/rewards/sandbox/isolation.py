"""The sandbox's boundary: bubblewrap (Debian's `bubblewrap` package).

rewards.code_isolation: `auto` and `bwrap` run generated code under
bubblewrap and stop, naming the install command, where it does not run;
`python` runs it under the audit hook and rlimits alone, which is no security
boundary (trusted code only). There is no fallback from one to the other.
Design: docs/design/sandbox.md; attacks: docs/reliability.md.
"""

from __future__ import annotations

import functools
import itertools
import os
import shutil
import signal
import subprocess
import sys
import time
from typing import Any, Optional, Sequence

from absl import logging

from scalerl_jax.rewards.sandbox import seccomp

# What `config.rewards.code_isolation` allows.
MODES = ("auto", "bwrap", "python")
SANDBOX_ROOT = "/sandbox"  # The program's directory inside bubblewrap.
TMPFS_BYTES = 64 << 20  # Size of SANDBOX_ROOT: all a program may write.
INSTALL = "apt-get install bubblewrap"
# Most tasks (processes and threads) one sandbox may hold, bubblewrap and the
# sandbox's server included: a pids cgroup's ceiling (`pids_cgroup`), which
# no program can lift, root or not (RLIMIT_NPROC does not bind root).
MAX_TASKS = 64
_CGROUP_FS = "/sys/fs/cgroup"
_CGROUP_PREFIX = "scalerl_sandbox_"
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
  request pipe closes (server.py), taking the namespace with it;
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


def _own_pids_cgroup_dirs() -> list[str]:
  """Directories of this process's cgroup in each hierarchy that may hold a
  pids controller: cgroup v1's `pids`, then v2's (pure or hybrid)."""
  dirs = []
  try:
    with open("/proc/self/cgroup") as f:
      lines = f.read().splitlines()
  except OSError:
    return dirs
  for line in lines:
    _, controllers, path = line.split(":", 2)
    path = path.lstrip("/")
    if "pids" in controllers.split(","):
      dirs.append(os.path.join(_CGROUP_FS, "pids", path))
    elif controllers == "":
      for mount in (_CGROUP_FS, os.path.join(_CGROUP_FS, "unified")):
        dirs.append(os.path.join(mount, path))
  return dirs


@functools.cache
def pids_cgroup_parent() -> tuple[Optional[str], str]:
  """(where this process can make pids cgroups, None if nowhere; why not)."""
  why = "no pids cgroup hierarchy is mounted"
  for parent in _own_pids_cgroup_dirs():
    _remove_orphaned_cgroups(parent)
    probe = os.path.join(parent, f"{_CGROUP_PREFIX}{os.getpid()}_probe")
    try:
      os.mkdir(probe)
    except OSError as e:
      why = f"cannot make a cgroup in {parent}: {e.strerror}"
      continue
    try:
      with open(os.path.join(probe, "pids.max"), "w") as f:
        f.write(str(MAX_TASKS))
      return parent, ""
    except OSError as e:
      why = f"{parent} has no pids controller for its children ({e.strerror})"
    finally:
      os.rmdir(probe)
  return None, why


_cgroup_ids = itertools.count()


def _remove_orphaned_cgroups(parent: str, kill: bool = False) -> None:
  """Removes the sandbox cgroups of processes that died (killed before they
  could remove them): the empty ones, or with `kill` all, killing what is
  left in them."""
  try:
    names = os.listdir(parent)
  except OSError:
    return
  for name in names:
    if not name.startswith(_CGROUP_PREFIX):
      continue
    owner = name[len(_CGROUP_PREFIX) :].split("_")[0]
    if owner.isdigit() and not os.path.exists(f"/proc/{owner}"):
      path = os.path.join(parent, name)
      if kill:
        remove_cgroup(path)
        continue
      try:
        os.rmdir(path)
      except OSError:
        pass  # Not empty yet, or another process's sweep won.


def sweep_cgroups() -> None:
  """Removes the sandbox cgroups whose owner died, killing what is left in
  them; for the reward pool once it has killed its workers."""
  parent, _ = pids_cgroup_parent()
  if parent is not None:
    _remove_orphaned_cgroups(parent, kill=True)


def pids_cgroup() -> Optional[str]:
  """A new pids cgroup capped at MAX_TASKS (its directory), or None where
  none can be made here; the first None logs a warning saying why."""
  parent, why = pids_cgroup_parent()
  if parent is None:
    _warn_no_ceiling(why)
    return None
  path = os.path.join(
      parent, f"{_CGROUP_PREFIX}{os.getpid()}_{next(_cgroup_ids)}"
  )
  os.mkdir(path)
  with open(os.path.join(path, "pids.max"), "w") as f:
    f.write(str(MAX_TASKS))
  return path


@functools.cache
def _warn_no_ceiling(why: str) -> None:
  logging.warning(
      "SANDBOX: %s, so a sandboxed program's processes are bounded only by "
      "its deadline (docs/reliability.md, fork flood).",
      why,
  )


def in_cgroup(path: Optional[str], argv: Sequence[str]) -> list[str]:
  """`argv` run in the cgroup `path` (None: as is), from its first
  instruction: a shell joins it, then becomes `argv` (exec)."""
  if path is None:
    return list(argv)
  procs = os.path.join(path, "cgroup.procs")
  return ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', procs, *argv]


def remove_cgroup(path: Optional[str], timeout_s: float = 2.0) -> None:
  """Kills whatever is left in the cgroup `path`, then removes it."""
  if path is None:
    return
  deadline = time.monotonic() + timeout_s
  while True:
    try:
      with open(os.path.join(path, "cgroup.procs")) as f:
        pids = [int(line) for line in f if line.strip()]
    except FileNotFoundError:
      return
    for pid in pids:
      try:
        os.kill(pid, signal.SIGKILL)
      except ProcessLookupError:
        pass
    try:
      os.rmdir(path)
      return
    except OSError:  # Busy until its last task is reaped.
      if time.monotonic() > deadline:
        logging.warning("SANDBOX: could not remove the cgroup %s", path)
        return
      time.sleep(0.01)
