"""Tests of the verifiers run in-process: math, built-in task,
reasoning-gym, code."""

import json

import pytest
import reasoning_gym

from configs import scalerl
from scalerl_jax import config as config_lib
from scalerl_jax import rewards
from scalerl_jax.data import builtin_task
from scalerl_jax.rewards import code_tests
from scalerl_jax.rewards import math_answer
from scalerl_jax.rewards import registry


def _math(answer):
  return {"id": "m", "answer": answer, "verifier": "math"}


@pytest.mark.parametrize(
    "completion, answer",
    [
        (r"so \boxed{0.5}", r"\frac{1}{2}"),
        (r"\boxed{\dfrac{1}{2}}", "1/2"),
        ("Answer: 1+x^2", "x^2+1"),
        (r"<answer>\sqrt{2}</answer>", "2^{1/2}"),
        (r"\boxed{\{2, 1\}}", r"\{1,2\}"),
        ("Answer: $42$", "42"),
        ("Answer: 42.", "42"),
        (r"first \boxed{41}, no wait: \boxed{42}", "42"),
    ],
)
def test_math_equivalent_answers_score_one(completion, answer):
  assert rewards.verify(completion, _math(answer), "math") == 1.0


@pytest.mark.parametrize(
    "completion, answer",
    [
        (r"\boxed{41}", "42"),
        (r"\boxed{42} no wait: \boxed{41}", "42"),
        (
            "42",
            "42",
        ),  # No boxed answer, tag or Answer line: nothing was stated.
        (r"\boxed{x^2-1}", "x^2+1"),
        ("Answer: " + "4" * 3000, "4" * 3000),  # Longer than MAX_ANSWER_CHARS.
    ],
)
def test_math_wrong_or_missing_answers_score_zero(completion, answer):
  assert rewards.verify(completion, _math(answer), "math") == 0.0


def test_math_unparseable_gold_is_an_error():
  with pytest.raises(ValueError, match="gold answer"):
    math_answer.is_equivalent("1", "  ")


def test_builtin_task_records():
  record = builtin_task.builtin_prompts((2,), 1, 0, "train")[0]
  spec = rewards.resolve_spec(record)
  assert spec == "builtin"
  assert rewards.verify(builtin_task.target_text(record), record, spec) == 1.0
  wrong = builtin_task.target_text(record).replace(
      f"Answer: {record['answer']}", f"Answer: {int(record['answer']) + 1}"
  )
  assert rewards.verify(wrong, record, spec) == 0.0


@pytest.mark.parametrize("name", ["basic_arithmetic", "word_sorting"])
def test_reasoning_gym_records(name):
  entry = reasoning_gym.create_dataset(name, size=1, seed=3)[0]
  record = {
      "id": "rg",
      "prompt": entry["question"],
      "answer": str(entry["answer"]),
      "verifier": f"reasoning_gym:{name}",
      "metadata": json.dumps(entry),
  }
  spec = rewards.resolve_spec(record, "task")
  assert (
      rewards.verify(
          f"thinking...\n<answer>{entry['answer']}</answer>", record, spec
      )
      == 1.0
  )
  assert (
      rewards.verify("<answer>definitely wrong</answer>", record, spec) == 0.0
  )
  assert rewards.verify("no answer", record, spec) == 0.0


def test_resolve_spec_modes():
  builtin = {"id": "b", "answer": "3", "verifier": "builtin"}
  assert rewards.resolve_spec(builtin, "auto") == "builtin"
  assert rewards.resolve_spec(builtin, "task") == "builtin"
  assert rewards.resolve_spec(builtin, "math") == "math"
  assert rewards.resolve_spec(builtin, "code") == "code"


@pytest.mark.parametrize(
    "record, mode, message",
    [
        (
            {"id": "a", "answer": "1", "verifier": "math"},
            "task",
            "not a task scorer",
        ),
        (
            {"id": "a", "answer": "1", "verifier": "nope"},
            "auto",
            "verifier: 'nope' is not one of",
        ),
        ({"id": "a", "answer": "1"}, "auto", "no 'verifier' field"),
        ({"id": "a", "verifier": "math"}, "auto", "needs a string 'answer'"),
        (
            {"id": "a", "answer": "1", "verifier": "reasoning_gym"},
            "auto",
            "needs an option",
        ),
        (
            {"id": "a", "answer": "1", "verifier": "reasoning_gym:x"},
            "auto",
            "'metadata'",
        ),
        (
            {"id": "a", "answer": "1", "verifier": "math:x"},
            "auto",
            "takes no option",
        ),
        (
            {"id": "a", "answer": "1", "verifier": "math"},
            "exact",
            "rewards.verifier",
        ),
        ("not a dict", "auto", "must be a dict"),
    ],
)
def test_resolve_spec_errors_name_the_cause(record, mode, message):
  with pytest.raises(ValueError, match=message):
    rewards.resolve_spec(record, mode)


