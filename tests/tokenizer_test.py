"""Tests of the tokenizers: the built-in SentencePiece model and
checkpoint tokenizers."""

import json
import os
import re
import shutil

import pytest
import tokenizers
from tokenizers import decoders
from tokenizers import models
from tokenizers import pre_tokenizers
from tokenizers import trainers

from configs import scalerl
from scalerl_jax import workdir as workdir_lib
from scalerl_jax.data import builtin_task
from scalerl_jax.data import tokenizer as tokenizer_lib
from scalerl_jax.rewards import registry
from tests import instruct_checkpoint


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
  assert os.path.exists(workdir / workdir_lib.TOKENIZER_FILE)
  assert (
      tok.pad_id,
      tok.bos_id,
      tok.eos_id,
      tok.think_id,
      tok.end_think_id,
  ) == (0, 2, 3, 4, 5)
  assert 256 < tok.vocab_size <= scalerl.get_config().model.vocab_size
  assert tok.encode("<think>") == [4]
  assert tok.encode("</think>") == [5]
  # Digits are always single pieces, so arithmetic is digit by digit.
  assert tok.encode("1234567890") == [tok.encode(d)[0] for d in "1234567890"]


def test_builtin_tokenizer_round_trips_any_text(builtin):
  tok, _ = builtin
  texts = [
      r["prompt"]
      for r in builtin_task.builtin_prompts((1, 2, 3, 5), 200, 3, "val")
  ]
  texts += [
      builtin_task.target_text(r)
      for r in builtin_task.builtin_prompts((4,), 50, 3, "train")
  ]
  texts += [
      "  two  spaces\tand\nnewlines\n",
      "Résumé ∑ 中文 😀",
      "",
      "Answer: -12",
  ]
  for text in texts:
    ids = tok.encode(text)
    assert all(0 <= i < tok.vocab_size for i in ids)
    assert tok.decode(ids) == text


def test_decode_drops_specials_and_marks_unknown_ids(builtin):
  tok, _ = builtin
  answer = tok.encode("Answer: 7")
  assert (
      tok.decode([tok.bos_id] + answer + [tok.eos_id, tok.pad_id])
      == "Answer: 7"
  )
  assert tok.decode(
      answer[:2] + [tok.vocab_size, 10**6, -1] + answer[2:]
  ) == (tok.decode(answer[:2]) + "\ufffd" * 3 + tok.decode(answer[2:]))
  assert tok.decode([]) == ""


def test_builtin_tokenizer_is_reused_not_retrained(tmp_path):
  # A model of another size already in the workdir is what
  # get_tokenizer returns.
  path = tmp_path / workdir_lib.TOKENIZER_FILE
  small = tokenizer_lib.train_builtin_tokenizer(str(path), 300)
  before = path.read_bytes()
  again = tokenizer_lib.get_tokenizer(scalerl.get_config(), str(tmp_path))
  assert small.vocab_size == again.vocab_size == 300
  assert path.read_bytes() == before


def test_builtin_training_is_deterministic(tmp_path, builtin):
  tok, workdir = builtin
  tokenizer_lib.train_builtin_tokenizer(str(tmp_path / "again.model"), 512)
  assert (tmp_path / "again.model").read_bytes() == (
      workdir / workdir_lib.TOKENIZER_FILE
  ).read_bytes()


def test_default_budgets_hold_the_builtin_task(builtin):
  tok, _ = builtin
  config = scalerl.get_config()
  records = builtin_task.builtin_prompts(
      config.data.builtin_difficulty, 2000, 0, "train"
  )
  # + BOS.
  longest_prompt = max(len(tok.encode(r["prompt"])) + 1 for r in records)
  longest_target = max(
      len(tok.encode(builtin_task.target_text(r))) + 1 for r in records
  )
  assert longest_prompt <= config.sampling.max_prompt_len
  assert longest_target <= config.sampling.max_new_tokens  # + EOS.


def test_vocab_size_errors_name_the_field(tmp_path, builtin):
  with pytest.raises(ValueError, match="model.vocab_size: 100 is too small"):
    tokenizer_lib.train_builtin_tokenizer(str(tmp_path / "t.model"), 100)
  tok, workdir = builtin
  config = _config(**{"model.vocab_size": tok.vocab_size - 1})
  with pytest.raises(
      ValueError, match=f"model.vocab_size: {tok.vocab_size - 1} is smaller"
  ):
    tokenizer_lib.get_tokenizer(config, str(workdir))


def test_hf_directory_with_sentencepiece_model(tmp_path, builtin):
  tok, workdir = builtin
  shutil.copy(
      workdir / workdir_lib.TOKENIZER_FILE, tmp_path / "tokenizer.model"
  )
  loaded = tokenizer_lib.get_tokenizer(
      _config(**{"model.hf_path": str(tmp_path)}), "/nonexistent"
  )
  assert loaded.path == str(tmp_path / "tokenizer.model")
  assert loaded.encode("Compute 7+5") == tok.encode("Compute 7+5")
  assert (loaded.bos_id, loaded.eos_id, loaded.think_id) == (
      tok.bos_id,
      tok.eos_id,
      tok.think_id,
  )


