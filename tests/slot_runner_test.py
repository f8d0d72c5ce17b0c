"""SlotRunner and the generation loop: verification overlapped with the next
decode call changes nothing but wall time, and the loop keeps its order.

A real sampler (tiny random model, several stop ids so completions end at
different steps) and a real reward pool; the tokenizer is a stand-in whose
completion text is a math answer that depends on the completion's length, so
scores are mixed (or a verification that hangs, for the timeout test). The
driver below takes the trainer's decisions in miniature: start what fits,
decode `_STEPS` per call, and dispatch the next call between `harvest` and
`collect` when it needs no new prompts. The trainer-level tests compare whole
runs and log the order of `Generation.run`'s events.
"""

import collections
import dataclasses
import re

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
  """`calls` decode calls, the next dispatched before the scores when
  `overlap` and it needs no new prompts; what happened."""
  scores_seen = []  # Read by the prompt source, as the trainer's curriculum is.
  r = _rollouts(setup, tok or _LengthTokenizer(), scores_seen)
  params, out = setup["params"], {
      "groups": [],
      "ahead": 0,
      "deferred": 0,
      "unscored": True,
  }
  r.fill(params, 2)
  ahead = False
  for call in range(calls):
    if not ahead:
      r.dispatch(params, 0, _STEPS)
    groups, scoring = r.harvest()
    out["unscored"] &= all(np.isnan(g.scores_G).all() for g in groups)
    early = overlap and call < calls - 1
    ahead = early and r.fill(params, 2, pull=False) is not None
    out["deferred"] += early and not ahead
    if ahead:
      r.dispatch(params, 0, _STEPS)
      out["ahead"] += 1
      with pytest.raises(RuntimeError, match="in flight"):
        r.state()  # Not between calls: the next one is dispatched.
    r.collect(groups, scoring)
    scores_seen += [g.scores_G.sum() for g in groups]
    out["groups"] += groups
    if not ahead and call < calls - 1:
      r.fill(params, 2)
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
  assert overlapped["unscored"]  # Harvested before the scores were in.
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


def test_calls_and_harvests_alternate(setup):
  r = _rollouts(setup, _LengthTokenizer())
  params = setup["params"]
  with pytest.raises(RuntimeError, match="no decode call is dispatched"):
    r.harvest()
  r.fill(params, 2)
  r.dispatch(params, 0, _STEPS)
  # A second call would hide the first one's work from the counts.
  with pytest.raises(
      RuntimeError, match=f"a call of {_STEPS} steps at version 0 is not"
  ):
    r.dispatch(params, 0, _STEPS + 1)
  with pytest.raises(RuntimeError, match="in flight"):
    r.state()
  r.collect(*r.harvest())
  r.state()  # Between calls again.
  # The refused call never ran: what still decodes has the first call's steps.
  prompt_len_N, seq_len_N, running_N = r.sampler.progress(r.slots)
  assert running_N.any()
  np.testing.assert_array_equal((seq_len_N - prompt_len_N)[running_N], _STEPS)


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


