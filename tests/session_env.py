"""The test session's environment variables, in a module without JAX.

tests/conftest.py sets them before JAX starts (importing JAX fixes its flags),
so this module imports nothing that imports JAX; tests/helpers.py and the
tests read them from here.
"""

import os

# Tests compile hundreds of small programs and run each only a few times, so
# XLA:CPU's LLVM optimisation passes were about half of their wall time
# (tests/attention_test.py alone: 66 s -> 37 s without them). LLVM's level
# changes how fast the machine code runs, not what the program computes; the
# HLO XLA optimises is the same. Subprocesses that tests start inherit it,
# and those that set XLA_FLAGS themselves append to it (`xla_flags`). Never
# set for runs or benchmarks (docs/testing.md).
TEST_XLA_FLAGS = "--xla_backend_optimization_level=0"

# The test session's own directory (tests/conftest.py makes one where this is
# unset; .ci/run gives both of its pytest sessions the same): the persistent
# compilation cache and what `helpers.built_once` builds live in it.
SHARED_DIR_ENV = "SCALERL_TEST_SHARED_DIR"


def xla_flags(flags: str) -> str:
  """`flags` after the session's own XLA_FLAGS, for a process that sets its
  own (tests/conftest.py's, or a subprocess's)."""
  return f"{os.environ.get('XLA_FLAGS', '')} {flags}".strip()
