"""SlotRunner: verification overlapped with the next decode call changes
nothing but wall time.

A real sampler (tiny random model, several stop ids so completions end at
different steps) and a real reward pool; the tokenizer is a stand-in whose
completion text is a math answer that depends on the completion's length, so
scores are mixed (or a verification that hangs, for the timeout test). The
driver below takes the trainer's decisions in miniature: start what fits,
decode `_STEPS` per call, and plan the next call early, inside `on_harvest`,
when it needs no new prompts. The trainer-level test compares whole runs.
"""

import collections
import dataclasses

import jax
import numpy as np
import pytest

from scalerl_jax import rewards
from scalerl_jax import sharding
from scalerl_jax import trainer as trainer_lib
from scalerl_jax.data import builtin_task
from scalerl_jax.data import pipeline as pipeline_lib
from scalerl_jax.models.model_config import ModelConfig
from scalerl_jax.models.transformer import Transformer
from scalerl_jax.rl import slot_runner as slot_runner_lib
from scalerl_jax.sampling.sampler import Sampler
from scalerl_jax.sampling.settings import SamplingSettings
from tests import helpers

_G = 2  # Completions per prompt.
_P = 3  # Prompts per pipeline batch.
_STEPS = 3  # Decode steps per call.
_CALLS = 12
# sympy tries to evaluate the tower: a timeout.
_HANG = r"\boxed{5^{5^{5^{5^5}}}}"


@dataclasses.dataclass
class _LengthTokenizer:
  """Completion text: the answer 1 after an odd number of
  tokens, else 0; or a hang."""

  # Completions whose length is a multiple of this hang (0: none).
  hang_every: int = 0
  pad_id: int = 0
  hangs: int = 0  # Hanging texts handed out.

  def completion_text(self, prompt_ids, completion_ids) -> str:
    del prompt_ids
    n = len(completion_ids)
    if self.hang_every and n % self.hang_every == 0:
      self.hangs += 1
      return _HANG
    return rf"\boxed{{{n % 2}}}"


def _prompts(vocab_size: int, scores_seen: list):
  """Endless batches of _P random prompts (math, ids in start order).

  Like the curriculum's filter, a batch depends on the scores seen before it
  is drawn: its answer is the parity of their sum, so drawing it before the
  scores are in would change later scores.
  """
  rng, i = np.random.RandomState(0), 0
  while True:
    lengths = rng.randint(2, 9, _P).astype(np.int32)
    answer = str(int(sum(scores_seen)) % 2)
    records = tuple(
        {"id": f"p{i + j}", "answer": answer, "verifier": "math"}
        for j in range(_P)
    )
    i += _P
    yield pipeline_lib.PromptBatch(
        rng.randint(3, vocab_size, (_P, 8)).astype(np.int32),
        lengths,
        records,
        _G,
    )


@pytest.fixture(scope="module")
def setup():
  config = helpers.tiny_config()
  config.sampling.max_prompt_len, config.sampling.max_new_tokens = 8, 12
  cfg = ModelConfig.from_config(config.model)
  mesh, rules = sharding.make_mesh(config.mesh), sharding.logical_rules(
      config.mesh
  )
  params, _ = sharding.init_model_params(
      Transformer(cfg), jax.random.key(0), mesh, rules
  )
  # Three stop ids: about one completion in 40 ends at each step.
  settings = SamplingSettings.from_config(
      config.sampling, eos_ids=(1, 2, 3), pad_id=0
  )
  with config.unlocked():
    config.rewards.timeout_s, config.rewards.num_workers = 1.5, 2
  with rewards.RewardPool(config.rewards) as pool:
    yield dict(
        sampler=Sampler(cfg, settings, mesh, rules),
        params=params,
        pool=pool,
        vocab_size=cfg.vocab_size,
    )


def _rollouts(setup, tok, scores_seen=()):
  return slot_runner_lib.SlotRunner(
      setup["sampler"],
      setup["pool"],
      tok,
      _prompts(setup["vocab_size"], scores_seen),
      num_slots=4 * _G,
      generations=_G,
      reward_range=(-1.0, 1.0),
      rng=jax.random.key(7),
  )


