"""Answer-region, final-answer and code extraction from completions.

Every function is linear in its input's length, whatever the input, and
returns None rather than raising. Design: docs/design/rewards.md.
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
  """The answer region: the text after the last `</think>`, else all of it.

  None when a `<think>` follows the last `</think>` (still thinking). A lone
  `</think>` counts: some templates open the thinking in the prompt.
  """
  if not isinstance(text, str):
    return None
  close = text.rfind(THINK_CLOSE)
  if text.rfind(THINK_OPEN) > close:
    return None
  return text if close < 0 else text[close + len(THINK_CLOSE) :]


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
  """Stripped contents of the `\\boxed{...}` that closes last, or None."""
  spans = _boxed_spans(text)
  if not spans:
    return None
  start, end = max(spans, key=lambda s: s[1])
  return text[start:end].strip()


def extract_final_answer(text: str) -> Optional[str]:
  """The final answer a completion states (stripped), or None if none/empty.

  `\\boxed{...}`, `<answer>...</answer>` or an `Answer: ...` line, whichever
  ends last; a boxed answer inside the winning tag or line is unwrapped.
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
      candidates.append((close, text[open_ + len("<answer>") : close]))
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
  """Source of the last closed fenced code block, or None.

  Only untagged blocks and those tagged python, py or python3 count.
  """
  if not isinstance(text, str):
    return None
  parts = text.split("```")
  # Odd parts lie between an opening and a closing fence; an unclosed last
  # fence leaves an odd part at the very end, which does not count.
  for block in reversed(parts[1 : len(parts) - 1 : 2]):
    first_line, newline, body = block.partition("\n")
    if newline and first_line.strip().lower() in _CODE_LANGS:
      return body
  return None
