"""End to end: RL on GSM8K-format rows from a Qwen3 instruct
checkpoint as users have it.

The checkpoint is written offline here: config.json and model.safetensors by
transformers' `save_pretrained`, a real BPE tokenizer.json, a chat template
that opens the thinking in the prompt (as thinking-only Qwen3 and DeepSeek-R1
do) and generation_config.json with two stop ids.

Its weights are set so that what it writes is known. The attention and MLP
outputs are zero, so each logit row depends only on the current token (a
bigram model): after the prompt's final newline it writes either
`</think>\\boxed{42}` or `\\boxed{42}`, with equal odds, then `<|endoftext|>`,
which only generation_config.json names as a stop; past it, the chain would
loop back to the start until the length budget. Against the answer 42:

  * `<think>\\n</think>\\boxed{42}` (the prompt opened the thinking, the reply
    closed it) scores 1;
  * `<think>\\n\\boxed{42}` never closes the thinking and scores 0. Scored on
    the reply alone, it would score 1 and every group would have zero variance.

So validation reads about 0.5, groups carry an advantage signal, and no
completion is truncated, only if the template, the completion text and the
stop ids all work.
"""

import json

import numpy as np
import pytest

from configs import scalerl
from scalerl_jax import trainer
from scalerl_jax.data import tokenizer as tokenizer_lib
from tests import instruct_checkpoint

# Minutes on 2 cores: README's test command leaves it out, CI runs it.
pytestmark = pytest.mark.slow(seconds=20)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("math_verify")

_DIM = 64
# lm_head weight; the normalised one-hot input has norm sqrt(_DIM).
_LOGIT = 20.0
_QUESTIONS = [
    "Tom has 6 bags of 7 apples. How many apples does he have?",
    "A box holds 21 pens and another box twice as many. How many pens are there?",
    "Natalia sold 48 clips in April and half as many in May, minus 30. How many?",
    "What is 84 divided by 2?",
    "What is 40 plus 2?",
    "What is 6 times 7?",
]


def _chain(tok):
  """(token -> successors) of the bigram model, as ids."""
  ids = {t: tok.token_to_id(t) for t in ("Ċ", "</think>", "<|endoftext|>")}
  boxed = [tok.token_to_id(c) for c in "\\boxed{42}"]
  # Each a distinct token.
  assert None not in boxed and len(set(boxed)) == len(boxed)
  chain = {ids["Ċ"]: [ids["</think>"], boxed[0]], ids["</think>"]: [boxed[0]]}
  chain.update({a: [b] for a, b in zip(boxed, boxed[1:])})
  chain[boxed[-1]] = [ids["<|endoftext|>"]]
  # Reached only if generation does not stop.
  chain[ids["<|endoftext|>"]] = [ids["Ċ"]]
  return chain


def _write_checkpoint(directory):
  tok = instruct_checkpoint.write_tokenizer(
      directory, instruct_checkpoint.THINKING_TEMPLATE
  )
  vocab = tok.get_vocab_size()
  config = transformers.Qwen3Config(
      vocab_size=vocab,
      hidden_size=_DIM,
      intermediate_size=2 * _DIM,
      num_hidden_layers=1,
      num_attention_heads=2,
      num_key_value_heads=1,
      head_dim=32,
      max_position_embeddings=160,
      tie_word_embeddings=False,
      rms_norm_eps=1e-6,
  )
  model = transformers.Qwen3ForCausalLM(config)
  chain = _chain(tok)
  slot = {token: k for k, token in enumerate(chain)}
  embed, head = torch.zeros(vocab, _DIM), torch.zeros(vocab, _DIM)
  for token, successors in chain.items():
    embed[token, slot[token]] = 1.0
    for successor in successors:
      head[successor, slot[token]] = _LOGIT
  with torch.no_grad():
    model.model.embed_tokens.weight.copy_(embed)
    model.lm_head.weight.copy_(head)
    for layer in model.model.layers:
      layer.self_attn.o_proj.weight.zero_()
      layer.mlp.down_proj.weight.zero_()
  generation_config = (directory / "generation_config.json").read_text()
  model.save_pretrained(str(directory))
  # save_pretrained writes its own; the checkpoint ships Qwen3's two stops.
  (directory / "generation_config.json").write_text(generation_config)
  return tok


def _write_gsm8k(path, questions):
  rows = [
      {"question": q, "answer": "Work it out: <<6*7=42>>42.\n#### 42"}
      for q in questions
  ]
  path.write_text("".join(json.dumps(row) + "\n" for row in rows))
  return str(path)


def _config(checkpoint, tmp_path):
  config = scalerl.get_config("variant=tiny_cpu")
  d, s, t = config.data, config.sampling, config.trainer
  config.model.hf_path = str(checkpoint)
  d.source, d.jsonl_prompt_field, d.answer_delimiter = (
      "jsonl",
      "question",
      "####",
  )
  d.jsonl_train = _write_gsm8k(tmp_path / "train.jsonl", _QUESTIONS[:4])
  d.jsonl_val = _write_gsm8k(tmp_path / "val.jsonl", _QUESTIONS[4:])
  d.system_prompt = "You are a careful solver."
  d.answer_instruction = (
      "Please reason step by step, and put your final answer within \\boxed{}."
  )
  d.prompts_per_step, d.generations_per_prompt = 2, 8
  s.max_prompt_len, s.max_new_tokens, s.decode_steps_per_call = 128, 24, 8
  t.num_steps, t.eval_every, t.eval_num_prompts, t.eval_samples = 2, 2, 2, 16
  t.checkpoint_every = 2
  config.rewards.num_workers = 1
  return config


def test_two_rl_steps_on_gsm8k_rows_from_a_qwen3_instruct_checkpoint(tmp_path):
  checkpoint = tmp_path / "Qwen3-tiny-Thinking"
  reference = _write_checkpoint(checkpoint)
  config = _config(checkpoint, tmp_path)
  tok = tokenizer_lib.get_tokenizer(config, str(tmp_path / "unused"))
  assert tok.stop_ids == (
      reference.token_to_id("<|im_end|>"),
      reference.token_to_id("<|endoftext|>"),
  )

  last = trainer.train_and_evaluate(config, str(tmp_path / "run"))

  # From config.json.
  assert config.model.family == "qwen3" and not config.model.tie_embeddings
  metrics = (tmp_path / "run" / "metrics.jsonl").read_text()
  rows = [json.loads(line) for line in metrics.splitlines()]
  assert [r["step"] for r in rows] == [0, 1, 2]
  for row in (rows[0], rows[2]):
    # 32 samples split between a closed (1) and an unclosed (0) thinking.
    assert 0.2 < row["val/mean_at_k"] < 0.8, row["val/mean_at_k"]
    assert row["val/truncation_rate"] == 0.0  # <|endoftext|> stops.
  for row in rows[1:]:
    assert row["train/truncation_rate"] == 0.0
    assert row["train/l2_grads"] > 0  # Rewards vary within groups.
    assert np.isfinite(row["train/loss"])
  assert last["val/mean_at_k"] == rows[2]["val/mean_at_k"]