def _run(setup, overlap: bool, tok=None, calls: int = _CALLS):
  """`calls` decode calls, the next planned in `on_harvest` when
  `overlap`; what happened."""
  scores_seen = []  # Read by the prompt source, as the trainer's curriculum is.
  r = _rollouts(setup, tok or _LengthTokenizer(), scores_seen)
  params, out = setup["params"], {
      "groups": [],
      "ahead": 0,
      "deferred": 0,
      "unscored": True,
  }

  def plan(pull: bool):
    return None if r.fill(params, 2, pull=pull) is None else _STEPS

  for call in range(calls):
    planned = []

    def on_harvest(groups, last=call == calls - 1, planned=planned):
      out["unscored"] &= all(np.isnan(g.scores_G).all() for g in groups)
      planned.append(plan(pull=False) if overlap and not last else None)
      out["deferred"] += overlap and not last and planned[0] is None
      return planned[0] or 0

    if call == 0:
      plan(pull=True)
    groups = r.step(params, 0, _STEPS, on_harvest)
    scores_seen += [g.scores_G.sum() for g in groups]
    out["groups"] += groups
    if planned[0]:
      out["ahead"] += 1
      with pytest.raises(RuntimeError, match="in flight"):
        r.state()  # Not between calls: step dispatched the next one.
    elif call < calls - 1:
      plan(pull=True)
  out["runner"] = r
  return out


def _host(x):
  """A device array as numpy; PRNG keys as their data."""
  return np.asarray(
      jax.random.key_data(x)
      if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)
      else x
  )


def _group_rows(groups):
  return [
      (
          g.index,
          g.record["id"],
          g.completions.tokens.tolist(),
          g.completions.version.tolist(),
          g.scores_G.tolist(),
          g.rewards_G.tolist(),
          g.completions.completion_len.tolist(),
      )
      for g in groups
  ]


def test_overlapped_groups_scores_and_state_equal_the_synchronous_ones(setup):
  sync, overlapped = _run(setup, overlap=False), _run(setup, overlap=True)
  # The overlapped path was taken: calls dispatched before the scores, and
  # fills that needed the pipeline left until the scores were in.
  assert (
      overlapped["ahead"] >= 3
      and overlapped["deferred"] >= 1
      and sync["ahead"] == 0
  )
  assert overlapped["unscored"]  # on_harvest ran before the scores were in.
  scores = np.concatenate([g.scores_G for g in sync["groups"]])
  # Mixed: a swap would show.
  assert len(sync["groups"]) >= 6 and 0 < scores.mean() < 1
  assert _group_rows(overlapped["groups"]) == _group_rows(sync["groups"])
  a, b = sync["runner"], overlapped["runner"]
  assert a.verify_stats == b.verify_stats and a.work == b.work
  (slots_a, arrays_a, meta_a), (slots_b, arrays_b, meta_b) = (
      a.state(),
      b.state(),
  )
  assert meta_a == meta_b and arrays_a.keys() == arrays_b.keys()
  for k in arrays_a:
    np.testing.assert_array_equal(arrays_a[k], arrays_b[k], err_msg=k)
  jax.tree.map(
      lambda x, y: np.testing.assert_array_equal(_host(x), _host(y)),
      slots_a,
      slots_b,
  )


def test_a_verification_that_times_out_in_the_overlapped_path_scores_0_and_counts(
    setup,
):
  tok = _LengthTokenizer(hang_every=3)
  out = _run(setup, overlap=True, tok=tok, calls=6)
  assert out["ahead"] >= 1 and tok.hangs >= 1
  assert out["runner"].verify_stats["num_timeouts"] == tok.hangs
  for g in out["groups"]:
    hung = g.completions.completion_len % 3 == 0
    np.testing.assert_array_equal(g.scores_G[hung], 0.0)
    np.testing.assert_array_equal(g.rewards_G[hung], -1.0)


def test_step_refuses_a_call_other_than_the_one_dispatched_ahead(setup):
  r = _rollouts(setup, _LengthTokenizer())
  r.fill(setup["params"], 2)
  r.step(setup["params"], 0, _STEPS, lambda groups: _STEPS)
  with pytest.raises(
      ValueError, match=f"a call of {_STEPS} steps at version 0 is in flight"
  ):
    r.step(setup["params"], 0, _STEPS + 1)
  assert r.step(setup["params"], 0, _STEPS) is not None  # The one dispatched.
  r.state()  # Between calls again.