def test_registry_clips_scores_and_rejects_nan_and_duplicates():
  @rewards.register_verifier("test_constant", kind="task", takes_option=True)
  def constant(completion, record, ctx, option):
    del completion, record, ctx
    return float(option)

  record = {"answer": ""}
  assert rewards.verify("", record, "test_constant:7") == 1.0
  assert rewards.verify("", record, "test_constant:-2") == 0.0
  assert rewards.verify("", record, "test_constant:0.25") == 0.25
  with pytest.raises(ValueError, match="non-finite"):
    rewards.verify("", record, "test_constant:nan")
  with pytest.raises(ValueError, match="already registered"):
    rewards.register_verifier("test_constant", kind="task")(constant)
  assert "test_constant" in registry.VERIFIERS.names()


_DOUBLE = "```python\nprint(2 * int(input()))\n```"


@pytest.mark.parametrize(
    "tests",
    [
        json.dumps({"inputs": ["3\n", "-4"], "outputs": ["6\n", "-8"]}),
        json.dumps(
            [
                {"input": "3", "output": "6  \n\n"},
                {"input": ["5"], "output": ["10"]},
            ]
        ),
    ],
)
@pytest.mark.needs_bwrap
def test_code_stdin_stdout_cases(tests):
  record = {"id": "c", "answer": tests, "verifier": "code"}
  assert rewards.verify(_DOUBLE, record, "code") == 1.0
  assert rewards.verify(_DOUBLE.replace("2 *", "3 *"), record, "code") == 0.0
  # No code block.
  assert rewards.verify("print(2 * int(input()))", record, "code") == 0.0


@pytest.mark.needs_bwrap
def test_code_assertion_tests():
  record = {
      "id": "c",
      "answer": "assert add(2, 3) == 5\nassert add(-1, 1) == 0",
      "verifier": "code",
  }
  assert (
      rewards.verify(
          "```python\ndef add(a, b):\n  return a + b\n```", record, "code"
      )
      == 1.0
  )
  assert (
      rewards.verify(
          "```python\ndef add(a, b):\n  return a - b\n```", record, "code"
      )
      == 0.0
  )
  assert (
      rewards.verify("```python\ndef add(a, b) return\n```", record, "code")
      == 0.0
  )


@pytest.mark.parametrize(
    "answer, message",
    [
        ("   ", "no tests"),
        ("[1, 2]", "must be"),
        ('{"inputs": ["1"]}', "must be"),
        ('{"inputs": ["1"], "outputs": ["1", "2"]}', "zip"),
        ("[]", "empty list"),
        ("{not json", "do not parse"),
        ('[{"input": 1, "output": "1"}]', "string or a list of strings"),
        ('{"fn_name": "f", "inputs": [[1]]}', "need"),
        ('{"fn_name": "f x", "inputs": [[1]], "outputs": [1]}', "identifier"),
        (
            '{"fn_name": "f", "inputs": [1], "outputs": [1]}',
            "list of arguments",
        ),
        ("assert f(1) > 2", "line 1 is not an assert"),
        ("x = 3\nassert f(1) == 2", "line 1 is not an assert"),
        ("assert f(1) == g(2)", "line 1 is not an assert"),
        ("assert all(f(x) for x in [1])", "line 1 is not an assert"),
        ("def check(c):\n  assert c(1) == 2", "line 1 is not an assert"),
        ("import math", "no assert"),
        ("assert f(1) ==", "neither JSON nor Python"),
    ],
)
def test_malformed_code_tests_are_errors(answer, message):
  # Never run: tests the verifier cannot hold outside the program are an
  # error naming the line, not code appended to the program.
  with pytest.raises(ValueError, match=message):
    code_tests.parse_tests(answer)


