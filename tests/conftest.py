"""Shared test settings: CPU only, and fail loudly on silent
broadcasting mistakes."""

import os
import shutil
import tempfile

# The test extras install libtpu (tests/aot_test.py compiles for TPU slices);
# without this every test process would first try to open a TPU it lacks.
# Subprocesses inherit it.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # pylint: disable=g-import-not-at-top

jax.config.update("jax_numpy_rank_promotion", "raise")


def pytest_configure(config):
  """One persistent compilation cache for the whole session.

  Set before pytest-xdist starts its workers, so the workers and every
  subprocess a test starts (they inherit the environment) reuse each other's
  compiled programs instead of compiling the same tiny configs again. The
  executables are the same, so no result changes; only wall time.
  """
  if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    config.scalerl_cache_dir = tempfile.mkdtemp(
        prefix="scalerl_jax_test_compile_cache_"
    )
    os.environ["JAX_COMPILATION_CACHE_DIR"] = config.scalerl_cache_dir
  jax.config.update(
      "jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"]
  )


def pytest_unconfigure(config):
  """Removes the session's cache, where this process made it."""
  cache_dir = getattr(config, "scalerl_cache_dir", None)
  if cache_dir:
    shutil.rmtree(cache_dir, ignore_errors=True)
