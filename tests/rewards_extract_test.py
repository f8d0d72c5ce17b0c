"""Tests of final-answer and code-block extraction."""

import time

import pytest

from scalerl_jax.rewards import extract


@pytest.mark.parametrize(
    "text, region",
    [
        ("no thinking, Answer: 4", "no thinking, Answer: 4"),  # All answer.
        ("<think> Answer: 3 </think>\nAnswer: 4", "\nAnswer: 4"),
        ("<think> Answer: 3 </think>", ""),  # Closed with nothing after: empty.
        # After the last close.
        ("<think> a </think> b <think> c </think> d", " d"),
        # Thinking opened in the prompt.
        ("so ... </think> Answer: 4", " Answer: 4"),
        ("<think> Answer: 3", None),  # Never closed: no answer region.
        (
            "<think> a </think> Answer: 3 <think> b",
            None,
        ),  # Reopened, never closed.
        ("", ""),
        (None, None),
    ],
)
def test_answer_region(text, region):
  assert extract.answer_region(text) == region


@pytest.mark.parametrize(
    "text, answer",
    [
        (r"so \boxed{42}.", "42"),
        (
            r"\boxed{\frac{1}{2}} and later \boxed{ \frac{3}{4} }",
            r"\frac{3}{4}",
        ),
        (r"\boxed{\{1, 2\}}", r"\{1, 2\}"),  # Escaped braces still nest.
        (r"\fbox{7}", "7"),
        (r"\boxed {x^{2}}", "x^{2}"),
        ("<think>Answer: 3</think>\nAnswer: 4", "4"),
        ("**Answer:** 12", "12"),
        ("Final answer: -5\n", "-5"),
        ("<answer>\nred, blue\n</answer>", "red, blue"),
        # Whatever ends last wins: the tag after the boxed answer ...
        (r"\boxed{1} then <answer>2</answer>", "2"),
        # ... and the boxed answer after the line.
        ("Answer: 1\n\n" r"on reflection \boxed{2}", "2"),
        # A boxed answer inside the winning line is unwrapped.
        (r"Answer: \boxed{9}", "9"),
    ],
)
def test_final_answer_forms(text, answer):
  assert extract.extract_final_answer(text) == answer


@pytest.mark.parametrize(
    "text",
    [
        None,
        "",
        "no answer here",
        r"\boxed{",
        r"\boxed{42",
        r"\boxed",
        r"\boxed}",
        "<answer>42",
        "42</answer>",
        "Answer:",
        "Answer:   ",
        r"\boxed{}",
    ],
)
def test_no_final_answer(text):
  assert extract.extract_final_answer(text) is None


def test_unclosed_box_falls_back_to_the_closed_one():
  assert extract.extract_final_answer(r"\boxed{5} \boxed{6") == "5"
  assert extract.last_boxed(r"\boxed{\boxed{3}") == "3"


@pytest.mark.parametrize(
    "text",
    [
        "{" * 1_000_000,
        "\\boxed{" * 150_000,
        "\n" * 1_000_000 + "Answer: 1",
        " \t" * 500_000,
        "```" * 300_000,
        "<think>" * 150_000,
        "</think><think>" * 70_000,
    ],
)
def test_megabyte_inputs_are_linear(text):
  # A quadratic scan of a megabyte would take minutes.
  start = time.monotonic()
  extract.answer_region(text)
  extract.extract_final_answer(text)
  extract.extract_code(text)
  assert time.monotonic() - start < 5.0


@pytest.mark.parametrize(
    "text, code",
    [
        ("```python\nprint(1)\n```", "print(1)\n"),
        ("```py\na = 1\n```\ntext\n```python3\nb = 2\n```", "b = 2\n"),
        ("```\nx = 3\n```", "x = 3\n"),
        # The last block is JSON, so the last Python block is taken.
        ("```python\nok = 1\n```\n```json\n{}\n```", "ok = 1\n"),
    ],
)
def test_code_blocks(text, code):
  assert extract.extract_code(text) == code


@pytest.mark.parametrize(
    "text", [None, "", "print(1)", "```python\nprint(1)", "```json\n{}\n```"]
)
def test_no_code_block(text):
  assert extract.extract_code(text) is None