class _ParityPool:
  """The trainer's pool, shown the worked solution instead of
  completions of odd length."""

  def __init__(self, pool):
    self.pool = pool

  def submit(self, texts, records):
    return self.pool.submit(
        [
            builtin_task.target_text(r) if len(t) % 2 else t
            for t, r in zip(texts, records)
        ],
        records,
    )


def _trainer_run(tmp_path, overlap: bool, num_steps: int = 3):
  """A short RL run: what it decided and counted; and the steps
  `on_harvest` returned.

  Scores are mixed (`_ParityPool`), and 12 training prompts with a low
  retirement threshold make the curriculum drop prompts from the second
  epoch on: a batch drawn before the scores it waits for would differ.
  """
  config = helpers.rl_test_config("pipeline_rl", num_steps=num_steps)
  config.trainer.warm_start_steps = 0
  config.data.builtin_num_train, config.curriculum.retire_threshold = 12, 0.7
  config.rewards.overlap = overlap
  trainer = trainer_lib.Trainer(config, str(tmp_path / f"overlap_{overlap}"))
  gen = trainer.generation
  gen.slot_runner.pool = _ParityPool(gen.slot_runner.pool)
  ahead, taken, harvested, draws, decoded = (
      [],
      [],
      [0],
      [],
      collections.Counter(),
  )
  step, take = gen.slot_runner.step, gen.buffer.take

  def spying_step(params, version, steps, on_harvest):
    def spy(groups):
      harvested[0] += len(groups)
      ahead.append(on_harvest(groups))
      return ahead[-1]

    decoded[version] += steps
    groups = step(params, version, steps, spy)
    # Dispatched before the scores: what the schedule says now they are in.
    if ahead[-1]:
      assert ahead[-1] == gen.schedule.decode_steps(
          decoded[version],
          gen.buffer.num_ready(version, gen.max_off_policy),
          gen.slot_runner.in_flight,
      )
    return groups

  def checked(batches):
    """The pipeline; notes for each draw whether the curriculum has seen
    every harvested group."""
    while True:
      draws.append(gen.curriculum.metrics()["groups_seen"] == harvested[0])
      try:
        batch = next(batches)
      except StopIteration:
        return
      yield batch

  def recording_take(num_groups, version, max_off_policy):
    groups = take(num_groups, version, max_off_policy)
    taken.append(
        None
        if groups is None
        else [(g.index, g.scores_G.tolist()) for g in groups]
    )
    return groups

  gen.slot_runner.step, gen.buffer.take = spying_step, recording_take
  gen.slot_runner.prompts = checked(gen.slot_runner.prompts)
  try:
    rows = [trainer.run_step() for _ in range(num_steps)]
    _, arrays, meta = gen.slot_runner.state()
    curriculum = gen.curriculum.state_dict()
  finally:
    trainer.close()
  keep = (
      "generator/decode_steps",
      "buffer/size",
      "buffer/in_flight",
      "train/loss",
      "train/reward_mean",
      "counters/tokens_generated",
      "verify/num_completions",
      "prompts_retired",
  )
  return (
      dict(
          rows=[{k: r[k] for k in keep} for r in rows],
          taken=taken,
          meta=meta,
          arrays=arrays,
          curriculum=curriculum,
          draws=draws,
      ),
      ahead,
  )


def test_the_trainer_takes_the_same_decisions_with_verification_overlapped(
    tmp_path,
):
  (sync, sync_ahead), (overlapped, ahead) = (
      _trainer_run(tmp_path, overlap) for overlap in (False, True)
  )
  # Calls dispatched before scores.
  assert not any(sync_ahead) and sum(map(bool, ahead)) >= 2
  assert sync["rows"][-1]["prompts_retired"] >= 1  # The pipeline skips prompts.
  # Every draw from the pipeline saw a curriculum up to date with every group
  # harvested, though calls were planned before the scores were in.
  assert len(overlapped["draws"]) >= 4 and all(overlapped["draws"])
  assert (
      overlapped["rows"] == sync["rows"]
      and overlapped["taken"] == sync["taken"]
  )
  assert (
      overlapped["meta"] == sync["meta"]
      and overlapped["curriculum"] == sync["curriculum"]
  )
  assert overlapped["arrays"].keys() == sync["arrays"].keys()
  for k in sync["arrays"]:
    np.testing.assert_array_equal(
        overlapped["arrays"][k], sync["arrays"][k], err_msg=k
    )
