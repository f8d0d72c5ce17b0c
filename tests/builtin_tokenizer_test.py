"""Tests of the built-in task's SentencePiece model:
its corpus and its written file."""

import sentencepiece as spm

from scalerl_jax.data import builtin_task
from scalerl_jax.data import builtin_tokenizer


def test_corpus_is_fixed_and_holds_the_thinking_tags():
  lines = builtin_tokenizer.corpus()
  assert lines == builtin_tokenizer.corpus()
  assert len(lines) == 2 * 2000  # A prompt and a worked target per problem.
  assert any(builtin_task.THINK_CLOSE in line for line in lines)


def test_the_model_is_written_by_a_rename_and_leaves_no_temporary_file(
    tmp_path,
):
  path = tmp_path / "sub" / "tokenizer.model"
  model = builtin_tokenizer.write_model(str(path), 320)
  assert path.read_bytes() == model
  assert [p.name for p in path.parent.iterdir()] == ["tokenizer.model"]
  sp = spm.SentencePieceProcessor(model_proto=model)
  assert (sp.pad_id(), sp.unk_id(), sp.bos_id(), sp.eos_id()) == (0, 1, 2, 3)
