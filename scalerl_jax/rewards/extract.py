"""Answer-region, final-answer and code extraction from completions.

Every function here is linear in the length of its input, whatever the input
(a completion may be a megabyte of unbalanced braces), and returns None rather
than raising when nothing usable is there.
"""

from __future__ import annotations

import re
from typing import Optional

from scalerl_jax.data.builtin_task import THINK_CLOSE
from scalerl_jax.data.builtin_task import THINK_OPEN

_BOXED = re.compile(r"\\(?:boxed|fbox)[ \t]*\{")
# `Answer: ...`, `Final answer: ...`, `**Answer:** ...` on a line of its own.
# Only [ \t] is allowed before the keyword: `\s*` would rescan runs of blank
# lines from every line start and go quadratic.
_ANSWER_LINE = re.compile(r"(?im)^[ \t*#>]*(?:final[ \t]+)?answer[ \t*]*:(.*)$")
_CODE_LANGS = ("", "python", "py", "python3")


def answer_region(text: str) -> Optional[str]:
  """The part of a completion that states its answer: what follows the thinking.

  PAPER.md §5 checks the final answer after stripping the thinking trace
  `<think>...</think>`; an answer written only while thinking is a draft, not
  an answer. The region is the text after the last `</think>`. A completion
  that opened `<think>` and never closed it (no `</think>` after its last
  `<think>`) has no answer region. One without any `<think>` is all answer.
  A `</think>` with no `<think>` before it still ends the thinking: chat
  templates that open the thinking in the prompt leave only the close in the
  completion.

  A truncated completion therefore scores as follows. Cut off while thinking,
  it never closed its `<think>` and scores 0: it gave no answer, and a draft
  answer in the thinking must not be rewarded (the interruption phrase, which
  ends in `</think>`, is how a run lets a long thinking trace still answer).
  Cut off after `</think>`, it is scored on what it stated before the cut:
  an unclosed `\\boxed{`, `<answer>` tag or code fence states nothing, but an
  `Answer:` line is read as far as it got (`Answer: 1` cut from `Answer: 18`
  reads 1). Verifiers see the text only, with EOS already dropped, so the cut
  cannot be told apart from a short answer here.

  Args:
    text: the completion.

  Returns:
    The answer region (possibly empty), or None if the completion is still
    thinking at its end or is not a string.
  """
  if not isinstance(text, str):
    return None
  close = text.rfind(THINK_CLOSE)
  if text.rfind(THINK_OPEN) > close:
    return None
  return text if close < 0 else text[close + len(THINK_CLOSE):]


def _matching_braces(text: str) -> dict[int, int]:
  """Maps the index of every `{` that is closed to the index of its `}`."""
  closing = {}
  stack = []
  for match in re.finditer(r"[{}]", text):
    i = match.start()
    if text[i] == "{":
      stack.append(i)
    elif stack:
      closing[stack.pop()] = i
  return closing


def _boxed_spans(text: str) -> list[tuple[int, int]]:
  """(start, end) of the contents of every closed `\\boxed{...}`."""
  if "\\boxed" not in text and "\\fbox" not in text:
    return []
  closing = _matching_braces(text)
  spans = []
  for match in _BOXED.finditer(text):
    brace = match.end() - 1
    if brace in closing:
      spans.append((brace + 1, closing[brace]))
  return spans


def last_boxed(text: str) -> Optional[str]:
  """Contents of the `\\boxed{...}` that closes last, or None.

  Args:
    text: any string.

  Returns:
    The stripped contents; None when no `\\boxed{` is closed.
  """
  spans = _boxed_spans(text)
  if not spans:
    return None
  start, end = max(spans, key=lambda s: s[1])
  return text[start:end].strip()


def extract_final_answer(text: str) -> Optional[str]:
  """The final answer a completion states, or None.

  Three forms count: `\\boxed{...}`, `<answer>...</answer>` and an
  `Answer: ...` line. When several appear, the one that ends last wins (a
  model that corrects itself states its final answer last); a boxed answer
  inside the winning tag or line is unwrapped.

  Args:
    text: the completion.

  Returns:
    The stripped answer text, or None if the completion states none or the
    stated answer is empty.
  """
  if not isinstance(text, str):
    return None
  candidates = []  # (end position, answer)
  spans = _boxed_spans(text)
  if spans:
    start, end = max(spans, key=lambda s: s[1])
    candidates.append((end, text[start:end]))
  close = text.rfind("</answer>")
  if close >= 0:
    open_ = text.rfind("<answer>", 0, close)
    if open_ >= 0:
      candidates.append((close, text[open_ + len("<answer>"):close]))
  last_line = None
  for last_line in _ANSWER_LINE.finditer(text):
    pass
  if last_line is not None:
    candidates.append((last_line.end(), last_line.group(1)))
  if not candidates:
    return None
  answer = max(candidates, key=lambda c: c[0])[1]
  answer = last_boxed(answer) or answer
  answer = answer.strip().strip("*").strip()
  return answer or None


def extract_code(text: str) -> Optional[str]:
  """The last fenced Python (or untagged) code block of a completion, or None.

  Args:
    text: the completion.

  Returns:
    The block's source without the fence and language tag; None if the
    completion holds no closed block tagged python/py/python3 or untagged.
  """
  if not isinstance(text, str):
    return None
  parts = text.split("```")
  # Odd parts lie between an opening and a closing fence; an unclosed last
  # fence leaves an odd part at the very end, which does not count.
  for block in reversed(parts[1:len(parts) - 1:2]):
    first_line, newline, body = block.partition("\n")
    if newline and first_line.strip().lower() in _CODE_LANGS:
      return body
  return None
