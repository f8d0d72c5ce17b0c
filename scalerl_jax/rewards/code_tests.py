"""A code record's tests, and the verdict on a run, in the verifier's process.

A record's `answer` holds its tests in one of three forms:

* stdin/stdout cases (JSON): `{"inputs": [...], "outputs": [...]}` or
  `[{"input": ..., "output": ...}, ...]`, each value a string or a list of
  lines;
* function calls (JSON): `{"fn_name": "f", "inputs": [[args], ...],
  "outputs": [value, ...]}`;
* asserts (Python), one per line: `assert CALL == LITERAL` (either side),
  `assert CALL is None|True|False`, `assert math.isclose(CALL, LITERAL,
  rel_tol=..., abs_tol=...)`, and `assert [not] f(LITERALS)`; import lines
  are kept for the calls. Any other statement is an error, never run.

Expected values never leave this process: only the calls (the program's
inputs) enter the sandbox, and what comes back is checked here to be plain
data before it is compared. Design: docs/design/sandbox.md.
"""

from __future__ import annotations

import ast
import base64
import dataclasses
import json
import math
import struct
from typing import Any, Optional

# How deep the plain data a program returns may nest.
MAX_DEPTH = 100
_ISCLOSE = ("isclose", "math.isclose")
# Calls of these on one literal count as a literal expected value.
_LITERAL_WRAPPERS = {
    "set": set,
    "frozenset": frozenset,
    "tuple": tuple,
    "list": list,
    "sorted": sorted,
    "dict": dict,
}


@dataclasses.dataclass(frozen=True)
class Check:
  """One call the program's code answers, and what its value must be."""

  # Sent into the sandbox: {"expr": source} or {"fn": name, "args": [...]}.
  call: dict[str, Any]
  expected: Any  # Plain data; never sent.
  # eq: ==; eq_json: == with tuples as lists; is: identity (None, bools);
  # truth: bool(value) == expected; isclose: math.isclose.
  compare: str = "eq"
  rel_tol: float = 1e-9
  abs_tol: float = 0.0


@dataclasses.dataclass(frozen=True)
class Tests:
  """A record's tests: stdin/stdout cases, or calls into the program."""

  cases: tuple[tuple[str, str], ...] = ()  # (stdin, expected stdout).
  setup: str = ""  # Import lines the calls need, run after the program.
  checks: tuple[Check, ...] = ()

  def request(self) -> Optional[dict[str, Any]]:
    """What the sandbox needs for the calls (None for stdin/stdout cases)."""
    if not self.checks:
      return None
    return {"setup": self.setup, "calls": [c.call for c in self.checks]}


def _text(value: Any, what: str) -> str:
  if isinstance(value, str):
    return value
  if isinstance(value, list) and all(isinstance(v, str) for v in value):
    return "\n".join(value)
  raise ValueError(
      f"Code test {what} must be a string or a list of strings, "
      f"got {type(value).__name__}"
  )


def _function_calls(spec: dict[str, Any]) -> Tests:
  name, inputs, outputs = (
      spec["fn_name"],
      spec.get("inputs"),
      spec.get("outputs"),
  )
  if not (isinstance(name, str) and name.isidentifier()):
    raise ValueError(f"Code tests' fn_name must be an identifier, got {name!r}")
  if not (isinstance(inputs, list) and isinstance(outputs, list)):
    raise ValueError(
        'Code tests with "fn_name" need "inputs" and "outputs" lists'
    )
  if not all(isinstance(args, list) for args in inputs):
    raise ValueError('Code tests\' "inputs" must each be a list of arguments')
  pairs = list(zip(inputs, outputs, strict=True))
  if not pairs:
    raise ValueError("A code record has an empty list of test cases")
  return Tests(
      checks=tuple(
          Check({"fn": name, "args": args}, expected, "eq_json")
          for args, expected in pairs
      )
  )


