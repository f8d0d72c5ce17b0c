"""The built-in task's SentencePiece model: its corpus and its training.

The model splits digits, keeps `<think>` and `</think>` as single pieces,
normalises nothing (decode(encode(text)) == text) and falls back to bytes for
characters outside its corpus, so any prompt source can be encoded.
`config.model.vocab_size` is its upper bound: the arithmetic corpus fills 316
of 512 entries (256 of them bytes); the model's spare embedding rows are never
produced by encode, and decode turns them into U+FFFD.

`tokenizer.train_builtin_tokenizer` wraps the written model in a `Tokenizer`.
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
  """The lines the built-in model is trained on: prompts and worked targets.

  Args:
    code: add the built-in code domain's (`builtin_code`), for runs that
      train on it; without it the model and its ids are as they always were.
  """
  lines = []
  for problem in builtin_task.builtin_problems(_CORPUS_LEVELS, _CORPUS_PROBLEMS, 0, "train"):
    lines += [builtin_task.prompt_text(problem), builtin_task.solution_text(problem)]
  if code:
    for record in builtin_code.code_prompts(_CORPUS_LEVELS[:3], _CORPUS_PROBLEMS, 0, "train"):
      lines += [record["prompt"], builtin_code.target_text(record)]
  return lines


def write_model(path: str, vocab_size: int, code: bool = False) -> bytes:
  """Trains the built-in model and writes it to `path`.

  Training is deterministic: the same `vocab_size` writes the same file.

  Args:
    path: where to write the model file (written atomically, also when
      several processes write it at once).
    vocab_size: upper bound on the vocabulary; at least ~300 (256 byte pieces,
      the corpus characters and the special pieces).
    code: train on the code domain's lines too (`corpus`).

  Returns:
    The serialized model, as written.

  Raises:
    ValueError: `vocab_size` is too small for the corpus.
  """
  model = io.BytesIO()
  try:
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus(code)), model_writer=model,
        vocab_size=vocab_size, hard_vocab_limit=False, model_type="bpe",
        pad_id=_PAD, unk_id=_UNK, bos_id=_BOS, eos_id=_EOS,
        user_defined_symbols=[builtin_task.THINK_OPEN, builtin_task.THINK_CLOSE],
        split_digits=True, byte_fallback=True,
        normalization_rule_name="identity", remove_extra_whitespaces=False,
        add_dummy_prefix=False, num_threads=1, minloglevel=2)
  except RuntimeError as e:
    raise ValueError(f"model.vocab_size: {vocab_size} is too small for the built-in "
                     f"tokenizer ({e})") from None
  out = epath.Path(path)
  out.parent.mkdir(parents=True, exist_ok=True)
  # Every process of a multi-host run trains this same file at once: each
  # writes a file of its own and the last replace wins.
  tmp = out.parent / f".{out.name}.{uuid.uuid4().hex}.tmp"
  tmp.write_bytes(model.getvalue())
  tmp.replace(out)
  return model.getvalue()