def _trainer_run(workdir: str, overlap: bool, num_steps: int = 3):
  """A short RL run: what it decided and counted, and the log of
  `Generation.run`'s events.

  Scores are mixed (`_ParityPool`), and 12 training prompts with a low
  retirement threshold make the curriculum drop prompts from the second
  epoch on: a batch drawn before the scores it waits for would differ.
  """
  config = helpers.rl_test_config("pipeline_rl", num_steps=num_steps)
  config.trainer.warm_start_steps = 0
  config.data.builtin_num_train, config.curriculum.retire_threshold = 12, 0.7
  config.rewards.overlap = overlap
  # 10 groups' slots, 3 batches of 4 prompts: after the first 10 finish, 2
  # queued prompts start without the pipeline, while those 10 are scored.
  config.sampling.num_slots = 10 * config.data.generations_per_prompt
  trainer = trainer_lib.Trainer(config, workdir)
  gen, events, taken = trainer.generation, [], []
  runner = gen.slot_runner
  runner.pool = _ParityPool(runner.pool)
  dispatch, harvest, collect = runner.dispatch, runner.harvest, runner.collect
  add, update, take = gen.buffer.add, gen.curriculum.update, gen.buffer.take
  decoded = collections.Counter()  # Decode steps dispatched, by version.

  def logged_dispatch(params, version, steps):
    events.append(("dispatch", version, steps))
    decoded[version] += steps
    dispatch(params, version, steps)

  def logged_harvest():
    groups, scoring = harvest()
    events.append(("harvest", [(g.index, g.record["id"]) for g in groups]))
    return groups, scoring

  def logged_add(group):
    events.append(("add", group.index, bool(np.isnan(group.scores_G).all())))
    add(group)

  def logged_collect(groups, scoring):
    collect(groups, scoring)
    events.append(("collect", [g.index for g in groups]))
    # A call dispatched before the scores: what the schedule says now they
    # are in.
    turn = events[_turns(events)[-1] :]
    if turn[-2][0] == "dispatch":
      _, version, steps = turn[-2]
      assert steps == gen.schedule.decode_steps(
          decoded[version] - steps,
          gen.buffer.num_ready(version, gen.max_off_policy),
          runner.in_flight,
      )

  def logged_update(ids, scores):
    events.append(("update", ids[0], bool(np.isfinite(scores).all())))
    update(ids, scores)

  def logged_draws(batches):
    while True:
      events.append(("draw",))
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

  runner.dispatch, runner.harvest, runner.collect = (
      logged_dispatch,
      logged_harvest,
      logged_collect,
  )
  gen.buffer.add, gen.curriculum.update = logged_add, logged_update
  gen.buffer.take, runner.prompts = recording_take, logged_draws(runner.prompts)
  try:
    rows = [trainer.run_step() for _ in range(num_steps)]
    _, arrays, meta = runner.state()
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
  return dict(
      rows=[{k: r[k] for k in keep} for r in rows],
      taken=taken,
      meta=meta,
      arrays=arrays,
      curriculum=curriculum,
      events=events,
  )


def _turns(events) -> list[int]:
  """Where each turn of the loop starts in `events`: at its harvest."""
  return [i for i, e in enumerate(events) if e[0] == "harvest"]


@pytest.fixture(scope="module")
def trainer_runs(tmp_path_factory):
  workdir = tmp_path_factory.mktemp("overlap")
  return {
      overlap: _trainer_run(str(workdir / str(overlap)), overlap)
      for overlap in (False, True)
  }


# One letter per event of `Generation.run`'s log.
_LETTERS = dict(
    dispatch="D", harvest="H", add="A", collect="C", update="U", draw="P"
)


def test_generation_run_harvests_stores_refills_collects_then_updates(
    trainer_runs,
):
  for overlap, run in trainer_runs.items():
    events, starts = run["events"], _turns(run["events"])
    # Before the first harvest: prompts drawn, one call dispatched.
    assert re.fullmatch(
        "P+D", "".join(_LETTERS[e[0]] for e in events[: starts[0]])
    )
    ahead = verified_ahead = 0
    for n, (a, b) in enumerate(zip(starts, starts[1:] + [len(events)])):
      turn = events[a:b]
      letters = "".join(_LETTERS[e[0]] for e in turn)
      # Stored as harvested, collected, the curriculum updated, and only then
      # prompts drawn; one call dispatched per turn, but after the last.
      assert re.fullmatch("HA*D?CU*P*D?", letters), letters
      assert letters.count("D") == (n < len(starts) - 1), letters
      harvested = turn[0][1]
      adds = [e for e in turn if e[0] == "add"]
      updates = [e for e in turn if e[0] == "update"]
      assert [e[1] for e in adds] == [k for k, _ in harvested]
      assert all(unscored for *_, unscored in adds)
      collected = next(e for e in turn if e[0] == "collect")
      assert collected[1] == [k for k, _ in harvested]
      assert [e[1] for e in updates] == [i for _, i in harvested]
      assert all(scored for *_, scored in updates)
      ahead += "DC" in letters
      verified_ahead += "ADC" in letters
    # Calls dispatched before the scores were in, where overlapped; some while
    # groups were being verified.
    if overlap:
      assert ahead >= 2 and verified_ahead >= 1
    else:
      assert ahead == 0


def test_the_trainer_takes_the_same_decisions_with_verification_overlapped(
    trainer_runs,
):
  sync, overlapped = trainer_runs[False], trainer_runs[True]
  assert sync["rows"][-1]["prompts_retired"] >= 1  # The pipeline skips prompts.
  assert sum(e[0] == "draw" for e in overlapped["events"]) >= 4
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