def _json_tests(text: str) -> Tests:
  try:
    spec = json.loads(text)
  except json.JSONDecodeError as e:
    raise ValueError(f"Code tests look like JSON but do not parse: {e}") from e
  if isinstance(spec, dict) and "fn_name" in spec:
    return _function_calls(spec)
  if isinstance(spec, dict) and {"inputs", "outputs"} <= spec.keys():
    pairs = list(zip(spec["inputs"], spec["outputs"], strict=True))
  elif isinstance(spec, list) and all(
      isinstance(c, dict) and {"input", "output"} <= c.keys() for c in spec
  ):
    pairs = [(c["input"], c["output"]) for c in spec]
  else:
    raise ValueError(
        'Code tests must be {"inputs": [...], "outputs": [...]}, '
        '[{"input": ..., "output": ...}, ...] or '
        '{"fn_name": ..., "inputs": [...], "outputs": [...]}'
    )
  if not pairs:
    raise ValueError("A code record has an empty list of test cases")
  return Tests(
      cases=tuple((_text(i, "input"), _text(o, "output")) for i, o in pairs)
  )


def _literal(node: ast.expr) -> tuple[bool, Any]:
  """(True, value) if `node` is a literal, or set(...) etc. of one."""
  if (
      isinstance(node, ast.Call)
      and isinstance(node.func, ast.Name)
      and node.func.id in _LITERAL_WRAPPERS
      and len(node.args) <= 1
      and not node.keywords
  ):
    ok, inner = _literal(node.args[0]) if node.args else (True, ())
    if ok:
      try:
        return True, _LITERAL_WRAPPERS[node.func.id](inner)
      except (TypeError, ValueError):
        return False, None
    return False, None
  try:
    return True, ast.literal_eval(node)
  except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
    return False, None


def _expr(node: ast.expr) -> dict[str, str]:
  return {"expr": ast.unparse(node)}


def _isclose(test: ast.Call) -> Optional[Check]:
  """`math.isclose(CALL, LITERAL, rel_tol=, abs_tol=)` (either order)."""
  if ast.unparse(test.func) not in _ISCLOSE or len(test.args) != 2:
    return None
  tolerances = {}
  for keyword in test.keywords:
    ok, value = _literal(keyword.value)
    if keyword.arg not in ("rel_tol", "abs_tol") or not ok:
      return None
    tolerances[keyword.arg] = float(value)
  for call, other in (test.args, test.args[::-1]):
    ok, value = _literal(other)
    if ok and isinstance(value, (int, float)) and not _literal(call)[0]:
      return Check(_expr(call), float(value), "isclose", **tolerances)
  return None


def _check(test: ast.expr) -> Optional[Check]:
  """The Check an assert's test makes, or None where it is not one we take."""
  if isinstance(test, ast.Compare) and len(test.ops) == 1:
    left, right = test.left, test.comparators[0]
    if isinstance(test.ops[0], ast.Eq):
      for call, other in ((left, right), (right, left)):
        ok, value = _literal(other)
        if ok and not _literal(call)[0]:
          return Check(_expr(call), value)
    elif isinstance(test.ops[0], ast.Is) and isinstance(right, ast.Constant):
      if right.value in (None, True, False) and not _literal(left)[0]:
        return Check(_expr(left), right.value, "is")
    return None
  negated = isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not)
  call = test.operand if negated else test
  if not isinstance(call, ast.Call):
    return None
  if not negated and (check := _isclose(call)) is not None:
    return check
  # A bare call's truth is an expected value only where the program computes
  # nothing but the named function: `assert all(f(x))` would be won by
  # redefining `all`.
  arguments = list(call.args) + [k.value for k in call.keywords]
  if isinstance(call.func, ast.Name) and all(_literal(a)[0] for a in arguments):
    return Check(_expr(call), not negated, "truth")
  return None


def _assert_tests(text: str) -> Tests:
  try:
    tree = ast.parse(text)
  except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
    raise ValueError(f"Code tests are neither JSON nor Python: {e}") from e
  setup, checks = [], []
  for node in tree.body:
    if isinstance(node, (ast.Import, ast.ImportFrom)):
      setup.append(ast.unparse(node))
      continue
    check = _check(node.test) if isinstance(node, ast.Assert) else None
    if check is None:
      raise ValueError(
          f"Code test line {node.lineno} is not an assert the verifier can "
          "check outside the program (`assert CALL == LITERAL`, `assert CALL "
          "is None`, `assert math.isclose(CALL, LITERAL)`, `assert [not] "
          f"f(LITERALS)`): {ast.unparse(node)[:200]!r}"
      )
    checks.append(check)
  if not checks:
    raise ValueError("A code record's test code holds no assert")
  return Tests(setup="\n".join(setup), checks=tuple(checks))