def _thinking_cases(runs_code=True):
  """(record, spec, its kind, a correct answer as that verifier
  reads it) per verifier; the code case marked `needs_bwrap` if `runs_code`,
  where the test's program reaches the sandbox."""
  builtin = builtin_task.builtin_prompts((2,), 1, 0, "train")[0]
  entry = reasoning_gym.create_dataset("basic_arithmetic", size=1, seed=3)[0]
  gym = {
      "id": "rg",
      "answer": str(entry["answer"]),
      "verifier": "reasoning_gym:basic_arithmetic",
      "metadata": json.dumps(entry),
  }
  code = {
      "id": "c",
      "answer": json.dumps({"inputs": ["3"], "outputs": ["6"]}),
      "verifier": "code",
  }
  return [
      (_math("54"), "math", "math", r"\boxed{54}"),
      (builtin, "builtin", "task", f"Answer: {builtin['answer']}"),
      (
          gym,
          "reasoning_gym:basic_arithmetic",
          "task",
          f"<answer>{entry['answer']}</answer>",
      ),
      pytest.param(
          code,
          "code",
          "code",
          _DOUBLE,
          marks=[pytest.mark.needs_bwrap] if runs_code else [],
      ),
  ]


_THINKING_IDS = ["math", "builtin", "reasoning_gym", "code"]


@pytest.mark.parametrize(
    "record, spec, kind, answer",
    _thinking_cases(runs_code=False),
    ids=_THINKING_IDS,
)
def test_an_answer_only_inside_the_thinking_scores_zero(
    record, spec, kind, answer
):
  del kind
  # Closed: the answer region after </think> states nothing.
  assert rewards.verify(f"<think> so\n{answer}\n</think>", record, spec) == 0.0
  # Unclosed (e.g. truncated mid-thought): there is no answer region at all.
  assert rewards.verify(f"<think> so\n{answer}\nand then", record, spec) == 0.0
  # Reopened after an earlier close: still thinking at the end.
  assert (
      rewards.verify(f"<think> a </think> <think> so\n{answer}\n", record, spec)
      == 0.0
  )


@pytest.mark.parametrize(
    "record, spec, kind, answer", _thinking_cases(), ids=_THINKING_IDS
)
def test_an_answer_after_the_thinking_scores_one(record, spec, kind, answer):
  del kind
  assert (
      rewards.verify(f"<think> so\n{answer}\n</think>\n{answer}", record, spec)
      == 1.0
  )
  # A template that opened the thinking in the prompt leaves only the close.
  assert rewards.verify(f"so ... </think>\n{answer}", record, spec) == 1.0
  # No thinking at all: the whole completion is the answer.
  assert rewards.verify(answer, record, spec) == 1.0


@pytest.mark.parametrize(
    "record, spec, kind, answer", _thinking_cases(), ids=_THINKING_IDS
)
def test_strip_thinking_is_chosen_per_kind(record, spec, kind, answer):
  unclosed = f"<think> so\n{answer}"
  others = tuple(k for k in registry.KINDS if k != kind)
  assert rewards.verify(unclosed, record, spec, strip_thinking=()) == 1.0
  assert rewards.verify(unclosed, record, spec, strip_thinking=others) == 1.0
  assert rewards.verify(unclosed, record, spec, strip_thinking=(kind,)) == 0.0


@pytest.mark.parametrize(
    "record, spec, kind, answer",
    [
        case
        for case, id_ in zip(_thinking_cases(), _THINKING_IDS)
        if id_ != "builtin"
    ],
    ids=["math", "reasoning_gym", "code"],
)
def test_without_stripping_a_closed_thinking_answer_counts(
    record, spec, kind, answer
):
  del kind
  # The measured regression: `<think> so \boxed{54} </think>` scored 1. With
  # stripping off it still does. (The built-in scorer is left out: it needs
  # the value to end the completion, so a `</think>` after it already fails.)
  closed = f"<think> so\n{answer}\n</think>"
  assert rewards.verify(closed, record, spec, strip_thinking=()) == 1.0
  assert rewards.verify(closed, record, spec) == 0.0


def test_strip_thinking_default_and_kinds_match_the_config():
  assert tuple(scalerl.get_config().rewards.strip_thinking) == registry.KINDS
  for mode in registry.MODES:
    config = scalerl.get_config()
    config.rewards.verifier = mode
    config_lib.validate(config)