def _write_hf_json_checkpoint(directory, settings):
  tok = tokenizers.Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(
      vocab_size=300,
      special_tokens=["<|endoftext|>", "<|pad|>"],
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
  )
  tok.train_from_iterator(
      ["Compute 7+5 then answer", "hello world"] * 10, trainer=trainer
  )
  tok.add_tokens(["<think>", "</think>"])
  tok.save(str(directory / "tokenizer.json"))
  (directory / "tokenizer_config.json").write_text(json.dumps(settings))
  return tok


def test_hf_directory_with_tokenizer_json(tmp_path):
  reference = _write_hf_json_checkpoint(
      tmp_path,
      {
          "bos_token": None,
          "eos_token": "<|endoftext|>",
          "pad_token": {"content": "<|pad|>", "lstrip": False},
      },
  )
  tok = tokenizer_lib.load_tokenizer(str(tmp_path))
  assert tok.vocab_size == reference.get_vocab_size()
  assert tok.bos_id is None
  assert (tok.eos_id, tok.pad_id) == (0, 1)
  assert (tok.think_id, tok.end_think_id) == (
      reference.token_to_id("<think>"),
      reference.token_to_id("</think>"),
  )
  text = "<think> 7+5 </think>\nAnswer: 12 ∑"
  ids = tok.encode(text)
  assert ids[0] == tok.think_id
  assert tok.decode(ids + [tok.eos_id]) == text


def test_hf_tokenizer_errors(tmp_path):
  _write_hf_json_checkpoint(tmp_path, {"bos_token": None})
  with pytest.raises(ValueError, match="no eos_token"):
    tokenizer_lib.load_tokenizer(str(tmp_path))
  (tmp_path / "tokenizer_config.json").write_text(
      json.dumps({"eos_token": "<|missing|>"})
  )
  missing = re.escape("eos_token '<|missing|>' is not in tokenizer.json")
  with pytest.raises(ValueError, match=missing):
    tokenizer_lib.load_tokenizer(str(tmp_path))
  empty = tmp_path / "empty"
  empty.mkdir()
  with pytest.raises(
      FileNotFoundError, match="neither tokenizer.model nor tokenizer.json"
  ):
    tokenizer_lib.load_tokenizer(str(empty))
  with pytest.raises(FileNotFoundError, match="no such tokenizer"):
    tokenizer_lib.load_tokenizer(str(tmp_path / "absent.model"))
  (empty / "tokenizer.model").write_bytes(b"not a model")
  with pytest.raises(ValueError, match="not a SentencePiece model"):
    tokenizer_lib.load_tokenizer(str(empty))


def test_tokenizer_path_takes_precedence(tmp_path, builtin):
  _, workdir = builtin
  small = tokenizer_lib.train_builtin_tokenizer(
      str(tmp_path / "small.model"), 300
  )
  config = _config(
      **{
          "data.tokenizer_path": str(tmp_path / "small.model"),
          "model.hf_path": str(workdir),
      }
  )
  assert (
      tokenizer_lib.get_tokenizer(config, str(workdir)).vocab_size
      == small.vocab_size
      == 300
  )


def test_stop_ids_come_from_generation_config(tmp_path):
  reference = instruct_checkpoint.write_tokenizer(tmp_path)
  im_end, end_of_text = (
      reference.token_to_id(t) for t in ("<|im_end|>", "<|endoftext|>")
  )
  tok = tokenizer_lib.load_tokenizer(str(tmp_path))
  assert (tok.eos_id, tok.pad_id, tok.bos_id) == (im_end, end_of_text, None)
  assert tok.stop_ids == (im_end, end_of_text)
  config = tmp_path / tokenizer_lib.GENERATION_CONFIG
  for value, stops in (
      (end_of_text, (im_end, end_of_text)),
      (None, (im_end,)),
      ([5, im_end, 7], (im_end, 5, 7)),
  ):
    config.write_text(json.dumps({"eos_token_id": value}))
    assert (
        tokenizer_lib.load_tokenizer(str(tmp_path / "tokenizer.json")).stop_ids
        == stops
    )
  for value, message in (
      ("2", "must be an int or a list of ints, got '2'"),
      ([1, True], "must be an int or a list of ints"),
      ([3, 10**6], r"eos_token_id \[1000000\] outside the tokenizer's"),
  ):
    config.write_text(json.dumps({"eos_token_id": value}))
    with pytest.raises(ValueError, match=message):
      tokenizer_lib.load_tokenizer(str(tmp_path))
  config.write_text("{")
  with pytest.raises(ValueError, match="generation_config.json: invalid JSON"):
    tokenizer_lib.load_tokenizer(str(tmp_path))
  config.unlink()
  assert tokenizer_lib.load_tokenizer(str(tmp_path)).stop_ids == (im_end,)


