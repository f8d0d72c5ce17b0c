"""The built-in task's SentencePiece model: its corpus and its training.

It splits digits, keeps `<think>` and `</think>` whole, normalises nothing
(decode(encode(text)) == text) and falls back to bytes, so any prompt
encodes. Design: docs/design/data.md.
"""

from __future__ import annotations

import io
import uuid

from etils import epath
import sentencepiece as spm

from scalerl_jax.data import builtin_code
from scalerl_jax.data import builtin_task

_PAD, _UNK, _BOS, _EOS = 0, 1, 2, 3  # Ids of the model's special pieces.
# The corpus is fixed, so the vocabulary depends only on its size.
_CORPUS_LEVELS = (1, 2, 3, 4)
_CORPUS_PROBLEMS = 2000


def corpus(code: bool = False) -> list[str]:
  """The training lines: prompts and worked targets (of code too if `code`)."""
  lines = []
  for problem in builtin_task.builtin_problems(
      _CORPUS_LEVELS, _CORPUS_PROBLEMS, 0, "train"
  ):
    lines += [
        builtin_task.prompt_text(problem),
        builtin_task.solution_text(problem),
    ]
  if code:
    for record in builtin_code.code_prompts(
        _CORPUS_LEVELS[:3], _CORPUS_PROBLEMS, 0, "train"
    ):
      lines += [record["prompt"], builtin_code.target_text(record)]
  return lines


def write_model(path: str, vocab_size: int, code: bool = False) -> bytes:
  """Trains the model deterministically, writes it to `path` atomically.

  Returns the serialized model. `vocab_size` is an upper bound.

  Raises:
    ValueError: `vocab_size` is under ~300, too small for the corpus.
  """
  model = io.BytesIO()
  try:
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus(code)),
        model_writer=model,
        vocab_size=vocab_size,
        hard_vocab_limit=False,
        model_type="bpe",
        pad_id=_PAD,
        unk_id=_UNK,
        bos_id=_BOS,
        eos_id=_EOS,
        user_defined_symbols=[
            builtin_task.THINK_OPEN,
            builtin_task.THINK_CLOSE,
        ],
        split_digits=True,
        byte_fallback=True,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        add_dummy_prefix=False,
        num_threads=1,
        minloglevel=2,
    )
  except RuntimeError as e:
    raise ValueError(
        f"model.vocab_size: {vocab_size} is too small for the built-in "
        f"tokenizer ({e})"
    ) from None
  out = epath.Path(path)
  out.parent.mkdir(parents=True, exist_ok=True)
  # Every process of a multi-host run trains this same file at once: each
  # writes a file of its own and the last replace wins.
  tmp = out.parent / f".{out.name}.{uuid.uuid4().hex}.tmp"
  tmp.write_bytes(model.getvalue())
  tmp.replace(out)
  return model.getvalue()
