"""Verifiers registered by name, and the one place a record is scored.

A record's `verifier` is a spec, `name` or `name:option`. A verifier is
`fn(completion, record, ctx, option) -> float`; `verify` gives it only the
answer region for the kinds in config.rewards.strip_thinking and clips its
score to [0, 1]. Design: docs/design/rewards.md.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, Callable, Collection, Mapping, Optional

from scalerl_jax import registry as registry_lib
from scalerl_jax.rewards import extract

# Kinds of verifier, what `config.rewards.verifier` and
# `config.rewards.strip_thinking` select.
KINDS = ("math", "task", "code")
# What `config.rewards.verifier` may hold.
MODES = ("auto",) + KINDS


@dataclasses.dataclass(frozen=True)
class VerifyContext:
  """Limits and hooks a verifier may need; built per call by the worker."""

  # time.monotonic() by which any subprocess a verifier starts is reaped.
  deadline: float = dataclasses.field(
      default_factory=lambda: time.monotonic() + 10.0
  )
  code_cpu_s: float = 2.0  # CPU-time limit of one candidate program run.
  code_memory_mb: int = 512  # Address-space limit of a candidate program.
  code_isolation: str = "auto"  # The sandbox's lower layer (isolation.MODES).
  # Programs under bubblewrap run as forks of one warm sandboxed interpreter.
  code_fork_server: bool = False
  # Called with (pgid, temp dir) when a verifier starts a sandboxed process,
  # and with the pgid once it is gone, so the pool can clean up after a kill.
  on_spawn: Callable[[int, str], None] = lambda pgid, tmpdir: None
  on_reap: Callable[[int], None] = lambda pgid: None


Verifier = Callable[[str, Mapping[str, Any], VerifyContext, str], float]


@dataclasses.dataclass(frozen=True)
class _Entry:
  fn: Verifier
  kind: str  # One of KINDS.
  takes_option: bool
  required_fields: tuple[str, ...]


# A record's `verifier` spec names one (before any `:option`).
VERIFIERS: registry_lib.Registry[_Entry] = registry_lib.Registry("verifier")


def register_verifier(
    name: str,
    *,
    kind: str,
    takes_option: bool = False,
    required_fields: tuple[str, ...] = ("answer",),
) -> Callable[[Verifier], Verifier]:
  """Decorator registering a verifier under `name`, the spec's prefix.

  `takes_option`: the spec carries `:option` (e.g. a dataset name).
  `required_fields`: the string fields a record must hold for it.
  """
  if kind not in KINDS:
    raise ValueError(
        f"register_verifier({name!r}): kind {kind!r} is not one of {KINDS}"
    )

  def decorator(fn: Verifier) -> Verifier:
    VERIFIERS.register(name, _Entry(fn, kind, takes_option, required_fields))
    return fn

  return decorator


def _split(spec: str) -> tuple[_Entry, str]:
  name, _, option = spec.partition(":")
  entry = VERIFIERS.get(name)
  if entry.takes_option and not option:
    raise ValueError(f"Verifier {spec!r} needs an option: '{name}:<name>'")
  if not entry.takes_option and option:
    raise ValueError(f"Verifier {name!r} takes no option, got {spec!r}")
  return entry, option


def kind_of(spec: str) -> str:
  """The kind (`KINDS`) of a verifier spec."""
  return _split(spec)[0].kind


def resolve_spec(record: Mapping[str, Any], mode: str = "auto") -> str:
  """The verifier spec that scores `record` under `config.rewards.verifier`.

  `mode`: `auto` (the record's verifier), `math` or `code` (that one), or
  `task` (the record's, which must be of kind `task`).

  Raises:
    ValueError: unknown mode or verifier, or a field the verifier needs.
  """
  if mode not in MODES:
    raise ValueError(f"rewards.verifier: {mode!r} is not one of {MODES}")
  if not isinstance(record, Mapping):
    raise ValueError(
        f"A prompt record must be a dict, got {type(record).__name__}"
    )
  rid = record.get("id", "<no id>")
  if mode in ("math", "code"):
    spec = mode
  else:
    spec = record.get("verifier")
    if not isinstance(spec, str) or not spec:
      raise ValueError(
          f"Record {rid!r} has no 'verifier' field (rewards.verifier={mode!r})"
      )
  entry, _ = _split(spec)
  if mode == "task" and entry.kind != "task":
    raise ValueError(
        f"Record {rid!r} has verifier {spec!r}, which is not a task scorer "
        f"(rewards.verifier='task')"
    )
  for field in entry.required_fields:
    if not isinstance(record.get(field), str):
      raise ValueError(
          f"Record {rid!r} needs a string {field!r} field for verifier {spec!r}"
      )
  return spec


def verify(
    completion: str,
    record: Mapping[str, Any],
    spec: str,
    ctx: Optional[VerifyContext] = None,
    *,
    strip_thinking: Collection[str] = KINDS,
) -> float:
  """Scores one completion in this process, in [0, 1] (no timeout).

  `strip_thinking`: the kinds that see only the answer region.

  Raises:
    ValueError: unknown spec or non-finite score; or what the verifier raises.
  """
  entry, option = _split(spec)
  if entry.kind in strip_thinking:
    completion = extract.answer_region(completion)
    if completion is None:
      return 0.0
  score = float(entry.fn(completion, record, ctx or VerifyContext(), option))
  if not math.isfinite(score):
    raise ValueError(f"Verifier {spec!r} returned a non-finite score {score}")
  return min(max(score, 0.0), 1.0)
