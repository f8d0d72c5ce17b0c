"""Verifiers registered by name, and the one place a record is scored.

A prompt record is a plain dict
`{"id", "prompt", "answer", "source", "verifier", optional "metadata"}`. Its
`verifier` field is a spec: a registered name (`builtin`, `math`, `code`),
optionally followed by `:option` (`reasoning_gym:basic_arithmetic`).
`config.rewards.verifier` can override the record's choice (`math`, `code`) or
require it to be a task scorer (`task`); `resolve_spec` applies that rule.

A verifier is `fn(completion, record, ctx, option) -> float`. It runs inside a
reward worker process (see `pool.py`), may raise on pathological input (the
pool counts the error and scores 0) and returns a score that `verify` clips to
[0, 1]. For the kinds in `config.rewards.strip_thinking` (all by default),
`verify` hands it only the completion's answer region, the text after its
thinking (`extract.answer_region`), and scores 0 without calling it when the
thinking is never closed. Verifier modules import their heavy optional
dependencies lazily, so registering them costs nothing in the trainer process.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, Callable, Collection, Mapping, Optional

from scalerl_jax.rewards import extract

# Kinds of verifier, what `config.rewards.verifier` and
# `config.rewards.strip_thinking` select.
KINDS = ("math", "task", "code")
# What `config.rewards.verifier` may hold.
MODES = ("auto",) + KINDS


@dataclasses.dataclass(frozen=True)
class VerifyContext:
  """Limits and hooks a verifier may need; built per call by the worker.

  Attributes:
    deadline: `time.monotonic()` by which any subprocess a verifier starts
      must have been killed and reaped.
    code_cpu_s: CPU-time limit of one candidate program run (seconds).
    code_memory_mb: address-space limit of a candidate program (MiB).
    code_isolation: the sandbox's lower layer (`isolation.MODES`).
    on_spawn: called with (process group id, temp dir) right after a
      verifier starts a sandboxed process, so that the pool can kill the group
      and remove the directory if it has to kill the worker.
    on_reap: called with the process group id once it is gone.
  """
  deadline: float = dataclasses.field(default_factory=lambda: time.monotonic() + 10.0)
  code_cpu_s: float = 2.0
  code_memory_mb: int = 512
  code_isolation: str = "auto"
  on_spawn: Callable[[int, str], None] = lambda pgid, tmpdir: None
  on_reap: Callable[[int], None] = lambda pgid: None


Verifier = Callable[[str, Mapping[str, Any], VerifyContext, str], float]


@dataclasses.dataclass(frozen=True)
class _Entry:
  fn: Verifier
  kind: str  # One of KINDS.
  takes_option: bool
  required_fields: tuple[str, ...]


_VERIFIERS: dict[str, _Entry] = {}


def register_verifier(name: str, *, kind: str, takes_option: bool = False,
                      required_fields: tuple[str, ...] = ("answer",)
                      ) -> Callable[[Verifier], Verifier]:
  """Decorator registering a verifier under `name`.

  Args:
    name: the spec prefix records use (`math`, `reasoning_gym`, ...).
    kind: `math`, `task` or `code`; `config.rewards.verifier=task` accepts
      only records whose verifier is of kind `task`.
    takes_option: whether the spec carries `:option` (e.g. a dataset name).
    required_fields: string fields a record must hold for this verifier.

  Returns:
    The decorator, which returns the function unchanged.
  """
  if kind not in KINDS:
    raise ValueError(f"register_verifier({name!r}): kind {kind!r} is not one of {KINDS}")

  def decorator(fn: Verifier) -> Verifier:
    if name in _VERIFIERS:
      raise ValueError(f"A verifier named {name!r} is already registered")
    _VERIFIERS[name] = _Entry(fn, kind, takes_option, required_fields)
    return fn

  return decorator


def registered_verifiers() -> tuple[str, ...]:
  """Names of all registered verifiers."""
  return tuple(sorted(_VERIFIERS))


def _split(spec: str) -> tuple[_Entry, str]:
  name, _, option = spec.partition(":")
  entry = _VERIFIERS.get(name)
  if entry is None:
    raise ValueError(
        f"Unknown verifier {spec!r}; registered: {', '.join(registered_verifiers())}")
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

  Also checks that the record holds what that verifier needs, so that a bad
  data row fails here with its id and not later inside a worker.

  Args:
    record: a prompt record (plain dict).
    mode: `auto` (the record's own verifier), `math` or `code` (force that
      verifier), or `task` (the record's verifier, which must be a task scorer).

  Returns:
    A spec accepted by `verify`.

  Raises:
    ValueError: unknown mode or verifier, or a record missing a field.
  """
  if mode not in MODES:
    raise ValueError(f"rewards.verifier: {mode!r} is not one of {MODES}")
  if not isinstance(record, Mapping):
    raise ValueError(f"A prompt record must be a dict, got {type(record).__name__}")
  rid = record.get("id", "<no id>")
  if mode in ("math", "code"):
    spec = mode
  else:
    spec = record.get("verifier")
    if not isinstance(spec, str) or not spec:
      raise ValueError(f"Record {rid!r} has no 'verifier' field (rewards.verifier={mode!r})")
  entry, _ = _split(spec)
  if mode == "task" and entry.kind != "task":
    raise ValueError(
        f"Record {rid!r} has verifier {spec!r}, which is not a task scorer "
        f"(rewards.verifier='task')")
  for field in entry.required_fields:
    if not isinstance(record.get(field), str):
      raise ValueError(f"Record {rid!r} needs a string {field!r} field for verifier {spec!r}")
  return spec


def verify(completion: str, record: Mapping[str, Any], spec: str,
           ctx: Optional[VerifyContext] = None, *,
           strip_thinking: Collection[str] = KINDS) -> float:
  """Scores one completion in this process (no timeout: see `RewardPool`).

  Args:
    completion: the generated text.
    record: the prompt record it answers.
    spec: verifier spec from `resolve_spec`.
    ctx: limits and hooks; defaults to a 10 s deadline and default limits.
    strip_thinking: `config.rewards.strip_thinking`, the verifier kinds that
      see only `extract.answer_region(completion)`; a completion with no
      answer region (thinking never closed) scores 0 under them.

  Returns:
    The score clipped to [0, 1].

  Raises:
    ValueError: unknown spec or a non-finite score; anything the verifier
      raises on pathological input.
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
