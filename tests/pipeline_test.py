"""Tests of the grain prompt pipeline: batches, epochs,
retirement, exact resume."""

import json
import re

import numpy as np
import pytest

from configs import scalerl
from scalerl_jax import workdir as workdir_lib
from scalerl_jax.data import builtin_code
from scalerl_jax.data import builtin_task
from scalerl_jax.data import mixture
from scalerl_jax.data import pipeline
from scalerl_jax.data import tokenizer as tokenizer_lib
from tests import instruct_checkpoint

_P, _G, _L = 4, 3, 16


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
  path = tmp_path_factory.mktemp("tok") / workdir_lib.TOKENIZER_FILE
  return tokenizer_lib.train_builtin_tokenizer(str(path), 512)


@pytest.fixture(scope="module")
def records():
  return builtin_task.builtin_prompts((1, 2), 37, 0, "train")


def _pipeline(records, tok, seed=0, is_retired=None, **kwargs):
  args = dict(
      prompts_per_step=_P,
      generations_per_prompt=_G,
      max_prompt_len=_L,
      on_long_prompt="error",
      seed=seed,
      is_retired=is_retired,
  )
  args.update(kwargs)
  return pipeline.PromptPipeline(records, tok, **args)


def _ids(batch):
  return [r["id"] for r in batch.records]


