"""Tokenizers: one trained for the built-in task, or one shipped with a checkpoint.

`get_tokenizer(config, workdir)` chooses, in this order:
  1. `config.data.tokenizer_path`: a SentencePiece `.model` file, a
     `tokenizer.json`, or a directory holding either;
  2. `config.model.hf_path`: the tokenizer in that Hugging Face checkpoint
     directory (`tokenizer.model` through sentencepiece, else `tokenizer.json`
     through the `tokenizers` package, extra `[hf]`), read offline;
  3. otherwise `<workdir>/tokenizer.model`: a SentencePiece BPE model trained
     on the built-in task's corpus on first use (well under a second) and
     reused on every later call, so a resumed run keeps its token ids.

The built-in model splits digits, keeps `<think>` and `</think>` as single
pieces, normalises nothing (decode(encode(text)) == text) and falls back to
bytes for characters outside its corpus, so any prompt source can be encoded.
`config.model.vocab_size` is its upper bound: the arithmetic corpus fills 316
of 512 entries (256 of them bytes); the model's spare embedding rows are never
produced by encode, and decode turns them into U+FFFD.
"""

from __future__ import annotations

import io
import json
from typing import Any, Optional, Sequence

from etils import epath
import ml_collections
import sentencepiece as spm

from scalerl_jax.data import builtin_task

BUILTIN_FILENAME = "tokenizer.model"
THINK_TOKENS = (builtin_task.THINK_OPEN, builtin_task.THINK_CLOSE)
UNKNOWN_TEXT = "\ufffd"  # What decode writes for an id outside the vocabulary.
_PAD, _UNK, _BOS, _EOS = 0, 1, 2, 3  # Ids of the built-in model's special pieces.
# Corpus of the built-in model: fixed, so the vocabulary depends only on its size.
_CORPUS_LEVELS = (1, 2, 3, 4)
_CORPUS_PROBLEMS = 2000


class Tokenizer:
  """Text <-> token ids, with the ids of the special tokens the RL loop needs.

  Attributes:
    path: the file the tokenizer was read from.
    vocab_size: number of ids; encode returns ids in [0, vocab_size).
    bos_id: begin-of-sequence id, or None when the tokenizer has none (Qwen).
    eos_id: end-of-sequence id; generation stops there.
    pad_id: padding id (the eos id when the tokenizer defines no pad).
    think_id, end_think_id: ids of `<think>` and `</think>`, or None.
  """

  def __init__(self, backend: Any, *, path: str, vocab_size: int, bos_id: Optional[int],
               eos_id: int, pad_id: int, think_id: Optional[int],
               end_think_id: Optional[int]):
    self._backend = backend  # spm.SentencePieceProcessor or tokenizers.Tokenizer.
    self.path = path
    self.vocab_size = vocab_size
    self.bos_id = bos_id
    self.eos_id = eos_id
    self.pad_id = pad_id
    self.think_id = think_id
    self.end_think_id = end_think_id

  def encode(self, text: str) -> list[int]:
    """Token ids of `text`, without BOS or EOS."""
    if isinstance(self._backend, spm.SentencePieceProcessor):
      return self._backend.encode(text)
    return self._backend.encode(text, add_special_tokens=False).ids

  def decode(self, ids: Sequence[int]) -> str:
    """Text of `ids`; BOS/EOS/PAD are dropped, unknown ids become U+FFFD.

    Args:
      ids: token ids, e.g. a row of sampled completion tokens. Ids outside
        [0, vocab_size) are possible when the model's vocabulary is larger
        than the tokenizer's.

    Returns:
      The decoded text.
    """
    pieces, run = [], []
    for i in ids:
      i = int(i)
      if 0 <= i < self.vocab_size:
        run.append(i)
        continue
      pieces += [self._decode_known(run), UNKNOWN_TEXT]
      run = []
    pieces.append(self._decode_known(run))
    return "".join(pieces)

  def _decode_known(self, ids: list[int]) -> str:
    if not ids:
      return ""
    if isinstance(self._backend, spm.SentencePieceProcessor):
      return self._backend.decode(ids)
    return self._backend.decode(ids, skip_special_tokens=True)


def _from_sentencepiece(model_proto: bytes, path: str) -> Tokenizer:
  sp = spm.SentencePieceProcessor()
  try:
    sp.LoadFromSerializedProto(model_proto)
  except RuntimeError as e:
    raise ValueError(f"{path}: not a SentencePiece model ({e})") from None

  def known(piece_id):
    return piece_id if piece_id >= 0 else None

  def piece(text):
    piece_id = sp.piece_to_id(text)
    return None if piece_id == sp.unk_id() else piece_id

  eos = known(sp.eos_id())
  if eos is None:
    raise ValueError(f"{path}: the SentencePiece model defines no EOS piece")
  pad = known(sp.pad_id())
  return Tokenizer(sp, path=path, vocab_size=sp.vocab_size(), bos_id=known(sp.bos_id()),
                   eos_id=eos, pad_id=eos if pad is None else pad,
                   think_id=piece(THINK_TOKENS[0]), end_think_id=piece(THINK_TOKENS[1]))


def _special_token(settings: dict[str, Any], name: str) -> Optional[str]:
  value = settings.get(name)
  if isinstance(value, dict):  # {"content": "<|endoftext|>", "lstrip": false, ...}
    value = value.get("content")
  return value if isinstance(value, str) and value else None


