"""The reward worker process: scores one completion at a time for `RewardPool`.

Messages over its connection to the pool (design: docs/design/rewards.md):

  worker -> pool  ("ready",)                      once its limits are set
  pool -> worker  (task_id, completion, record, spec)
  worker -> pool  ("spawned", pgid, tmpdir)       a sandboxed program started
  worker -> pool  ("reaped", pgid)                ... and is gone
  worker -> pool  ("done", task_id, score, error) error is "" on success
"""

from __future__ import annotations

import dataclasses
import importlib
from multiprocessing.connection import Connection
import resource
import signal
import time

from scalerl_jax.rewards import code_sandbox
from scalerl_jax.rewards import math_answer
from scalerl_jax.rewards import registry
from scalerl_jax.rewards.sandbox import client
from scalerl_jax.rewards.sandbox import isolation

# Imported once by the fork server (`zygote.py`), so that a new worker (after
# a timeout kill) is a fork that starts in milliseconds instead of
# re-importing sympy. Optional ones that are not installed are skipped.
PRELOAD_MODULES = ("math_verify", "reasoning_gym")
# Share of the pool's timeout that sandboxed programs may use; the rest is
# left for killing, reaping and reporting before the pool's hard kill.
_PROGRAM_WALL_FRACTION = 0.8
_MAX_ERROR_CHARS = 500


@dataclasses.dataclass(frozen=True)
class WorkerSettings:
  """What a worker needs from `config.rewards`."""

  timeout_s: float
  code_cpu_s: float
  code_memory_mb: int
  code_isolation: str  # The sandbox's lower layer (`isolation.MODES`).
  code_fork_server: bool  # Programs as forks of a warm sandboxed interpreter.
  memory_mb: int  # Address-space limit of the worker itself; 0 = none.
  # Verifier kinds scored on the answer region only.
  strip_thinking: tuple[str, ...]


def warm_up() -> None:
  """Pays the verifiers' imports, math-verify's set-up and the bwrap and
  cgroup probes."""
  isolation.bwrap_works()
  isolation.pids_cgroup_parent()
  for name in PRELOAD_MODULES:
    try:
      importlib.import_module(name)
    except ImportError:
      pass
  try:
    math_answer.is_equivalent("1", "1")
  except ImportError:
    pass  # math-verify is not installed; math records will fail clearly.


def worker_main(conn: Connection, settings: WorkerSettings) -> None:
  """Entry point of a worker process: serves tasks until the pool hangs up."""
  # Ctrl-C is the trainer's to handle.
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  # The parent is the fork server, which dies with the pool: no orphans.
  client.die_with_parent()
  if settings.memory_mb:
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = settings.memory_mb << 20
    resource.setrlimit(
        resource.RLIMIT_AS,
        (limit if hard == resource.RLIM_INFINITY else min(limit, hard), hard),
    )
  on_spawn = lambda pgid, tmpdir: conn.send(("spawned", pgid, tmpdir))
  on_reap = lambda pgid: conn.send(("reaped", pgid))
  if code_sandbox.uses_fork_server(
      settings.code_isolation, settings.code_fork_server
  ):
    # Before "ready": no program's time limit pays for the sandbox's start.
    code_sandbox.start_server(on_spawn)
  conn.send(("ready",))
  while True:
    try:
      task_id, completion, record, spec = conn.recv()
    except (EOFError, ConnectionResetError):  # The pool is gone.
      code_sandbox.stop_server(on_reap)
      return
    ctx = registry.VerifyContext(
        deadline=time.monotonic() + _PROGRAM_WALL_FRACTION * settings.timeout_s,
        code_cpu_s=settings.code_cpu_s,
        code_memory_mb=settings.code_memory_mb,
        code_isolation=settings.code_isolation,
        code_fork_server=settings.code_fork_server,
        on_spawn=on_spawn,
        on_reap=on_reap,
    )
    try:
      score = registry.verify(
          completion, record, spec, ctx, strip_thinking=settings.strip_thinking
      )
      error = ""
    except Exception as e:  # Any failure on any input scores 0 and is reported.
      score, error = 0.0, f"{type(e).__name__}: {e}"[:_MAX_ERROR_CHARS]
    conn.send(("done", task_id, score, error))
