"""Code verifier: the completion's program run against the record's tests.

The tests are parsed here (code_tests.py); the sandbox gets the program and
its inputs (stdin, or the calls to make) and never an expected value. The
verdict is computed here from what the run returns: its stdout and its
report of plain values; exit status and output framing carry none. Each
program runs in a sandbox of its own, or in this process's fork server
(rewards.code_fork_server, under bubblewrap). Design:
docs/design/sandbox.md.
"""

from __future__ import annotations

import atexit
import signal
import time
from typing import Any, Callable, Mapping, Optional

from scalerl_jax.rewards import code_tests
from scalerl_jax.rewards import extract
from scalerl_jax.rewards import registry
from scalerl_jax.rewards.sandbox import client
from scalerl_jax.rewards.sandbox import isolation

_server: Optional[client.Sandbox] = None  # This process's fork server.


def uses_fork_server(code_isolation: str, code_fork_server: bool) -> bool:
  """Whether programs run in this process's fork server (under bubblewrap)."""
  return (
      code_fork_server
      and code_isolation != "python"
      and isolation.bwrap_works()[0]
  )


def start_server(on_spawn: Callable[[int, str], None]) -> None:
  """Starts this process's fork server now rather than at its first program."""
  global _server
  if _server is None:
    _server = client.Sandbox(True, on_spawn)


def stop_server(on_reap: Callable[[int], None] = lambda pgid: None) -> None:
  """Kills this process's fork server, if any (also at interpreter exit).

  bubblewrap drops its capabilities, which clears the parent-death signal
  set for it: the sandbox must be killed by whoever owns it.
  """
  global _server
  if _server is not None:
    _server.close(on_reap)
    _server = None


atexit.register(stop_server)


def _killed(ctx: registry.VerifyContext) -> client.ProgramResult:
  return client.ProgramResult(
      -signal.SIGKILL, b"", time.monotonic() >= ctx.deadline
  )


def _run_in_server(
    source: str,
    stdin: str,
    calls: Optional[dict[str, Any]],
    ctx: registry.VerifyContext,
) -> client.ProgramResult:
  """`run_program` through this process's fork server (restarted if dead)."""
  global _server
  for attempt in range(2):
    if _server is not None and not _server.alive():
      stop_server(ctx.on_reap)
    start_server(ctx.on_spawn)
    result = _server.run(
        source, stdin, calls, ctx.code_cpu_s, ctx.code_memory_mb, ctx.deadline
    )
    if result is not None:
      return result
    # Hung or dead: the next program gets a new sandbox. A server killed
    # from outside before its deadline (no program can kill it) is retried
    # once in a new one.
    stop_server(ctx.on_reap)
    if time.monotonic() >= ctx.deadline or attempt:
      return _killed(ctx)


def run_program(
    source: str,
    stdin: str,
    ctx: registry.VerifyContext,
    calls: Optional[dict[str, Any]] = None,
) -> client.ProgramResult:
  """Runs `source` as a sandboxed Python program, fed `stdin`.

  `calls` (code_tests.Tests.request) are made after the program has run,
  their values reported in `result`. `ctx` gives the deadline, the CPU and
  memory limits, the isolation and the spawn/reap hooks. Nothing the program
  started or wrote survives the return.

  Raises:
    RuntimeError: as isolation.use_bwrap, without bubblewrap.
  """
  bwrap = isolation.use_bwrap(ctx.code_isolation)
  if bwrap and ctx.code_fork_server:
    return _run_in_server(source, stdin, calls, ctx)
  sandbox = client.Sandbox(bwrap, ctx.on_spawn)
  try:
    result = sandbox.run(
        source, stdin, calls, ctx.code_cpu_s, ctx.code_memory_mb, ctx.deadline
    )
  finally:
    sandbox.close(ctx.on_reap)
  return _killed(ctx) if result is None else result


@registry.register_verifier("code", kind="code")
def verify_code(
    completion: str,
    record: Mapping[str, Any],
    ctx: registry.VerifyContext,
    option: str,
) -> float:
  """1.0 if the completion's program passes every test of the record.

  Raises:
    ValueError: the record's tests are in none of code_tests' forms.
  """
  del option
  tests = code_tests.parse_tests(record["answer"])
  program = extract.extract_code(completion)
  if program is None:
    return 0.0
  if tests.checks:
    result = run_program(program, "", ctx, tests.request())
    return float(code_tests.calls_pass(tests, result.result))
  for stdin, expected in tests.cases:
    result = run_program(program, stdin, ctx)
    if not code_tests.case_passes(expected, result.stdout, result.result):
      return 0.0
  return 1.0
