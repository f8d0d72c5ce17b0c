"""Tests of code_tests: record forms, the values a run reports, the verdict.

No sandbox here: the program's report is built with boot.encode, as
the program's process builds it, and read as the verifier reads it.
"""

import json
import math
import struct

import pytest

from scalerl_jax.data import builtin_code
from scalerl_jax.rewards import code_tests
from scalerl_jax.rewards.sandbox import boot


def _report(status, values=None):
  """A report as sandbox/boot.py writes it: length, then JSON."""
  body = '{"status": "%s"' % status
  if values is not None:
    body += ', "values": [%s]' % ", ".join(boot.encode(v) for v in values)
  body = (body + "}").encode()
  return struct.pack(">I", len(body)) + body


def test_the_builtin_domains_asserts_become_calls_without_their_values():
  record = builtin_code.make_record([("add", 5), ("times", 3), ("minus", 4)])
  tests = code_tests.parse_tests(record["answer"])
  assert [c.call for c in tests.checks] == [
      {"expr": "f(2)"},
      {"expr": "f(5)"},
      {"expr": "f(9)"},
  ]
  assert [c.expected for c in tests.checks] == [17, 26, 38]
  # What enters the sandbox holds the inputs and none of the outputs.
  sent = json.dumps(tests.request())
  assert "2" in sent and not any(str(v) in sent for v in (17, 26, 38))
  assert code_tests.calls_pass(tests, _report("ok", [17, 26, 38]))
  assert not code_tests.calls_pass(tests, _report("ok", [17, 26, 39]))


@pytest.mark.parametrize(
    "line, call, expected, compare",
    [
        ("assert 7 == f(3)", "f(3)", 7, "eq"),
        ("assert f(1) is None", "f(1)", None, "is"),
        ("assert is_even(4)", "is_even(4)", True, "truth"),
        ("assert not is_even(n=3)", "is_even(n=3)", False, "truth"),
        (
            "assert set(f([1, 2])) == set((2, 1))",
            "set(f([1, 2]))",
            {1, 2},
            "eq",
        ),
        ("assert f('a') == (1, [2])", "f('a')", (1, [2]), "eq"),
        ("assert math.isclose(3.5, f(2))", "f(2)", 3.5, "isclose"),
    ],
)
def test_assert_forms(line, call, expected, compare):
  (check,) = code_tests.parse_tests(f"import math\n{line}").checks
  assert (check.call, check.expected, check.compare) == (
      {"expr": call},
      expected,
      compare,
  )


def test_function_calls_compare_tuples_as_json_lists():
  tests = code_tests.parse_tests(
      json.dumps(
          {"fn_name": "g", "inputs": [[1, "a"]], "outputs": [[1, ["a"]]]}
      )
  )
  assert tests.checks[0].call == {"fn": "g", "args": [1, "a"]}
  assert code_tests.calls_pass(tests, _report("ok", [(1, ("a",))]))
  assert not code_tests.calls_pass(tests, _report("ok", [(1, "a")]))


@pytest.mark.parametrize(
    "value",
    [
        None,
        True,
        -3,
        2**200,
        -(2**70),
        0.1,
        -math.inf,
        'é\ud800\n"',
        b"\x00\xff",
        3 - 1.5j,
        [1, [2, (3, frozenset({4}))]],
        {(1, 2): {"a": {b"k"}}, None: []},
        set(),
        (),
    ],
)
def test_plain_data_goes_through_the_report_unchanged(value):
  (got,) = code_tests.values(_report("ok", [value]), 1)
  assert got == value and type(got) is type(value)


class _Int(int):

  def __eq__(self, other):
    return True

  __hash__ = int.__hash__


class _Any:

  def __eq__(self, other):
    return True


def _nested(depth):
  value = []
  for _ in range(depth):
    value = [value]
  return value


@pytest.mark.parametrize(
    "value",
    [
        _Int(3),
        _Any(),
        [_Any()],
        {1: _Any()},
        (i for i in []),
        print,
        _nested(200),
    ],
)
def test_anything_else_is_not_data(value):
  with pytest.raises(boot.NotData):
    boot.encode(value)


@pytest.mark.parametrize(
    "data",
    [
        b"",
        _report("ok", [1, 2]),  # Two values for three calls.
        _report("exit", [1, 2, 3]),
        _report("raised"),
        _report("ok", [1, 2, 3]) + b"x",  # Bytes beside the report.
        _report("ok", [1, 2, 3])[:-1],
        b"\x00\x00\x00\x02{}",
    ],
)
def test_a_report_that_is_not_one_success_with_every_value_is_none(data):
  assert code_tests.values(data, 3) is None


@pytest.mark.parametrize(
    "raw",
    [
        '{"x": 1}',  # Unknown tag.
        '{"t": 1}',
        '{"t": [1], "s": [2]}',
        '{"s": [[1]]}',  # Unhashable in a set.
        '{"d": [[1]]}',
        '{"c": [1, 2]}',  # Not floats.
        '{"b": "***"}',
        '{"i": "zz"}',
        "[" * 150 + "]" * 150,  # Deeper than MAX_DEPTH.
    ],
)
def test_malformed_values_are_refused(raw):
  body = ('{"status": "ok", "values": [%s]}' % raw).encode()
  assert code_tests.values(struct.pack(">I", len(body)) + body, 1) is None


def test_comparisons():
  parse = code_tests.parse_tests

  def verdict(line, value):
    return code_tests.calls_pass(parse(line), _report("ok", [value]))

  # As the assert itself would compare plain data.
  assert verdict("assert f() == (1, 2)", (1, 2))
  assert not verdict("assert f() == (1, 2)", [1, 2])
  assert verdict("assert f() == 1", 1.0) and verdict("assert f() == 1", True)
  assert not verdict("assert f() == 1", float("nan"))
  assert verdict("assert f() is None", None) and not verdict(
      "assert f() is None", 0
  )
  assert verdict("assert f(1)", [0]) and not verdict("assert f(1)", [])
  assert verdict("assert math.isclose(f(), 1.0, rel_tol=0.01)", 1.005)
  assert not verdict("assert math.isclose(f(), 1.0)", "1.0")
  assert not verdict("assert math.isclose(f(), 1.0)", 10**400)


def test_a_stdin_case_needs_its_output_and_a_run_to_its_end():
  ok = _report("ok")
  assert code_tests.case_passes("6\n", b"6  \n\n", ok)
  assert not code_tests.case_passes("6", b"6\n", _report("raised"))
  assert not code_tests.case_passes("6", b"6\n", b"")
  assert not code_tests.case_passes("6", b"7\n", ok)
