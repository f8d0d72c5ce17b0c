"""Tests of the tokenizers: the built-in SentencePiece model and checkpoint tokenizers."""

import json
import os
import re
import shutil

import pytest
import tokenizers
from tokenizers import decoders, models, pre_tokenizers, trainers

from configs import scalerl
from scalerl_jax.data import builtin_task
from scalerl_jax.data import tokenizer as tokenizer_lib


@pytest.fixture(scope="module")
def builtin(tmp_path_factory):
  config = scalerl.get_config()
  workdir = tmp_path_factory.mktemp("workdir")
  return tokenizer_lib.get_tokenizer(config, str(workdir)), workdir


def _config(**data):
  config = scalerl.get_config()
  with config.unlocked():
    for field, value in data.items():
      path, _, name = field.rpartition(".")
      config[path][name] = value
  return config


def test_builtin_tokenizer_special_pieces(builtin):
  tok, workdir = builtin
  assert os.path.exists(workdir / tokenizer_lib.BUILTIN_FILENAME)
  assert (tok.pad_id, tok.bos_id, tok.eos_id, tok.think_id, tok.end_think_id) == (0, 2, 3, 4, 5)
  assert 256 < tok.vocab_size <= scalerl.get_config().model.vocab_size
  assert tok.encode("<think>") == [4]
  assert tok.encode("</think>") == [5]
  # Digits are always single pieces, so arithmetic is digit by digit.
  assert tok.encode("1234567890") == [tok.encode(d)[0] for d in "1234567890"]


def test_builtin_tokenizer_round_trips_any_text(builtin):
  tok, _ = builtin
  texts = [r["prompt"] for r in builtin_task.builtin_prompts((1, 2, 3, 5), 200, 3, "val")]
  texts += [builtin_task.target_text(r) for r in builtin_task.builtin_prompts((4,), 50, 3, "train")]
  texts += ["  two  spaces\tand\nnewlines\n", "Résumé ∑ 中文 😀", "", "Answer: -12"]
  for text in texts:
    ids = tok.encode(text)
    assert all(0 <= i < tok.vocab_size for i in ids)
    assert tok.decode(ids) == text


def test_decode_drops_specials_and_marks_unknown_ids(builtin):
  tok, _ = builtin
  answer = tok.encode("Answer: 7")
  assert tok.decode([tok.bos_id] + answer + [tok.eos_id, tok.pad_id]) == "Answer: 7"
  assert tok.decode(answer[:2] + [tok.vocab_size, 10**6, -1] + answer[2:]) == (
      tok.decode(answer[:2]) + "\ufffd" * 3 + tok.decode(answer[2:]))
  assert tok.decode([]) == ""


def test_builtin_tokenizer_is_reused_not_retrained(tmp_path):
  # A model of another size already in the workdir is what get_tokenizer returns.
  path = tmp_path / tokenizer_lib.BUILTIN_FILENAME
  small = tokenizer_lib.train_builtin_tokenizer(str(path), 300)
  before = path.read_bytes()
  again = tokenizer_lib.get_tokenizer(scalerl.get_config(), str(tmp_path))
  assert small.vocab_size == again.vocab_size == 300
  assert path.read_bytes() == before


def test_builtin_training_is_deterministic(tmp_path, builtin):
  tok, workdir = builtin
  tokenizer_lib.train_builtin_tokenizer(str(tmp_path / "again.model"), 512)
  assert (tmp_path / "again.model").read_bytes() == (
      workdir / tokenizer_lib.BUILTIN_FILENAME).read_bytes()


def test_default_budgets_hold_the_builtin_task(builtin):
  tok, _ = builtin
  config = scalerl.get_config()
  records = builtin_task.builtin_prompts(config.data.builtin_difficulty, 2000, 0, "train")
  longest_prompt = max(len(tok.encode(r["prompt"])) + 1 for r in records)  # + BOS.
  longest_target = max(len(tok.encode(builtin_task.target_text(r))) + 1 for r in records)
  assert longest_prompt <= config.sampling.max_prompt_len
  assert longest_target <= config.sampling.max_new_tokens  # + EOS.