def test_batches_hold_padded_prompt_ids(records, tok):
  batch = next(_pipeline(records, tok))
  assert (
      batch.tokens_PxL.shape == (_P, _L) and batch.tokens_PxL.dtype == np.int32
  )
  assert batch.generations_per_prompt == _G
  for row, record in enumerate(batch.records):
    ids = [tok.bos_id] + tok.encode(record["prompt"])
    assert batch.lengths_P[row] == len(ids)
    assert batch.tokens_PxL[row].tolist() == ids + [tok.pad_id] * (
        _L - len(ids)
    )
  tokens_BxL, lengths_B = batch.expand()
  assert tokens_BxL.shape == (_P * _G, _L)
  for row in range(_P * _G):
    np.testing.assert_array_equal(tokens_BxL[row], batch.tokens_PxL[row // _G])
    assert lengths_B[row] == batch.lengths_P[row // _G]


def test_every_epoch_is_a_new_permutation_and_seeds_repeat(records, tok):
  n = len(records)
  num_batches = -(-3 * n // _P)  # Enough batches for three epochs.
  stream = [
      i
      for batch, _ in zip(_pipeline(records, tok), range(num_batches))
      for i in _ids(batch)
  ]
  epochs = [stream[e * n : (e + 1) * n] for e in range(3)]
  for epoch in epochs:
    assert sorted(epoch) == sorted(r["id"] for r in records)
  assert epochs[0] != epochs[1] != epochs[2]
  again = [
      i
      for batch, _ in zip(_pipeline(records, tok), range(n // _P))
      for i in _ids(batch)
  ]
  assert again == stream[: len(again)]
  other = [
      i
      for batch, _ in zip(_pipeline(records, tok, seed=1), range(n // _P))
      for i in _ids(batch)
  ]
  assert other != stream[: len(other)]


class _Curriculum:
  """Retires a batch's first prompt every third step;
  the set is checkpointed."""

  def __init__(self, retired=()):
    self.retired = set(retired)

  def is_retired(self, prompt_id):
    return prompt_id in self.retired

  def update(self, step, batch):
    if step % 3 == 2:
      self.retired.add(batch.records[0]["id"])


@pytest.fixture(scope="module")
def two_sources(records):
  """37 arithmetic and 23 code prompts as data.mixture tags
  them, and the weights."""
  code = builtin_code.code_prompts((1, 2), 23, 0, "train")
  return (
      mixture.tag(records, "math") + mixture.tag(code, "code"),
      {"math": 0.6, "code": 0.4},
  )


@pytest.mark.parametrize(
    "mixed", [False, True], ids=["one_source", "two_sources"]
)
def test_restoring_state_at_each_of_the_first_50_batches_gives_the_same_stream(
    records, two_sources, tok, mixed
):
  # 37 prompts in batches of 4: every 12-batch window after a restore crosses
  # an epoch boundary and sees 4 retirements. Two sources: the mixture's
  # position in both domains' streams is restored too.
  num_restores, window = 50, 12
  kwargs = {}
  if mixed:
    records, weights = two_sources
    # Code prompts are longer.
    kwargs = {"weights": weights, "max_prompt_len": 32}
  curriculum = _Curriculum()
  reference = _pipeline(
      records, tok, is_retired=curriculum.is_retired, **kwargs
  )
  checkpoints, batches = [], []
  for step in range(num_restores + window):
    # Checkpoint: iterator state and retired set, through JSON as on disk.
    checkpoints.append(
        json.dumps(
            {
                "data": reference.get_state(),
                "retired": sorted(curriculum.retired),
            }
        )
    )
    batch = next(reference)
    batches.append(batch)
    curriculum.update(step, batch)
  assert len(curriculum.retired) == (num_restores + window) // 3
  for step in range(num_restores):
    saved = json.loads(checkpoints[step])
    restored_curriculum = _Curriculum(saved["retired"])
    restored = _pipeline(
        records, tok, is_retired=restored_curriculum.is_retired, **kwargs
    )
    restored.set_state(saved["data"])
    for later in range(step, step + window):
      batch = next(restored)
      assert _ids(batch) == _ids(batches[later]), (step, later)
      np.testing.assert_array_equal(batch.tokens_PxL, batches[later].tokens_PxL)
      restored_curriculum.update(later, batch)


def test_retired_prompts_leave_the_stream_and_all_retired_ends_it(records, tok):
  retired = set()
  stream = _pipeline(records, tok, is_retired=retired.__contains__)
  first = next(stream)
  retired.update(_ids(first))
  for _ in range(30):
    assert not set(_ids(next(stream))) & retired
  retired.update(r["id"] for r in records[:-1])
  # One prompt left: it repeats.
  assert _ids(next(stream)) == [records[-1]["id"]] * _P
  retired.add(records[-1]["id"])
  with pytest.raises(StopIteration):
    next(stream)


def test_long_prompts_raise_or_are_skipped(records, tok):
  long_record = dict(records[0], id="long", prompt="Compute " + "1+" * 20 + "1")
  length = len(tok.encode(long_record["prompt"])) + 1
  with pytest.raises(
      ValueError,
      match=re.escape(
          f"prompt 'long': {length} tokens exceed sampling.max_prompt_len={_L}"
      ),
  ):
    _pipeline(records + [long_record], tok)
  skipping = _pipeline(records + [long_record], tok, on_long_prompt="skip")
  assert skipping.skipped_ids == ["long"]
  assert skipping.num_prompts == len(records)
  for _ in range(3 * len(records) // _P):
    assert "long" not in _ids(next(skipping))
  with pytest.raises(
      ValueError, match="no prompt fits sampling.max_prompt_len=2"
  ):
    _pipeline(records, tok, max_prompt_len=2, on_long_prompt="skip")


def test_state_from_another_pipeline_or_garbage_is_rejected(records, tok):
  state = _pipeline(records, tok).get_state()
  for other in (
      _pipeline(records[:-1], tok),
      _pipeline(records, tok, seed=1),
      _pipeline(records, tok, prompts_per_step=_P + 1),
  ):
    with pytest.raises(ValueError, match="saved for another prompt set"):
      other.set_state(state)
  with pytest.raises(ValueError, match="must hold 'grain' and 'fingerprint'"):
    _pipeline(records, tok).set_state({"next_index": 3})


def test_bad_record_sets_are_rejected(records, tok):
  with pytest.raises(ValueError, match="got no prompt records"):
    _pipeline([], tok)
  with pytest.raises(
      ValueError, match=re.escape(f"prompt {records[0]['id']!r}: duplicate id")
  ):
    _pipeline(records + [records[0]], tok)


def test_make_pipeline_and_eval_batches_follow_the_config(records, tok):
  config = scalerl.get_config()
  train = pipeline.make_pipeline(config, records, tok)
  batch = next(train)
  assert batch.tokens_PxL.shape == (
      config.data.prompts_per_step,
      config.sampling.max_prompt_len,
  )
  assert batch.generations_per_prompt == config.data.generations_per_prompt
  batches = pipeline.eval_batches(
      config, records, tok, batch_size=10, generations_per_prompt=2
  )
  assert [len(b.records) for b in batches] == [10, 10, 10, 7]
  assert [i for b in batches for i in _ids(b)] == [r["id"] for r in records]
  assert {b.generations_per_prompt for b in batches} == {2}


_INSTRUCTION = (
    "Please reason step by step, and put your final answer within \\boxed{}."
)


def _data_config(**data):
  config = scalerl.get_config()
  with config.unlocked():
    config.data.update(data)
    config.sampling.max_prompt_len = 128
  return config


@pytest.fixture(scope="module")
def instruct(tmp_path_factory):
  """(our tokenizer, transformers' tokenizer) of a Qwen3-style
  checkpoint directory."""
  transformers = pytest.importorskip("transformers")
  directory = tmp_path_factory.mktemp("qwen3")
  instruct_checkpoint.write_tokenizer(directory)
  return (
      tokenizer_lib.load_tokenizer(str(directory)),
      transformers.AutoTokenizer.from_pretrained(str(directory)),
  )


@pytest.mark.parametrize("system_prompt", ["", "You are a careful solver."])
@pytest.mark.parametrize("enable_thinking", [True, False])
def test_prompt_ids_equal_transformers_apply_chat_template(
    instruct, system_prompt, enable_thinking
):
  tok, reference = instruct
  config = _data_config(
      system_prompt=system_prompt,
      answer_instruction=_INSTRUCTION,
      enable_thinking=enable_thinking,
  )
  records = [
      {"id": str(i), "prompt": p}
      for i, p in enumerate(
          [
              "Tom has 6 bags of 7 apples. How many apples does he have?",
              "Résumé ∑ 中文 <think>",
          ]
      )
  ]
  batch = next(pipeline.make_pipeline(config, records, tok))
  for row, record in enumerate(batch.records):
    messages = (
        [{"role": "system", "content": system_prompt}] if system_prompt else []
    )
    messages.append(
        {"role": "user", "content": f"{record['prompt']}\n{_INSTRUCTION}"}
    )
    expected = reference.apply_chat_template(
        messages,
        tokenize=True,
        add_generation_prompt=True,
        enable_thinking=enable_thinking,
    )["input_ids"]
    assert batch.tokens_PxL[row, : batch.lengths_P[row]].tolist() == expected


def test_prompt_format_follows_the_config(instruct, tok):
  qwen, _ = instruct
  prompt = "Compute 7+5"
  auto = pipeline.PromptFormat.from_config(_data_config(), qwen)
  assert auto.template is qwen.chat_template  # 'auto' with a template renders.
  off = pipeline.PromptFormat.from_config(
      _data_config(chat_template="off", answer_instruction="Say it."), qwen
  )
  # Qwen has no BOS.
  assert off.ids(qwen, prompt) == qwen.encode("Compute 7+5\nSay it.")
  # 'auto', no template.
  builtin = pipeline.PromptFormat.from_config(_data_config(), tok)
  assert builtin == pipeline.RAW
  assert (
      builtin.ids(tok, prompt)
      == pipeline.prompt_ids(tok, prompt)
      == ([tok.bos_id] + tok.encode(prompt))
  )
  with pytest.raises(
      ValueError,
      match=r"data\.chat_template: 'on', but the tokenizer .* ships "
      "no chat template",
  ):
    pipeline.PromptFormat.from_config(_data_config(chat_template="on"), tok)
  with pytest.raises(
      ValueError, match=r"data\.system_prompt: needs a chat template"
  ):
    pipeline.PromptFormat.from_config(
        _data_config(chat_template="off", system_prompt="S"), qwen
    )
  with pytest.raises(
      ValueError, match=r"data\.chat_template: 'yes' is not one of"
  ):
    pipeline.PromptFormat.from_config(_data_config(chat_template="yes"), qwen)
  # Templated prompts count against the budget as the model reads them.
  long = auto.ids(qwen, prompt)
  assert len(long) > len(qwen.encode(prompt)) + 5
  with pytest.raises(
      ValueError, match=f"{len(long)} tokens exceed sampling.max_prompt_len"
  ):
    pipeline.tokenize_prompts(
        [{"id": "a", "prompt": prompt}], qwen, len(long) - 1, "error", auto
    )
