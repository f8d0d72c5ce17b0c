"""Shared test settings: CPU only, and fail loudly on silent
broadcasting mistakes."""

import os

# The test extras install libtpu (tests/aot_test.py compiles for TPU slices);
# without this every test process would first try to open a TPU it lacks.
# Subprocesses inherit it.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # pylint: disable=g-import-not-at-top

jax.config.update("jax_numpy_rank_promotion", "raise")
