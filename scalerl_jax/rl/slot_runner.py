"""The slot runner: prompts -> sampler slots -> verifiers -> scored groups.

`SlotRunner` fills the sampler's slots with whole groups (G slots a prompt),
numbered in start order, and scores each group once its G completions are
in. Its steps are the caller's to order (`rl/generation.Generation.run`):
`fill` starts prompts, `dispatch` sends a decode call, `harvest` takes the
groups it finished and submits them for scoring, `collect` waits for their
scores; a call dispatched between `harvest` and `collect` decodes while the
verifiers score. Every token keeps the version that chose it, the work of
every prefill and decoded token is counted (`work`), and the whole state is
checkpointed. Design: docs/design/rl.md.

Shape letters: the package key (scalerl_jax/__init__.py).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import time
from typing import Any, Iterator, Optional

import jax
import numpy as np

from scalerl_jax.data import pipeline as pipeline_lib
from scalerl_jax.data import tokenizer as tokenizer_lib
from scalerl_jax.metrics import busy
from scalerl_jax.metrics import compute
from scalerl_jax.rl.buffer import Group
from scalerl_jax.sampling import completions as completions_lib
from scalerl_jax.sampling.completions import Completions
from scalerl_jax.sampling.interruptions import InterruptionState
from scalerl_jax.sampling.sampler import Sampler
from scalerl_jax.sampling.slots import SlotState

# Metadata ints per slot: the start index of the slot's group.
META_WIDTH = 1
# Slot fields under the names checkpoints store them by: those they had when
# the format was fixed, before `SlotState` took the completion record's names.
# Checkpoints from before and after the rename are the same.
_STORED_NAMES = {
    "gen_logp": "logp",
    "seq_len": "length",
    "thinking_budget": "budget",
}
_VERIFY_COUNTS = (
    "num_completions",
    "num_timeouts",
    "num_errors",
    "num_crashes",
    "num_invalid",
)


@dataclasses.dataclass
class _Call:
  """A decode call dispatched, not harvested; where the slots stood before."""

  version: int
  num_steps: int
  prompt_len_N: np.ndarray
  before_N: np.ndarray  # Prompt + completion tokens of every slot.
  running_N: np.ndarray  # Whether the slot held a sequence still decoding.
  # `Sampler.progress_arrays` of the slots after the call, dispatched with it.
  after: tuple[Any, ...]


def completion_texts(
    tokens_FxS: np.ndarray,
    prompt_len_F: np.ndarray,
    seq_len_F: np.ndarray,
    tok: tokenizer_lib.Tokenizer,
) -> list[str]:
  """The text verifiers score of every row (`Tokenizer.completion_text`)."""
  return [
      tok.completion_text(
          tokens_FxS[i, : int(p)], tokens_FxS[i, int(p) : int(n)]
      )
      for i, (p, n) in enumerate(zip(prompt_len_F, seq_len_F))
  ]


def to_rewards(
    scores: np.ndarray, correct: float, incorrect: float
) -> np.ndarray:
  """Verifier scores in [0, 1] -> rewards in [incorrect, correct]."""
  return (
      incorrect + np.asarray(scores, np.float32) * (correct - incorrect)
  ).astype(np.float32)


def _stored(node: Any, names: dict[str, str]) -> dict[str, Any]:
  """A dataclass's fields as a dict, each under `names`' entry or its own."""
  return {
      names.get(f.name, f.name): getattr(node, f.name)
      for f in dataclasses.fields(node)
  }


def stored_slots(slots: SlotState) -> dict[str, Any]:
  """The slot state as checkpoints store it (`_STORED_NAMES`)."""
  return _stored(slots, _STORED_NAMES) | {
      "interruption": _stored(slots.interruption, _STORED_NAMES)
  }


def slots_from_stored(tree: dict[str, Any]) -> SlotState:
  """Inverse of `stored_slots`."""
  names = {stored: name for name, stored in _STORED_NAMES.items()}
  renamed = lambda d: {names.get(k, k): v for k, v in d.items()}
  return SlotState(
      **renamed(tree)
      | {"interruption": InterruptionState(**renamed(tree["interruption"]))}
  )


def _unscored_group(key: int, record: dict, rows: Completions) -> Group:
  """The group of its G completions `rows`; scores, rewards NaN until in."""
  unscored_G = np.full(rows.tokens.shape[0], np.nan, np.float32)
  return Group(
      record=record,
      index=key,
      completions=rows,
      scores_G=unscored_G,
      rewards_G=unscored_G.copy(),
  )


class SlotRunner:
  """Generates scored groups on the sampler's slots.

  `pool.submit(texts, records)` returns a handle whose `result()` is
  `(scores, stats)` (`RewardPool`, `SharedRewardPool`); `prompts` yields
  `PromptBatch`es; `num_slots` is a multiple of G (`generations`);
  `reward_range` is (reward of a failure, reward of a success); each
  prefill's key is fold_in(rng, counter). `clock`, if given, is told when
  each prefill and decode call is dispatched and ready (the generator's
  busy time), and how long each harvest's take was waited for.
  """

  def __init__(
      self,
      sampler: Sampler,
      pool: Any,
      tok: tokenizer_lib.Tokenizer,
      prompts: Iterator[pipeline_lib.PromptBatch],
      num_slots: int,
      generations: int,
      reward_range: tuple[float, float],
      rng: jax.Array,
      clock: Optional[busy.BusyClock] = None,
  ):
    if num_slots % generations:
      raise ValueError(
          f"sampling.num_slots: {num_slots} is not a multiple of "
          f"data.generations_per_prompt={generations}"
      )
    self.sampler, self.pool, self.tok, self.prompts = (
        sampler,
        pool,
        tok,
        prompts,
    )
    self.generations = generations
    self.reward_range = reward_range
    self._rng = rng
    self.clock = clock
    self.slots = sampler.init_state(num_slots, meta_width=META_WIDTH)
    # (record, ids) not yet started
    self._queue: collections.deque = collections.deque()
    # group key -> record, for groups in flight
    self._records: dict[int, dict] = {}
    self._partial: dict[int, list[Completions]] = collections.defaultdict(list)
    self._next_key = 0
    self._starts = 0
    # Dispatched, not yet harvested.
    self._call: Optional[_Call] = None
    self.verify_stats: collections.Counter = collections.Counter()
    # Counted as it happens, over the run: prompt_tokens prefilled,
    # tokens_generated (decoded, injected ones included) and the flops of both.
    self.work: collections.Counter = collections.Counter()

  @property
  def in_flight(self) -> int:
    """Groups started and not yet harvested whole."""
    return len(self._records)

  def _next_prompt(self) -> tuple[dict, np.ndarray]:
    if not self._queue:
      batch = next(self.prompts)  # StopIteration: every prompt is retired.
      for record, ids, n in zip(
          batch.records, batch.tokens_PxL, batch.lengths_P
      ):
        self._queue.append((dict(record), np.asarray(ids[:n], np.int32)))
    return self._queue.popleft()

  def fill(
      self, params: Any, max_groups: int, pull: bool = True
  ) -> Optional[int]:
    """Starts up to `max_groups` prompts, G free slots each; the count started.

    With `pull` False it may not read the prompt pipeline (whose filter reads
    the curriculum): if the queued prompts are too few it starts nothing and
    returns None.
    """
    if max_groups <= 0:
      return 0
    free = self.sampler.free_slots(self.slots)
    n = min(len(free) // self.generations, max_groups)
    if n == 0:
      return 0
    if not pull and n > len(self._queue):
      return None
    started = [self._next_prompt() for _ in range(n)]
    width = max(len(ids) for _, ids in started)
    tokens = np.full((n * self.generations, width), self.tok.pad_id, np.int32)
    lens = np.zeros((n * self.generations,), np.int32)
    keys = np.zeros((n * self.generations,), np.int32)
    for j, (record, ids) in enumerate(started):
      rows = slice(j * self.generations, (j + 1) * self.generations)
      tokens[rows, : len(ids)] = ids
      lens[rows] = len(ids)
      keys[rows] = self._next_key
      self._records[self._next_key] = record
      self._next_key += 1
    rng = jax.random.fold_in(self._rng, self._starts)
    self._starts += 1
    t0 = time.perf_counter()
    self.slots = self.sampler.start(
        self.slots,
        params,
        free[: n * self.generations],
        tokens,
        lens,
        rng,
        keys,
    )
    if self.clock is not None:
      self.clock.watch(self.sampler.progress_arrays(self.slots), t0)
    self.work["prompt_tokens"] += int(lens.sum())
    self.work["flops"] += compute.prefill_flops(self.sampler.model_cfg, lens)
    return n

  def dispatch(self, params: Any, version: int, num_steps: int) -> None:
    """Sends a decode call of `num_steps` with `params` (tagged `version`).

    JAX runs it asynchronously: the host goes on until `harvest` reads it.

    Raises:
      RuntimeError: the call dispatched before is not harvested yet.
    """
    if self._call is not None:
      raise RuntimeError(
          f"dispatch: a call of {self._call.num_steps} steps at version "
          f"{self._call.version} is not harvested yet"
      )
    prompt_len_N, before_N, running_N = self.sampler.progress(self.slots)
    t0 = time.perf_counter()
    self.slots = self.sampler.advance(self.slots, params, version, num_steps)
    # Dispatched now, read at harvest: ready when the call is.
    after = self.sampler.progress_arrays(self.slots)
    if self.clock is not None:
      self.clock.watch(after, t0)
    self._call = _Call(
        version, num_steps, prompt_len_N, before_N, running_N, after
    )

  def harvest(self) -> tuple[list[Group], Any]:
    """Waits for the dispatched call; the groups it completed, being scored.

    Returns:
      The groups completed, in harvest order, with scores and rewards NaN
      until `collect`; and the pool's handle of their scoring (None if none).

    Raises:
      RuntimeError: no call is dispatched.
    """
    if self._call is None:
      raise RuntimeError("harvest: no decode call is dispatched")
    call, self._call = self._call, None
    after_N = np.asarray(call.after[1])
    running_N = call.running_N
    self.work["tokens_generated"] += int(
        (after_N - call.before_N)[running_N].sum()
    )
    self.work["flops"] += compute.decode_flops(
        self.sampler.model_cfg,
        call.prompt_len_N[running_N],
        call.before_N[running_N],
        after_N[running_N],
    )
    t0 = time.perf_counter()
    self.slots, done = self.sampler.harvest(self.slots)
    if self.clock is not None:
      self.clock.span(t0, time.perf_counter())
    finished = []
    for i in range(done.tokens.shape[0]):
      key = int(done.meta[i, 0])
      self._partial[key].append(jax.tree.map(lambda x, i=i: x[i], done))
      if len(self._partial[key]) == self.generations:
        finished.append(key)
    return self._submit(finished)

  def _submit(self, keys: list[int]) -> tuple[list[Group], Any]:
    """(groups `keys` unscored, the pool's handle of their scoring or None)."""
    if not keys:
      return [], None
    stacked = [completions_lib.stack(self._partial.pop(k)) for k in keys]
    records = [self._records.pop(k) for k in keys]
    texts, row_records = [], []
    for group, record in zip(stacked, records):
      texts += completion_texts(
          group.tokens, group.prompt_len, group.seq_len, self.tok
      )
      row_records += [record] * self.generations
    scoring = self.pool.submit(texts, row_records)
    return [
        _unscored_group(*args) for args in zip(keys, records, stacked)
    ], scoring

  def collect(self, groups: list[Group], scoring: Any) -> None:
    """Waits for the scores of `harvest`'s groups and puts them in."""
    if not groups:
      return
    scores, stats = scoring.result()
    # Per-call counts only: the pool's num_worker_restarts is a running total.
    self.verify_stats.update({k: stats[k] for k in _VERIFY_COUNTS})
    scores = np.asarray(scores, np.float32).reshape(
        len(groups), self.generations
    )
    for group, scores_G in zip(groups, scores):
      group.scores_G = scores_G
      group.rewards_G = to_rewards(
          scores_G, self.reward_range[1], self.reward_range[0]
      )

  # Checkpointing: slot arrays go with the device state, the rest is host data.

  def state(self) -> tuple[Any, dict[str, np.ndarray], dict[str, Any]]:
    """(slot state as stored, host arrays, JSON metadata) for the checkpoint.

    Raises:
      RuntimeError: a dispatched decode call is not harvested.
    """
    if self._call is not None:
      raise RuntimeError(
          "SlotRunner.state: a dispatched decode call is still in flight; "
          "checkpoint after `harvest`"
      )
    arrays = {}
    partial_meta = {}
    for key, rows in self._partial.items():
      partial_meta[str(key)] = len(rows)
      for j, row in enumerate(rows):
        arrays.update(completions_lib.to_arrays(row, f"partial/{key}/{j}/"))
    for j, (_, ids) in enumerate(self._queue):
      arrays[f"queue/{j}"] = ids
    meta = {
        "queue_records": [json.dumps(r) for r, _ in self._queue],
        "records": {str(k): json.dumps(r) for k, r in self._records.items()},
        "partial": partial_meta,
        "next_key": self._next_key,
        "starts": self._starts,
        "verify_stats": dict(self.verify_stats),
        "work": dict(self.work),
    }
    return stored_slots(self.slots), arrays, meta

  def restore(
      self, slots: Any, arrays: dict[str, np.ndarray], meta: dict[str, Any]
  ) -> None:
    """Inverse of `state`."""
    self.slots, self._call = slots_from_stored(slots), None
    self._queue = collections.deque(
        (json.loads(r), np.asarray(arrays[f"queue/{j}"]))
        for j, r in enumerate(meta["queue_records"])
    )
    self._records = {int(k): json.loads(r) for k, r in meta["records"].items()}
    self._partial = collections.defaultdict(list)
    for key, n in meta["partial"].items():
      self._partial[int(key)] = [
          completions_lib.from_arrays(arrays, f"partial/{key}/{j}/")
          for j in range(n)
      ]
    self._next_key = int(meta["next_key"])
    self._starts = int(meta["starts"])
    self.verify_stats = collections.Counter(meta["verify_stats"])
    self.work = collections.Counter(meta["work"])
