"""The prompt stream: prompt records to batches of P prompts, with grain.

Prompts are tokenized once, up front. The stream is a seeded shuffle per
epoch, repeated forever; retired prompts are dropped as each batch is formed;
every process yields the same global batch. `get_state()`, saved with the
curriculum's retired set, resumes exactly the remaining stream.

Shape letters: the package key (scalerl_jax/__init__.py).
Design: docs/design/data.md.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any, Callable, Mapping, Optional, Sequence

from absl import logging
import grain
import ml_collections
import numpy as np

from scalerl_jax.data import chat_template as chat_template_lib
from scalerl_jax.data import mixture
from scalerl_jax.data import tokenizer as tokenizer_lib

Record = Mapping[str, str]
# What a prompt over sampling.max_prompt_len does: stop the run, or be left
# out (`tokenize_prompts`); the values `data.on_long_prompt` allows.
ON_LONG_PROMPT = ("error", "skip")
_MAX_LOGGED_IDS = 10


@dataclasses.dataclass(frozen=True)
class PromptFormat:
  """How a prompt's text becomes the token ids the model reads.

  With a template: one user message, rendered with the generation prompt
  (the template prints any BOS). Without one: BOS (if any), then the text.
  """

  template: Optional[chat_template_lib.ChatTemplate] = None
  system_prompt: str = ""  # data.system_prompt
  # data.answer_instruction, on a new line after the prompt.
  answer_instruction: str = ""
  enable_thinking: bool = True  # data.enable_thinking, passed to the template.

  @classmethod
  def from_config(
      cls, config: ml_collections.ConfigDict, tokenizer: tokenizer_lib.Tokenizer
  ) -> PromptFormat:
    """The format of `config.data` for `tokenizer`.

    Raises:
      ValueError: bad data.chat_template, or a system prompt but no template.
    """
    d = config.data
    if d.chat_template not in chat_template_lib.MODES:
      raise ValueError(
          f"data.chat_template: {d.chat_template!r} is not one of "
          f"{chat_template_lib.MODES}"
      )
    template = None if d.chat_template == "off" else tokenizer.chat_template
    if template is None and d.chat_template == "on":
      raise ValueError(
          f"data.chat_template: 'on', but the tokenizer {tokenizer.path} ships no "
          "chat template (chat_template.jinja or tokenizer_config.json)"
      )
    if template is None and d.system_prompt:
      raise ValueError(
          f"data.system_prompt: needs a chat template, and none is used "
          f"(data.chat_template={d.chat_template!r}, tokenizer {tokenizer.path})"
      )
    return cls(
        template, d.system_prompt, d.answer_instruction, d.enable_thinking
    )

  def user_text(self, prompt: str) -> str:
    """The prompt with the answer instruction, if any, on a line of its own."""
    return (
        f"{prompt}\n{self.answer_instruction}"
        if self.answer_instruction
        else prompt
    )

  def messages(self, prompt: str) -> list[dict[str, str]]:
    """The conversation a chat template renders for `prompt`."""
    system = (
        [{"role": "system", "content": self.system_prompt}]
        if self.system_prompt
        else []
    )
    return system + [{"role": "user", "content": self.user_text(prompt)}]

  def text(self, prompt: str) -> str:
    """The text the model reads, before any BOS."""
    if self.template is None:
      return self.user_text(prompt)
    return self.template.render(
        self.messages(prompt),
        add_generation_prompt=True,
        enable_thinking=self.enable_thinking,
    )

  def ids(self, tokenizer: tokenizer_lib.Tokenizer, prompt: str) -> list[int]:
    """Token ids the model reads for `prompt`."""
    ids = tokenizer.encode(self.text(prompt))
    if self.template is not None or tokenizer.bos_id is None:
      return ids
    return [tokenizer.bos_id] + ids


# The prompt text after BOS, as the built-in task is trained.
RAW = PromptFormat()


def prompt_ids(
    tokenizer: tokenizer_lib.Tokenizer,
    prompt: str,
    prompt_format: PromptFormat = RAW,
) -> list[int]:
  """Token ids the model reads for a prompt (default: BOS, if any, + text)."""
  return prompt_format.ids(tokenizer, prompt)


@dataclasses.dataclass(frozen=True)
class PromptBatch:
  """P prompts, right-padded to L = max_prompt_len, each sampled G times."""

  tokens_PxL: np.ndarray  # int32 [P, L]: prompt ids, then pad_id.
  lengths_P: np.ndarray  # int32 [P]: number of prompt ids in each row.
  records: tuple[Record, ...]  # [P] the prompt records, in row order.
  generations_per_prompt: int  # G

  def expand(self) -> tuple[np.ndarray, np.ndarray]:
    """(tokens_BxL, lengths_B), B = P*G: rows i*G .. i*G+G-1 are prompt i."""
    g = self.generations_per_prompt
    return np.repeat(self.tokens_PxL, g, axis=0), np.repeat(self.lengths_P, g)


def tokenize_prompts(
    records: Sequence[Record],
    tokenizer: tokenizer_lib.Tokenizer,
    max_prompt_len: int,
    on_long_prompt: str,
    prompt_format: PromptFormat = RAW,
) -> tuple[list[tuple[Record, np.ndarray]], list[str]]:
  """([(record, int32 ids)] within budget (BOS counted), skipped ids).

  Raises:
    ValueError: a prompt over budget under 'error', or an unknown mode.
  """
  if on_long_prompt not in ON_LONG_PROMPT:
    raise ValueError(
        f"data.on_long_prompt: {on_long_prompt!r} is not one of {ON_LONG_PROMPT}"
    )
  kept, skipped = [], []
  for record in records:
    ids = prompt_format.ids(tokenizer, record["prompt"])
    if len(ids) <= max_prompt_len:
      kept.append((record, np.asarray(ids, np.int32)))
    elif on_long_prompt == "skip":
      skipped.append(record["id"])
    else:
      raise ValueError(
          f"prompt {record['id']!r}: {len(ids)} tokens exceed sampling.max_prompt_len="
          f"{max_prompt_len} (set data.on_long_prompt='skip' to leave such prompts out)"
      )
  return kept, skipped


def make_batch(
    examples: Sequence[tuple[Record, np.ndarray]],
    max_prompt_len: int,
    pad_id: int,
    generations_per_prompt: int,
) -> PromptBatch:
  """Pads tokenized prompts into a PromptBatch."""
  tokens = np.full((len(examples), max_prompt_len), pad_id, np.int32)
  lengths = np.zeros((len(examples),), np.int32)
  for row, (_, ids) in enumerate(examples):
    tokens[row, : len(ids)] = ids
    lengths[row] = len(ids)
  return PromptBatch(
      tokens,
      lengths,
      tuple(record for record, _ in examples),
      generations_per_prompt,
  )


class PromptPipeline:
  """Infinite, checkpointable iterator of PromptBatches, until all retire."""

  def __init__(
      self,
      records: Sequence[Record],
      tokenizer: tokenizer_lib.Tokenizer,
      *,
      prompts_per_step: int,
      generations_per_prompt: int,
      max_prompt_len: int,
      on_long_prompt: str,
      seed: int,
      is_retired: Optional[Callable[[str], bool]] = None,
      prompt_format: PromptFormat = RAW,
      weights: Optional[Mapping[str, float]] = None,
  ):
    """Tokenizes the prompts and builds the grain stream.

    `is_retired(id)` is asked as each batch is formed; `weights` (domain ->
    weight; records carry `domain`) makes the stream a mixture. ValueError:
    no records, duplicate ids, no prompt in budget, an empty domain.
    """
    if not records:
      raise ValueError("the prompt pipeline got no prompt records")
    seen = set()
    for record in records:
      if record["id"] in seen:
        raise ValueError(
            f"prompt {record['id']!r}: duplicate id in the prompt records"
        )
      seen.add(record["id"])
    examples, self.skipped_ids = tokenize_prompts(
        records, tokenizer, max_prompt_len, on_long_prompt, prompt_format
    )
    if self.skipped_ids:
      logging.warning(
          "skipped %d of %d prompts longer than sampling.max_prompt_len=%d, e.g. %s",
          len(self.skipped_ids),
          len(records),
          max_prompt_len,
          self.skipped_ids[:_MAX_LOGGED_IDS],
      )
    if not examples:
      raise ValueError(
          f"no prompt fits sampling.max_prompt_len={max_prompt_len}"
      )
    self.num_prompts = len(examples)
    self.prompts_per_step = prompts_per_step
    self.generations_per_prompt = generations_per_prompt
    self._max_prompt_len = max_prompt_len
    self._pad_id = tokenizer.pad_id
    self._is_retired = is_retired or (lambda _: False)
    fingerprint = hashlib.sha256()
    for record, ids in examples:
      fingerprint.update(
          record["id"].encode("utf-8", "surrogatepass") + b"\0" + ids.tobytes()
      )
    fingerprint.update(f"{seed}/{prompts_per_step}".encode())
    if weights:
      fingerprint.update(repr(sorted(weights.items())).encode())
      dataset = _mixed(examples, weights, seed)
    else:
      dataset = (
          grain.MapDataset.source(examples).shuffle(seed=seed % 2**32).repeat()
      )
    self._fingerprint = fingerprint.hexdigest()[:16]
    # No reader threads: elements are in memory, and the retired filter must
    # run when a batch is formed, not ahead of it.
    self._iterator = dataset.to_iter_dataset(
        grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)
    ).__iter__()

  def __iter__(self) -> PromptPipeline:
    return self

  def __next__(self) -> PromptBatch:
    examples, retired_in_a_row = [], 0
    while len(examples) < self.prompts_per_step:
      # Two epochs' worth of retired prompts in a row cover a whole epoch:
      # every prompt is retired.
      if retired_in_a_row >= 2 * self.num_prompts:
        logging.warning(
            "all %d prompts are retired; the prompt stream ends",
            self.num_prompts,
        )
        raise StopIteration
      example = next(self._iterator)
      if self._is_retired(example[0]["id"]):
        retired_in_a_row += 1
      else:
        retired_in_a_row = 0
        examples.append(example)
    return make_batch(
        examples,
        self._max_prompt_len,
        self._pad_id,
        self.generations_per_prompt,
    )

  def get_state(self) -> dict[str, Any]:
    """JSON-serialisable position; save it with the curriculum's retired set."""
    return {
        "grain": self._iterator.get_state(),
        "fingerprint": self._fingerprint,
    }

  def set_state(self, state: Mapping[str, Any]) -> None:
    """Restores a `get_state` position; ValueError if malformed or foreign."""
    if not isinstance(state, Mapping) or set(state) != {"grain", "fingerprint"}:
      raise ValueError(
          f"data iterator state must hold 'grain' and 'fingerprint', got {state!r}"
      )
    if state["fingerprint"] != self._fingerprint:
      raise ValueError(
          f"data iterator state was saved for another prompt set, seed or data.prompts_per_step "
          f"(fingerprint {state['fingerprint']!r}, this pipeline {self._fingerprint!r})"
      )
    self._iterator.set_state(dict(state["grain"]))