def parse_tests(answer: str) -> Tests:
  """A code record's tests, from its `answer` field.

  Raises:
    ValueError: no tests, or tests in none of the forms above.
  """
  text = answer.strip()
  if not text:
    raise ValueError("A code record has no tests in its 'answer' field")
  if text.startswith(("{", "[")):
    return _json_tests(text)
  return _assert_tests(text)


def _decode(x: Any, depth: int) -> Any:
  """Plain data from its JSON form (boot.encode); ValueError if not."""
  if x is None or type(x) in (bool, int, float, str):
    return x
  if depth > MAX_DEPTH:
    raise ValueError("nested too deeply")
  if type(x) is list:
    return [_decode(v, depth + 1) for v in x]
  if type(x) is not dict or len(x) != 1:
    raise ValueError("not a tagged value")
  ((tag, v),) = x.items()
  if tag == "i" and type(v) is str:
    return int(v, 16)
  if tag == "b" and type(v) is str:
    return base64.b64decode(v, validate=True)
  if tag == "c" and type(v) is list and all(type(p) is float for p in v):
    return complex(*v)
  if type(v) is not list:
    raise ValueError("not a tagged value")
  items = [_decode(item, depth + 1) for item in v]
  if tag == "t":
    return tuple(items)
  if tag == "s":
    return set(items)
  if tag == "f":
    return frozenset(items)
  if tag == "d" and all(type(p) is list and len(p) == 2 for p in items):
    return {key: value for key, value in items}
  raise ValueError(f"unknown tag {tag!r}")


def _message(data: bytes) -> Optional[dict[str, Any]]:
  """The run's report if it is one well-formed message of success.

  A report is a 4-byte big-endian length and that much JSON, and nothing
  else: bytes written beside it make it no report.
  """
  if len(data) < 4 or struct.unpack(">I", data[:4])[0] != len(data) - 4:
    return None
  try:
    message = json.loads(data[4:])
  except (ValueError, RecursionError):
    return None
  if type(message) is not dict or message.get("status") != "ok":
    return None
  return message


def values(data: bytes, count: int) -> Optional[list[Any]]:
  """The `count` call values of a run's result message, or None.

  None unless the program ran to its end and every value is plain data.
  """
  message = _message(data)
  if message is None:
    return None
  raw = message.get("values")
  if type(raw) is not list or len(raw) != count:
    return None
  try:
    return [_decode(v, 0) for v in raw]
  except (ValueError, TypeError, RecursionError):
    return None  # Not data, or unhashable in a set or as a key.


def _as_json(value: Any) -> Any:
  """`value` with tuples as lists, as JSON would hold it."""
  if type(value) in (list, tuple):
    return [_as_json(v) for v in value]
  if type(value) is dict:
    return {k: _as_json(v) for k, v in value.items()}
  return value


def _holds(check: Check, value: Any) -> bool:
  if check.compare == "eq":
    return value == check.expected
  if check.compare == "eq_json":
    return _as_json(value) == check.expected
  if check.compare == "is":
    return value is check.expected
  if check.compare == "truth":
    return bool(value) == check.expected
  if type(value) not in (int, float):
    return False
  try:
    return math.isclose(
        value, check.expected, rel_tol=check.rel_tol, abs_tol=check.abs_tol
    )
  except OverflowError:
    return False


def calls_pass(tests: Tests, result: bytes) -> bool:
  """Whether a run's result message answers every check of `tests`."""
  got = values(result, len(tests.checks))
  if got is None:
    return False
  try:
    return all(_holds(c, v) for c, v in zip(tests.checks, got, strict=True))
  except RecursionError:
    return False


def _lines(text: str) -> list[str]:
  lines = [line.rstrip() for line in text.splitlines()]
  while lines and not lines[-1]:
    lines.pop()
  return lines


def case_passes(expected: str, stdout: bytes, result: bytes) -> bool:
  """Whether a stdin/stdout run ended normally and printed `expected`.

  Compared line by line, ignoring trailing whitespace and trailing blank
  lines.
  """
  return _message(result) is not None and _lines(
      stdout.decode("utf-8", errors="replace")
  ) == _lines(expected)
