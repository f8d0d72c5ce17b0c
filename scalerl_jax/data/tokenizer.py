"""Tokenizers: the built-in task's, or one shipped with a checkpoint.

`get_tokenizer` reads data.tokenizer_path, else model.hf_path's, else
`<workdir>/tokenizer.model` (trained on first use). `completion_text`, which
verifiers score, puts a `<think>` the prompt left open before the reply, so
one stripping rule holds for every template. Design: docs/design/data.md.
"""

from __future__ import annotations

import json
import re
from typing import Any, Mapping, Optional, Sequence

from etils import epath
import ml_collections
import numpy as np
import sentencepiece as spm

from scalerl_jax import workdir as workdir_lib
from scalerl_jax.data import builtin_code
from scalerl_jax.data import builtin_task
from scalerl_jax.data import builtin_tokenizer
from scalerl_jax.data import chat_template as chat_template_lib

GENERATION_CONFIG = "generation_config.json"
# Files beside a tokenizer that name its special tokens (later ones win).
_SETTINGS_FILES = ("special_tokens_map.json", "tokenizer_config.json")
THINK_TOKENS = (builtin_task.THINK_OPEN, builtin_task.THINK_CLOSE)
# What decode writes for an id outside the vocabulary.
UNKNOWN_TEXT = "\ufffd"


class Tokenizer:
  """Text <-> ids in [0, vocab_size), with the special ids the RL loop needs.

  `bos_id`, `think_id`, `end_think_id` and `chat_template` may be None;
  `pad_id` falls back to `eos_id`; `stop_ids` is `eos_id`, then the
  `eos_token_id`s of generation_config.json.
  """

  def __init__(
      self,
      backend: Any,
      *,
      path: str,
      vocab_size: int,
      bos_id: Optional[int],
      eos_id: int,
      pad_id: int,
      think_id: Optional[int],
      end_think_id: Optional[int],
      stop_ids: Sequence[int] = (),
      chat_template: Optional[chat_template_lib.ChatTemplate] = None,
      special_pieces: Optional[Mapping[str, int]] = None,
  ):
    # spm.SentencePieceProcessor or tokenizers.Tokenizer.
    self._backend = backend
    self.path = path
    self.vocab_size = vocab_size
    self.bos_id = bos_id
    self.eos_id = eos_id
    self.stop_ids = tuple(dict.fromkeys((eos_id, *stop_ids)))
    self.pad_id = pad_id
    self.think_id = think_id
    self.end_think_id = end_think_id
    self.chat_template = chat_template
    # SentencePiece does not read control pieces (`<s>`) in text; rendered
    # templates print them, and transformers reads them as their ids.
    self._special_pieces = dict(special_pieces or {})
    self._special_re = re.compile(
        "|".join(
            re.escape(t)
            for t in sorted(self._special_pieces, key=len, reverse=True)
        )
    )
    # Special ids decode drops: all the tokenizer marks special except the
    # thinking tags, which verifiers must see to strip the thinking.
    self._skip_ids = frozenset()
    if not isinstance(backend, spm.SentencePieceProcessor):
      self._skip_ids = frozenset(
          i
          for i, t in backend.get_added_tokens_decoder().items()
          if t.special and i not in (think_id, end_think_id)
      )

  def encode(self, text: str) -> list[int]:
    """Ids of `text`, without BOS or EOS; special-token text becomes its id."""
    if not isinstance(self._backend, spm.SentencePieceProcessor):
      return self._backend.encode(text, add_special_tokens=False).ids
    if not self._special_pieces:
      return self._backend.encode(text)
    ids, start = [], 0
    for match in self._special_re.finditer(text):
      ids += self._backend.encode(text[start : match.start()]) + [
          self._special_pieces[match.group()]
      ]
      start = match.end()
    return ids + self._backend.encode(text[start:])

  def decode(self, ids: Sequence[int]) -> str:
    """Text of `ids`, without special tokens but the thinking tags.

    Ids outside [0, vocab_size) (a larger model vocabulary) become U+FFFD.
    """
    pieces, run = [], []
    for i in ids:
      i = int(i)
      if 0 <= i < self.vocab_size:
        if i not in self._skip_ids:
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
    return self._backend.decode(ids, skip_special_tokens=False)

  def open_thinking(self, prompt_ids: Sequence[int]) -> int:
    """Index of the last `<think>` if only whitespace follows it, else -1."""
    if self.think_id is None:
      return -1
    at = np.flatnonzero(np.asarray(prompt_ids) == self.think_id)
    if not at.size or self.decode(prompt_ids[at[-1] + 1 :]).strip():
      return -1
    return int(at[-1])

  def completion_text(
      self, prompt_ids: Sequence[int], completion_ids: Sequence[int]
  ) -> str:
    """The text verifiers score, after the prompt's open `<think>` if any.

    A final stop id is dropped.
    """
    ids = [int(i) for i in completion_ids]
    if ids and ids[-1] in self.stop_ids:
      ids = ids[:-1]
    start = self.open_thinking(prompt_ids)
    if start >= 0:
      ids = [int(i) for i in prompt_ids[start:]] + ids
    return self.decode(ids)


def _read_json(path: epath.Path) -> Any:
  try:
    return json.loads(path.read_text())
  except json.JSONDecodeError as e:
    raise ValueError(f"{path}: invalid JSON ({e})") from None


def _settings(directory: epath.Path) -> dict[str, Any]:
  """tokenizer_config.json over special_tokens_map.json, where they exist."""
  settings = {}
  for name in _SETTINGS_FILES:
    if (directory / name).exists():
      found = _read_json(directory / name)
      if not isinstance(found, dict):
        raise ValueError(f"{directory / name}: expected a JSON object")
      settings.update(found)
  return settings


