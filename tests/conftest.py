"""Shared test settings: CPU only, and fail loudly on silent
broadcasting mistakes."""

import ctypes
import os
import shutil
import sys
import tempfile

# The test extras install libtpu (tests/aot_test.py compiles for TPU slices);
# without this every test process would first try to open a TPU it lacks.
# Subprocesses inherit it.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from tests import session_env  # pylint: disable=g-import-not-at-top

# LLVM -O0 for every program the tests compile (session_env.TEST_XLA_FLAGS).
if session_env.TEST_XLA_FLAGS not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = session_env.xla_flags(session_env.TEST_XLA_FLAGS)

import jax  # noqa: E402  # pylint: disable=g-import-not-at-top
import psutil  # noqa: E402  # pylint: disable=g-import-not-at-top
import pytest  # noqa: E402  # pylint: disable=g-import-not-at-top

jax.config.update("jax_numpy_rank_promotion", "raise")


def pytest_configure(config):
  """One shared directory and persistent compilation cache for the session.

  Set before pytest-xdist starts its workers, so the workers and every
  subprocess a test starts (they inherit the environment) reuse each other's
  compiled programs instead of compiling the same tiny configs again, and
  what helpers.built_once builds (the RL tests' base workdir). The
  executables are the same, so no result changes; only wall time.
  """
  if config.pluginmanager.hasplugin("xdist"):
    config.pluginmanager.register(_XdistLeftovers())
  # Bytecode on for the session, whatever the shell says: under
  # PYTHONDONTWRITEBYTECODE=1 (these machines set it) every worker and every
  # process a test starts compiled the whole package again on import (about
  # 2 s a process here) and pytest rewrote every test module in each worker.
  # The caches go to __pycache__ folders, which git ignores.
  os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
  sys.dont_write_bytecode = False
  if session_env.SHARED_DIR_ENV not in os.environ:
    config.scalerl_shared_dir = tempfile.mkdtemp(prefix="scalerl_jax_test_")
    os.environ[session_env.SHARED_DIR_ENV] = config.scalerl_shared_dir
  os.environ.setdefault(
      "JAX_COMPILATION_CACHE_DIR",
      os.path.join(os.environ[session_env.SHARED_DIR_ENV], "compile_cache"),
  )
  # Every program, however quick to compile: most of the tests' programs
  # compile in under the default second, and the workers compile many of the
  # same ones.
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
  jax.config.update(
      "jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"]
  )
  jax.config.update(
      "jax_persistent_cache_min_compile_time_secs",
      float(os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"]),
  )
  jax.config.update(
      "jax_persistent_cache_min_entry_size_bytes",
      int(os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"]),
  )


@pytest.hookimpl(trylast=True)  # After `-m` has deselected.
def pytest_collection_modifyitems(items):
  """The longest test files first, by their `slow` marker's `seconds`.

  `.ci/run` runs the slow tests a file per worker (`--dist loadfile`) in this
  order (`--no-loadscope-reorder`), so the short files fill in at the end
  instead of a long one starting last and running alone (docs/testing.md).
  The seconds are each file's measured worker time (2 cores, both workers
  busy); other tests keep their order.
  """
  seconds = {}
  for item in items:
    marker = item.get_closest_marker("slow")
    cost = marker.kwargs.get("seconds", 0) if marker else 0
    seconds[item.path] = max(seconds.get(item.path, 0), cost)
  items.sort(key=lambda item: -seconds[item.path])


def pytest_runtest_setup(item):
  """Skips a test marked `needs_bwrap` where bubblewrap does not run, before
  its fixtures (helpers.needs_bwrap)."""
  if item.get_closest_marker("needs_bwrap"):
    from tests import helpers  # pylint: disable=g-import-not-at-top

    helpers.needs_bwrap()


def pytest_terminal_summary(terminalreporter):
  """Says once why the `needs_bwrap` tests skipped and how to run them."""
  skipped = [
      report
      for report in terminalreporter.stats.get("skipped", [])
      if "needs_bwrap" in report.keywords
  ]
  if not skipped:
    return
  from scalerl_jax.rewards.sandbox import (
      isolation,  # pylint: disable=g-import-not-at-top
  )

  _, _, reason = skipped[0].longrepr
  terminalreporter.write_sep("=", "code sandbox tests skipped", yellow=True)
  terminalreporter.write_line(
      f"Skipped {len(skipped)} test(s) that run generated code in the code"
      f" sandbox: {reason.removeprefix('Skipped: ')}.\nThey run where"
      f" bubblewrap runs ({isolation.INSTALL}), as a run that scores code"
      " does (docs/design/sandbox.md)."
  )


# SCALERL_CHECK_LEFTOVERS=1: each test process (each pytest-xdist worker, or
# the one process without xdist) is the child subreaper of all it starts, so
# whatever a test orphans comes to it; at the end of the session any process
# still below it fails the session, named, and is killed.
_CHECK_LEFTOVERS = os.environ.get("SCALERL_CHECK_LEFTOVERS") == "1"
_PR_SET_CHILD_SUBREAPER = 36
_LEFTOVER_GRACE_S = 10.0


def _is_xdist_controller(config) -> bool:
  return bool(getattr(config.option, "numprocesses", None)) and not hasattr(
      config, "workerinput"
  )


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session):
  if _CHECK_LEFTOVERS and not _is_xdist_controller(session.config):
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1) != 0:
      raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")


class _XdistLeftovers:
  """pytest-xdist's hook, registered only where xdist is loaded (pytest
  refuses an unknown hook, as with `-p no:xdist`)."""

  @staticmethod
  def pytest_testnodedown(node, error):
    """The xdist controller collects what its workers found left."""
    del error
    left = node.workeroutput.get("scalerl_leftovers", [])
    node.config.scalerl_leftovers = (
        getattr(node.config, "scalerl_leftovers", []) + left
    )


def pytest_sessionfinish(session, exitstatus):
  """Fails the session if a process it started outlived the tests
  (SCALERL_CHECK_LEFTOVERS=1)."""
  del exitstatus
  if not _CHECK_LEFTOVERS:
    return
  if _is_xdist_controller(session.config):
    _fail_on_leftovers(
        session, getattr(session.config, "scalerl_leftovers", [])
    )
    return
  from scalerl_jax.rewards import (
      code_sandbox,  # pylint: disable=g-import-not-at-top
  )

  code_sandbox.stop_server()  # This process's own fork server, if any.
  _, alive = psutil.wait_procs(
      psutil.Process().children(recursive=True), timeout=_LEFTOVER_GRACE_S
  )
  names = []
  for p in alive:
    try:
      if p.status() != psutil.STATUS_ZOMBIE:
        names.append(f"{p.pid} {' '.join(p.cmdline())[:200]}")
        p.kill()
    except psutil.NoSuchProcess:
      pass
  if hasattr(session.config, "workerinput"):
    session.config.workeroutput["scalerl_leftovers"] = names
  _fail_on_leftovers(session, names)


def _fail_on_leftovers(session, names: list[str]) -> None:
  if names:
    print(
        "\nSCALERL_CHECK_LEFTOVERS: processes outlived the tests that started"
        " them:\n  " + "\n  ".join(names)
    )
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_unconfigure(config):
  """Removes the session's shared directory, where this process made it."""
  shared_dir = getattr(config, "scalerl_shared_dir", None)
  if shared_dir:
    shutil.rmtree(shared_dir, ignore_errors=True)