def _from_tokenizer_json(path: epath.Path) -> Tokenizer:
  try:
    import tokenizers  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise ImportError(
        f"{path}: reading tokenizer.json needs the `tokenizers` package "
        "(pip install 'scalerl_jax[hf]')") from None
  try:
    tok = tokenizers.Tokenizer.from_str(path.read_text())
  except Exception as e:  # tokenizers raises its own Exception type on bad JSON.
    raise ValueError(f"{path}: not a Hugging Face tokenizer.json ({e})") from None
  # Which tokens are BOS/EOS/PAD is stated beside tokenizer.json, not in it.
  settings = {}
  for name in ("special_tokens_map.json", "tokenizer_config.json"):
    side = path.parent / name
    if side.exists():
      try:
        settings.update(json.loads(side.read_text()))
      except json.JSONDecodeError as e:
        raise ValueError(f"{side}: invalid JSON ({e})") from None

  def token_id(name):
    text = _special_token(settings, name)
    if text is None:
      return None
    token = tok.token_to_id(text)
    if token is None:
      raise ValueError(f"{path.parent}: {name} {text!r} is not in {path.name}")
    return token

  eos = token_id("eos_token")
  if eos is None:
    raise ValueError(
        f"{path.parent}: no eos_token in tokenizer_config.json or special_tokens_map.json; "
        "the sampler needs one to stop generating")
  pad = token_id("pad_token")
  return Tokenizer(tok, path=str(path), vocab_size=tok.get_vocab_size(with_added_tokens=True),
                   bos_id=token_id("bos_token"), eos_id=eos, pad_id=eos if pad is None else pad,
                   think_id=tok.token_to_id(THINK_TOKENS[0]),
                   end_think_id=tok.token_to_id(THINK_TOKENS[1]))


def load_tokenizer(path: str) -> Tokenizer:
  """Reads a tokenizer from a file or a checkpoint directory, offline.

  Args:
    path: a SentencePiece model file, a `tokenizer.json`, or a directory
      holding `tokenizer.model` (preferred) or `tokenizer.json`.

  Returns:
    The tokenizer.

  Raises:
    FileNotFoundError: nothing to read at `path`.
    ValueError: the file is not a tokenizer of a known kind.
  """
  p = epath.Path(path)
  if p.is_dir():
    for name in ("tokenizer.model", "tokenizer.json"):
      if (p / name).exists():
        p = p / name
        break
    else:
      raise FileNotFoundError(f"{path}: directory holds neither tokenizer.model nor tokenizer.json")
  elif not p.exists():
    raise FileNotFoundError(f"{path}: no such tokenizer file or directory")
  if p.name.endswith(".json"):
    return _from_tokenizer_json(p)
  return _from_sentencepiece(p.read_bytes(), str(p))


def builtin_corpus() -> list[str]:
  """The lines the built-in tokenizer is trained on: prompts and worked targets."""
  lines = []
  for problem in builtin_task.builtin_problems(_CORPUS_LEVELS, _CORPUS_PROBLEMS, 0, "train"):
    lines += [builtin_task.prompt_text(problem), builtin_task.solution_text(problem)]
  return lines


def train_builtin_tokenizer(path: str, vocab_size: int) -> Tokenizer:
  """Trains the built-in task's SentencePiece model and writes it to `path`.

  Training is deterministic: the same `vocab_size` writes the same file.

  Args:
    path: where to write the model file (written atomically).
    vocab_size: upper bound on the vocabulary; at least ~300 (256 byte pieces,
      the corpus characters and the special pieces).

  Returns:
    The trained tokenizer.

  Raises:
    ValueError: `vocab_size` is too small for the corpus.
  """
  model = io.BytesIO()
  try:
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(builtin_corpus()), model_writer=model,
        vocab_size=vocab_size, hard_vocab_limit=False, model_type="bpe",
        pad_id=_PAD, unk_id=_UNK, bos_id=_BOS, eos_id=_EOS,
        user_defined_symbols=list(THINK_TOKENS), split_digits=True, byte_fallback=True,
        normalization_rule_name="identity", remove_extra_whitespaces=False,
        add_dummy_prefix=False, num_threads=1, minloglevel=2)
  except RuntimeError as e:
    raise ValueError(f"model.vocab_size: {vocab_size} is too small for the built-in "
                     f"tokenizer ({e})") from None
  out = epath.Path(path)
  out.parent.mkdir(parents=True, exist_ok=True)
  tmp = out.parent / f".{out.name}.tmp"
  tmp.write_bytes(model.getvalue())
  tmp.rename(out)
  return _from_sentencepiece(model.getvalue(), str(out))


def get_tokenizer(config: ml_collections.ConfigDict, workdir: str) -> Tokenizer:
  """The tokenizer of an experiment (see the module docstring for the order).

  Args:
    config: the experiment config.
    workdir: the run's directory; holds the built-in tokenizer.

  Returns:
    The tokenizer.

  Raises:
    ValueError: the tokenizer has more ids than `config.model.vocab_size`.
  """
  if config.data.tokenizer_path:
    tok = load_tokenizer(config.data.tokenizer_path)
  elif config.model.hf_path:
    tok = load_tokenizer(config.model.hf_path)
  else:
    path = epath.Path(workdir) / BUILTIN_FILENAME
    if path.exists():
      tok = load_tokenizer(str(path))
    else:
      tok = train_builtin_tokenizer(str(path), config.model.vocab_size)
  if tok.vocab_size > config.model.vocab_size:
    raise ValueError(
        f"model.vocab_size: {config.model.vocab_size} is smaller than the "
        f"{tok.vocab_size} ids of the tokenizer {tok.path}")
  return tok