def _generation_stop_ids(directory: epath.Path, vocab_size: int) -> list[int]:
  """The `eos_token_id`s of generation_config.json (int or list), if any."""
  path = directory / GENERATION_CONFIG
  if not path.exists():
    return []
  found = _read_json(path)
  value = found.get("eos_token_id") if isinstance(found, dict) else None
  ids = [value] if isinstance(value, int) else value
  if ids is None:
    return []
  if not isinstance(ids, list) or not all(
      isinstance(i, int) and not isinstance(i, bool) for i in ids
  ):
    raise ValueError(
        f"{path}: eos_token_id must be an int or a list of ints, got {value!r}"
    )
  bad = [i for i in ids if not 0 <= i < vocab_size]
  if bad:
    raise ValueError(
        f"{path}: eos_token_id {bad} outside the tokenizer's {vocab_size} ids"
    )
  return ids


def _from_sentencepiece(
    model_proto: bytes, path: str, settings: Mapping[str, Any]
) -> dict[str, Any]:
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
  special_pieces = {}
  for name in chat_template_lib.SPECIAL_TOKEN_NAMES:
    text = chat_template_lib.special_token_text(settings, name)
    piece_id = sp.piece_to_id(text) if text else -1
    if (
        piece_id >= 0
        and sp.id_to_piece(piece_id) == text
        and (sp.IsControl(piece_id) or sp.IsUnknown(piece_id))
    ):
      special_pieces[text] = piece_id
  return dict(
      backend=sp,
      path=path,
      vocab_size=sp.vocab_size(),
      bos_id=known(sp.bos_id()),
      eos_id=eos,
      pad_id=eos if pad is None else pad,
      think_id=piece(THINK_TOKENS[0]),
      end_think_id=piece(THINK_TOKENS[1]),
      special_pieces=special_pieces,
  )


def _from_tokenizer_json(
    path: epath.Path, settings: Mapping[str, Any]
) -> dict[str, Any]:
  try:
    import tokenizers  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise ImportError(
        f"{path}: reading tokenizer.json needs the `tokenizers` package "
        "(pip install 'scalerl_jax[hf]')"
    ) from None
  try:
    tok = tokenizers.Tokenizer.from_str(path.read_text())
  except Exception as e:
    # tokenizers raises its own Exception type on bad JSON.
    raise ValueError(
        f"{path}: not a Hugging Face tokenizer.json ({e})"
    ) from None

  # Which tokens are BOS/EOS/PAD is stated beside tokenizer.json, not in it.
  def token_id(name):
    text = chat_template_lib.special_token_text(settings, name)
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
        "the sampler needs one to stop generating"
    )
  pad = token_id("pad_token")
  return dict(
      backend=tok,
      path=str(path),
      vocab_size=tok.get_vocab_size(with_added_tokens=True),
      bos_id=token_id("bos_token"),
      eos_id=eos,
      pad_id=eos if pad is None else pad,
      think_id=tok.token_to_id(THINK_TOKENS[0]),
      end_think_id=tok.token_to_id(THINK_TOKENS[1]),
  )


def load_tokenizer(path: str) -> Tokenizer:
  """Reads a tokenizer and the files beside it, offline.

  `path`: a tokenizer file, or a directory's tokenizer.model (else .json).

  Raises:
    FileNotFoundError: nothing to read at `path`.
    ValueError: not a known tokenizer, or a malformed file beside it.
  """
  p = epath.Path(path)
  if p.is_dir():
    for name in ("tokenizer.model", "tokenizer.json"):
      if (p / name).exists():
        p = p / name
        break
    else:
      raise FileNotFoundError(
          f"{path}: directory holds neither tokenizer.model nor tokenizer.json"
      )
  elif not p.exists():
    raise FileNotFoundError(f"{path}: no such tokenizer file or directory")
  settings = _settings(p.parent)
  if p.name.endswith(".json"):
    fields = _from_tokenizer_json(p, settings)
  else:
    fields = _from_sentencepiece(p.read_bytes(), str(p), settings)
  return Tokenizer(
      **fields,
      stop_ids=_generation_stop_ids(p.parent, fields["vocab_size"]),
      chat_template=chat_template_lib.load(p.parent, settings),
  )


def train_builtin_tokenizer(
    path: str, vocab_size: int, code: bool = False
) -> Tokenizer:
  """Trains the built-in model (builtin_tokenizer.write_model) and reads it."""
  model = builtin_tokenizer.write_model(path, vocab_size, code)
  return Tokenizer(**_from_sentencepiece(model, str(epath.Path(path)), {}))


def get_tokenizer(config: ml_collections.ConfigDict, workdir: str) -> Tokenizer:
  """The tokenizer of an experiment (the module docstring says which).

  Raises:
    ValueError: the tokenizer has more ids than `config.model.vocab_size`.
  """
  if config.data.tokenizer_path:
    tok = load_tokenizer(config.data.tokenizer_path)
  elif config.model.hf_path:
    tok = load_tokenizer(config.model.hf_path)
  else:
    path = epath.Path(workdir) / workdir_lib.TOKENIZER_FILE
    if path.exists():
      tok = load_tokenizer(str(path))
    else:
      domains = (config.data.get("mixture", None) or {}).values()
      sources = {config.data.source} | {d.get("source", "") for d in domains}
      tok = train_builtin_tokenizer(
          str(path),
          config.model.vocab_size,
          code=builtin_code.SOURCE in sources,
      )
  if tok.vocab_size > config.model.vocab_size:
    raise ValueError(
        f"model.vocab_size: {config.model.vocab_size} is smaller than the "
        f"{tok.vocab_size} ids of the tokenizer {tok.path}"
    )
  return tok