def test_vocab_size_errors_name_the_field(tmp_path, builtin):
  with pytest.raises(ValueError, match="model.vocab_size: 100 is too small"):
    tokenizer_lib.train_builtin_tokenizer(str(tmp_path / "t.model"), 100)
  tok, workdir = builtin
  config = _config(**{"model.vocab_size": tok.vocab_size - 1})
  with pytest.raises(ValueError, match=f"model.vocab_size: {tok.vocab_size - 1} is smaller"):
    tokenizer_lib.get_tokenizer(config, str(workdir))


def test_hf_directory_with_sentencepiece_model(tmp_path, builtin):
  tok, workdir = builtin
  shutil.copy(workdir / tokenizer_lib.BUILTIN_FILENAME, tmp_path / "tokenizer.model")
  loaded = tokenizer_lib.get_tokenizer(_config(**{"model.hf_path": str(tmp_path)}), "/nonexistent")
  assert loaded.path == str(tmp_path / "tokenizer.model")
  assert loaded.encode("Compute 7+5") == tok.encode("Compute 7+5")
  assert (loaded.bos_id, loaded.eos_id, loaded.think_id) == (tok.bos_id, tok.eos_id, tok.think_id)


def _write_hf_json_checkpoint(directory, settings):
  tok = tokenizers.Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>", "<|pad|>"],
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  tok.train_from_iterator(["Compute 7+5 then answer", "hello world"] * 10, trainer=trainer)
  tok.add_tokens(["<think>", "</think>"])
  tok.save(str(directory / "tokenizer.json"))
  (directory / "tokenizer_config.json").write_text(json.dumps(settings))
  return tok


def test_hf_directory_with_tokenizer_json(tmp_path):
  reference = _write_hf_json_checkpoint(tmp_path, {
      "bos_token": None, "eos_token": "<|endoftext|>",
      "pad_token": {"content": "<|pad|>", "lstrip": False}})
  tok = tokenizer_lib.load_tokenizer(str(tmp_path))
  assert tok.vocab_size == reference.get_vocab_size()
  assert tok.bos_id is None
  assert (tok.eos_id, tok.pad_id) == (0, 1)
  assert (tok.think_id, tok.end_think_id) == (reference.token_to_id("<think>"),
                                              reference.token_to_id("</think>"))
  text = "<think> 7+5 </think>\nAnswer: 12 ∑"
  ids = tok.encode(text)
  assert ids[0] == tok.think_id
  assert tok.decode(ids + [tok.eos_id]) == text


def test_hf_tokenizer_errors(tmp_path):
  _write_hf_json_checkpoint(tmp_path, {"bos_token": None})
  with pytest.raises(ValueError, match="no eos_token"):
    tokenizer_lib.load_tokenizer(str(tmp_path))
  (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|missing|>"}))
  missing = re.escape("eos_token '<|missing|>' is not in tokenizer.json")
  with pytest.raises(ValueError, match=missing):
    tokenizer_lib.load_tokenizer(str(tmp_path))
  empty = tmp_path / "empty"
  empty.mkdir()
  with pytest.raises(FileNotFoundError, match="neither tokenizer.model nor tokenizer.json"):
    tokenizer_lib.load_tokenizer(str(empty))
  with pytest.raises(FileNotFoundError, match="no such tokenizer"):
    tokenizer_lib.load_tokenizer(str(tmp_path / "absent.model"))
  (empty / "tokenizer.model").write_bytes(b"not a model")
  with pytest.raises(ValueError, match="not a SentencePiece model"):
    tokenizer_lib.load_tokenizer(str(empty))


def test_tokenizer_path_takes_precedence(tmp_path, builtin):
  _, workdir = builtin
  small = tokenizer_lib.train_builtin_tokenizer(str(tmp_path / "small.model"), 300)
  config = _config(**{"data.tokenizer_path": str(tmp_path / "small.model"),
                      "model.hf_path": str(workdir)})
  assert tokenizer_lib.get_tokenizer(config, str(workdir)).vocab_size == small.vocab_size == 300