def test_decode_keeps_thinking_tags_that_a_tokenizer_marks_special(tmp_path):
  reference = _write_hf_json_checkpoint(
      tmp_path, {"eos_token": "<|endoftext|>"}
  )
  reference.add_special_tokens(["<think>", "</think>", "<|im_start|>"])
  reference.save(str(tmp_path / "tokenizer.json"))
  tok = tokenizer_lib.load_tokenizer(str(tmp_path))
  text = "<think> 7+5 </think>\nAnswer: 12"
  ids = tok.encode("<|im_start|>" + text) + [tok.eos_id, tok.pad_id]
  # What a plain decode would hand on.
  assert reference.decode(ids) == " 7+5 \nAnswer: 12"
  assert tok.decode(ids) == text


def _thinking_tokenizer(tmp_path, template):
  instruct_checkpoint.write_tokenizer(tmp_path, template)
  return tokenizer_lib.load_tokenizer(str(tmp_path))


def _score(text, answer="42"):
  record = {"id": "q", "prompt": "p", "answer": answer}
  return registry.verify(text, record, registry.resolve_spec(record, "math"))


def test_completion_text_opens_the_thinking_the_prompt_opened(tmp_path):
  # A template that opens the thinking in the prompt puts the reply inside it:
  # the verifier sees the prompt's `<think>\n` first, so a reply that never
  # closes the thinking has no answer, as when the model opens it itself.
  pytest.importorskip("math_verify")
  tok = _thinking_tokenizer(tmp_path, instruct_checkpoint.THINKING_TEMPLATE)
  user = [{"role": "user", "content": "6*7? Quote: <think> is a tag"}]
  prompt = tok.encode(tok.chat_template.render(user))
  closed = tok.encode("6*7=42\n</think>\n\n\\boxed{42}") + [tok.stop_ids[1]]
  unclosed = tok.encode("6*7 is \\boxed{42}") + [tok.eos_id]
  assert tok.open_thinking(prompt) == len(prompt) - 2
  assert (
      tok.completion_text(prompt, closed)
      == "<think>\n6*7=42\n</think>\n\n\\boxed{42}"
  )
  assert tok.completion_text(prompt, unclosed) == "<think>\n6*7 is \\boxed{42}"
  assert _score(tok.completion_text(prompt, closed)) == 1.0
  assert _score(tok.completion_text(prompt, unclosed)) == 0.0
  # The reply alone would hide the open thinking.
  assert _score(tok.decode(unclosed)) == 1.0


def test_completion_text_of_prompts_that_leave_no_thinking_open(tmp_path):
  pytest.importorskip("math_verify")
  tok = _thinking_tokenizer(tmp_path, instruct_checkpoint.QWEN3_TEMPLATE)
  # A `<think>` quoted in the user's message is not an open thinking block.
  user = [{"role": "user", "content": "What does <think> mean?"}]
  for prompt_text, reply, score in (
      (
          tok.chat_template.render(user),
          "<think>\nhm\n</think>\n\\boxed{42}",
          1.0,
      ),
      (tok.chat_template.render(user), "<think>\nhm \\boxed{42}", 0.0),
      (
          tok.chat_template.render(user, enable_thinking=False),
          "\\boxed{42}",
          1.0,
      ),
  ):
    prompt = tok.encode(prompt_text)
    assert tok.open_thinking(prompt) == -1
    text = tok.completion_text(prompt, tok.encode(reply) + [tok.eos_id])
    assert text == reply
    assert _score(text) == score
  builtin = tokenizer_lib.train_builtin_tokenizer(
      str(tmp_path / "b.model"), 512
  )
  prompt = [builtin.bos_id] + builtin.encode("Compute 1+2")
  reply = builtin.encode("<think> 1+2 = 3 </think>\nAnswer: 3")
  assert builtin.completion_text(
      prompt, reply + [builtin.eos_id]
  ) == builtin.decode(reply)


def test_sentencepiece_checkpoint_reads_special_tokens_in_rendered_text(
    tmp_path, builtin
):
  # transformers reads `<s>` printed by a template as the BOS id; so do we.
  tok, workdir = builtin
  shutil.copy(
      workdir / workdir_lib.TOKENIZER_FILE, tmp_path / "tokenizer.model"
  )
  (tmp_path / "tokenizer_config.json").write_text(
      json.dumps(
          {
              "bos_token": "<s>",
              "eos_token": {"content": "</s>"},
              "chat_template": "{{ bos_token }}[INST] {{ messages[0].content }} [/INST]",
          }
      )
  )
  loaded = tokenizer_lib.load_tokenizer(str(tmp_path))
  text = loaded.chat_template.render(
      [{"role": "user", "content": "Compute 7+5"}]
  )
  assert text == "<s>[INST] Compute 7+5 [/INST]"
  assert loaded.encode(text) == [tok.bos_id] + tok.encode(
      "[INST] Compute 7+5 [/INST]"
  )
  assert loaded.encode("a</s>b<think>") == tok.encode("a") + [
      tok.eos_id
  ] + tok.encode("b<think>")
  # The built-in model reads no such text.
  assert tok.encode("<s>") != [tok.bos_id]