def _mixed(
    examples: Sequence[tuple[Record, np.ndarray]],
    weights: Mapping[str, float],
    seed: int,
) -> grain.MapDataset:
  """One shuffled, repeated stream per domain, mixed with `weights`."""
  streams = []
  for i, name in enumerate(weights):
    own = [e for e in examples if e[0].get("domain") == name]
    if not own:
      raise ValueError(
          f"data.mixture.{name}: no prompt of this domain fits the pipeline"
      )
    streams.append(
        grain.MapDataset.source(own).shuffle(seed=(seed + i) % 2**32).repeat()
    )
  return grain.MapDataset.mix(streams, [weights[name] for name in weights])


def make_pipeline(
    config: ml_collections.ConfigDict,
    records: Sequence[Record],
    tokenizer: tokenizer_lib.Tokenizer,
    is_retired: Optional[Callable[[str], bool]] = None,
) -> PromptPipeline:
  """The training PromptPipeline of an experiment config."""
  return PromptPipeline(
      records,
      tokenizer,
      prompts_per_step=config.data.prompts_per_step,
      generations_per_prompt=config.data.generations_per_prompt,
      max_prompt_len=config.sampling.max_prompt_len,
      on_long_prompt=config.data.on_long_prompt,
      seed=config.seed,
      is_retired=is_retired,
      prompt_format=PromptFormat.from_config(config, tokenizer),
      weights=mixture.weights(config) or None,
  )


def eval_batches(
    config: ml_collections.ConfigDict,
    records: Sequence[Record],
    tokenizer: tokenizer_lib.Tokenizer,
    batch_size: int,
    generations_per_prompt: int,
) -> list[PromptBatch]:
  """Validation prompts in order, in batches of `batch_size` (last smaller).

  Raises:
    ValueError: no prompt fits the budget, or as `tokenize_prompts`.
  """
  examples, skipped = tokenize_prompts(
      records,
      tokenizer,
      config.sampling.max_prompt_len,
      config.data.on_long_prompt,
      PromptFormat.from_config(config, tokenizer),
  )
  if skipped:
    logging.warning(
        "skipped %d validation prompts longer than sampling.max_prompt_len=%d",
        len(skipped),
        config.sampling.max_prompt_len,
    )
  if not examples:
    raise ValueError(
        f"no validation prompt fits sampling.max_prompt_len={config.sampling.max_prompt_len}"
    )
  return [
      make_batch(
          examples[i : i + batch_size],
          config.sampling.max_prompt_len,
          tokenizer.pad_id,
          generations_per_prompt,
      )
      for i in range(0, len(examples), batch_size)
  ]
