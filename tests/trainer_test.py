"""End-to-end RL runs on the built-in task: metrics,
checkpoints, resume, export.

One warm start is trained per test session (helpers.rl_base_dir) and copied
into each run's workdir, where the trainer finds and reuses it.
"""

import copy
import dataclasses
import gc
import json
import os
import shutil
import subprocess
import sys

from absl import logging as absl_logging
import jax
import numpy as np
import pytest
import torch
import transformers

from configs import scalerl
from scalerl_jax import experiment
from scalerl_jax import trainer as trainer_lib
from scalerl_jax import workdir as workdir_lib
from scalerl_jax.checkpoint import policy
from scalerl_jax.metrics import compute
from scalerl_jax.rl import schedules
from tests import helpers

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def base_dir():
  path = helpers.rl_base_dir()
  # Experiment.build keeps the warm start in the workdir by default.
  assert os.path.isdir(os.path.join(path, "base_policy")) and os.path.isfile(
      os.path.join(path, "tokenizer.model")
  )
  return path


def _workdir(base_dir, tmp_path, name):
  path = tmp_path / name
  shutil.copytree(base_dir, path)
  return str(path)


def _metrics(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


def _assert_lag_within_bound(rows, k):
  """The off-policy bound held at every step: no token over k,
  no group evicted."""
  for r in rows:
    assert r["staleness/max"] <= k and r["staleness/over_k"] == 0, (
        r["step"],
        r,
    )
    assert r["buffer/evicted_stale"] == 0, r


def _final_params(config, workdir):
  trainer = trainer_lib.Trainer(config, workdir)
  try:
    return jax.device_get(trainer.state.params), trainer.step
  finally:
    trainer.close()


@pytest.fixture(scope="module")
def e2e_run(tmp_path_factory):
  """A 4-step PipelineRL run with validation every 2 steps: (config, workdir,
  its final metrics). Run once for all workers (helpers.built_once); each
  worker's tests use their own copy, as they open trainers on it."""
  workdir = str(tmp_path_factory.mktemp("e2e") / "run")
  shutil.copytree(helpers.pipeline_rl_run_dir(), workdir)
  with open(os.path.join(workdir, "last.json")) as f:
    last = json.load(f)
  return helpers.rl_test_config("pipeline_rl", num_steps=4), workdir, last


def test_end_to_end_run_writes_metrics_checkpoints_and_validation(e2e_run):
  config, workdir, last = e2e_run
  rows = _metrics(workdir)
  assert [r["step"] for r in rows] == [0, 1, 2, 3, 4]
  assert [r["step"] for r in rows if "val/mean_at_k" in r] == [0, 2, 4]
  assert workdir_lib.is_finished(workdir)
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["2", "4"]
  assert os.listdir(os.path.join(workdir, "tb"))
  train = rows[1:]
  for r in train:
    assert 0.0 <= r["train/reward_mean"] <= 1.0
    assert np.isfinite(r["train/loss"]) and r["train/nonfinite"] == 0
    assert r["alert/staleness"] == 0
  _assert_lag_within_bound(train, config.buffer.max_off_policy)
  # The warm-started policy solves some problems.
  assert rows[0]["val/mean_at_k"] > 0.05
  assert np.mean([r["train/reward_mean"] for r in train]) > 0.05
  assert last["val/mean_at_k"] == rows[-1]["val/mean_at_k"]
  # Compute is cumulative and strictly increasing.
  flops = [r["compute/flops"] for r in rows]
  assert flops == sorted(flops) and flops[-1] > flops[1] > 0
  # In-flight weight updates: some consumed completions span several versions.
  assert max(r["staleness/mixed_version_frac"] for r in train) > 0


@pytest.mark.slow(seconds=70)  # Two whole runs.
@pytest.mark.parametrize("schedule", ["pipeline_rl", "ppo_off_policy"])
def test_resume_is_bit_identical(base_dir, tmp_path, schedule):
  straight = _workdir(base_dir, tmp_path, "straight")
  trainer_lib.train_and_evaluate(
      helpers.rl_test_config(schedule, num_steps=4), straight
  )
  split = _workdir(base_dir, tmp_path, "split")
  trainer_lib.train_and_evaluate(
      helpers.rl_test_config(schedule, num_steps=2), split
  )
  trainer_lib.train_and_evaluate(
      helpers.rl_test_config(schedule, num_steps=4), split
  )

  config = helpers.rl_test_config(schedule, num_steps=4)
  params_a, step_a = _final_params(config, straight)
  params_b, step_b = _final_params(config, split)
  assert step_a == step_b == 4
  for a, b in zip(
      jax.tree_util.tree_leaves(params_a), jax.tree_util.tree_leaves(params_b)
  ):
    np.testing.assert_array_equal(a, b)

  # The metric streams agree too, apart from wall-clock measurements.
  def strip(rows):
    return [
        {
            k: v
            for k, v in r.items()
            if not k.startswith("time/") and k != "compute/device_seconds"
        }
        for r in rows
    ]

  assert strip(_metrics(straight)) == strip(_metrics(split))


def test_ppo_off_policy_takes_k_steps_per_generated_set(base_dir, tmp_path):
  workdir = _workdir(base_dir, tmp_path, "ppo")
  config = helpers.rl_test_config("ppo_off_policy", num_steps=4)  # k = 2
  trainer_lib.train_and_evaluate(config, workdir)
  train = _metrics(workdir)[1:]
  # Batches of a set were all generated by the set's first version: staleness
  # is 0 on the first step of each set and 1 on the second.
  assert [r["staleness/max"] for r in train] == [0, 1, 0, 1]
  assert [r["staleness/mixed_version_frac"] for r in train] == [0, 0, 0, 0]
  # The buffer holds the set's remaining batch after its first step.
  assert [r["buffer/size"] for r in train] == [4, 0, 4, 0]


@pytest.mark.parametrize("k", [1, 4, 8])
def test_pipeline_rl_holds_the_generator_back_so_no_token_lags_more_than_k(
    base_dir, tmp_path, k
):
  config = helpers.rl_test_config("pipeline_rl")
  p = config.data.prompts_per_step
  config.buffer.max_off_policy = k
  # A generator fast enough to finish many batches per train step: it runs
  # ahead until the bound stops it.
  config.buffer.decode_steps_per_train_step = 4 * config.sampling.max_new_tokens
  trainer = trainer_lib.Trainer(config, _workdir(base_dir, tmp_path, f"k{k}"))
  try:
    rows = [trainer.run_step() for _ in range(k + 2)]
  finally:
    trainer.close()
  # Held back, never evicted: every group it started was trained on in turn.
  _assert_lag_within_bound([dict(r, step=i) for i, r in enumerate(rows)], k)
  # It ran as far ahead as k allows: after each step's take, k batches wait.
  assert [r["buffer/size"] + r["buffer/in_flight"] for r in rows] == [k * p] * (
      k + 2
  )
  # The batch of step i was generated i versions earlier
  # until the lag reached k.
  assert [r["staleness/max"] for r in rows] == [min(i, k) for i in range(k + 2)]


def test_a_schedule_that_breaks_the_bound_shows_in_the_staleness_metrics(
    base_dir, tmp_path
):
  # A schedule and a buffer that act as if k were 3 in a run whose k is 1 (a
  # fault of both): tokens lag up to 3, and the metrics, which count against
  # the run's k, say so instead of clipping the lags at 1.
  config = helpers.rl_test_config("pipeline_rl")
  config.buffer.max_off_policy = 1
  config.buffer.decode_steps_per_train_step = 4 * config.sampling.max_new_tokens
  trainer = trainer_lib.Trainer(config, _workdir(base_dir, tmp_path, "broken"))
  gen = trainer.generation

  class Overeager(type(gen.schedule)):

    def max_starts(self, version, backlog, weights_behind=0):
      as_if_3 = dataclasses.replace(self, max_off_policy=3)
      return schedules.PipelineRL.max_starts(
          as_if_3, version, backlog, weights_behind
      )

  gen.schedule = Overeager(**dataclasses.asdict(gen.schedule))
  take, num_ready = gen.buffer.take, gen.buffer.num_ready
  gen.buffer.take = lambda n, version, k: take(n, version, 3)
  gen.buffer.num_ready = lambda version, k: num_ready(version, 3)
  assert gen.max_off_policy == 1
  try:
    rows = []
    for step in range(1, 6):
      row = trainer.run_step()
      rows.append(
          {
              "step": step,
              **row,
              **trainer.monitors.scalars(trainer.monitors.check(step, row)),
          }
      )
  finally:
    trainer.close()
  assert [r["staleness/max"] for r in rows] == [0, 1, 2, 3, 3]
  assert [r["staleness/over_k"] > 0 for r in rows] == [
      False,
      False,
      True,
      True,
      True,
  ]
  assert [r["alert/staleness"] for r in rows] == [0, 0, 1, 1, 1]
  with pytest.raises(AssertionError):
    _assert_lag_within_bound(rows, 1)


def test_the_trainer_keeps_one_copy_of_the_parameters(base_dir, tmp_path):
  # The base policy's buffers are donated to the train state. Of the
  # parameters' shapes, only the parameters and AdamW's two moments stay
  # allocated; an undonated base copy made it four (2.38 GB on an H200 for
  # qwen3_0.6b, docs/gpu.md).
  gc.collect()
  before = {id(a) for a in jax.live_arrays()}
  config = helpers.rl_test_config("pipeline_rl")
  trainer = trainer_lib.Trainer(config, _workdir(base_dir, tmp_path, "copies"))
  try:
    gc.collect()
    leaves = jax.tree.leaves(trainer.state.params)
    shapes = {(x.shape, x.dtype) for x in leaves}
    held = sum(
        a.nbytes
        for a in jax.live_arrays()
        if id(a) not in before and (a.shape, a.dtype) in shapes
    )
    assert held == 3 * sum(x.nbytes for x in leaves)
  finally:
    trainer.close()


def test_compute_counts_every_generated_token_trained_or_not(
    base_dir, tmp_path
):
  config = helpers.rl_test_config("pipeline_rl")
  # Runs ahead; stops mid-sequence.
  config.buffer.decode_steps_per_train_step = 40
  interruption = config.sampling.interruption
  interruption.enabled, interruption.phrase = True, "Time is up. </think>"
  interruption.thinking_budget_min, interruption.thinking_budget_max = 2, 12
  interruption.answer_budget = 24
  trainer = trainer_lib.Trainer(config, _workdir(base_dir, tmp_path, "flops"))
  try:
    trainer.generate()
    # Every sequence the sampler has touched, worked out from the rollouts'
    # state: finished groups in the buffer, finished rows waiting for their
    # group, and rows still decoding.
    buffer_arrays, buffer_meta = trainer.generation.buffer.state()
    _, roll_arrays, _ = trainer.generation.slot_runner.state()
    slots = trainer.generation.slot_runner.slots
    prompt_lens, lengths = [], []
    for i in range(len(buffer_meta["records"])):
      prompt_lens += buffer_arrays[f"{i}/prompt_len"].tolist()
      lengths += (
          buffer_arrays[f"{i}/seq_len"] - buffer_arrays[f"{i}/prompt_len"]
      ).tolist()
    partial = sorted(
        k.rsplit("/", 1)[0] for k in roll_arrays if k.endswith("/prompt_len")
    )
    for row in partial:
      prompt_lens.append(int(roll_arrays[f"{row}/prompt_len"]))
      lengths.append(int(roll_arrays[f"{row}/seq_len"]) - prompt_lens[-1])
    running = np.asarray(slots.active)
    assert (
        running.any()
        and len(buffer_meta["records"]) > config.data.prompts_per_step
    )
    prompt_lens += np.asarray(slots.prompt_len)[running].tolist()
    lengths += (np.asarray(slots.seq_len) - np.asarray(slots.prompt_len))[
        running
    ].tolist()
    expected = compute.generation_flops(
        trainer.exp.model_cfg, prompt_lens, lengths
    )
    work = trainer.generation.slot_runner.work
    assert trainer.meter.flops == work["flops"] == expected
    assert work["tokens_generated"] == sum(lengths)
    # Most of it is not in the next batch, and some of it
    # never teaches anything.
    rewards = [
        buffer_arrays[f"{i}/rewards_G"]
        for i in range(len(buffer_meta["records"]))
    ]
    assert any(r.min() == r.max() for r in rewards)

    row = trainer.run_step()
    assert row["counters/tokens_generated"] >= sum(lengths)
    assert row["compute/flops"] > expected
    # Budgets of 2-12 thinking tokens interrupt most completions.
    assert 0.5 < row["train/interruption_rate"] <= 1.0
  finally:
    trainer.close()


def test_export_matches_transformers_and_evaluate_reproduces_validation(
    e2e_run, tmp_path
):
  config, workdir, last = e2e_run
  # Trained with 4 prompts per step (16 sampler slots); the default config has
  # more. Export and evaluate read the run's recorded config and only its
  # parameters, so neither is told.
  assert (
      config.data.prompts_per_step
      == 4
      != scalerl.get_config().data.prompts_per_step
  )
  assert workdir_lib.load_config(workdir).to_dict() == config.to_dict()
  out = str(tmp_path / "hf")
  files = policy.export_checkpoint(workdir, out)
  assert "model.safetensors" in files and "tokenizer.model" in files
  hf = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
  exp = experiment.Experiment.build(config, workdir, base_params=False)
  params, _ = _final_params(config, workdir)
  ids = np.random.RandomState(0).randint(0, config.model.vocab_size, (2, 24))
  ours = exp.model.apply({"params": params}, ids)
  with torch.no_grad():
    theirs = hf(torch.tensor(ids)).logits.numpy()
  assert np.abs(np.asarray(ours) - theirs).max() <= 1e-4

  result = policy.evaluate_checkpoint(workdir)
  assert result["step"] == 4
  assert result["val/mean_at_k"] == last["val/mean_at_k"]


def test_export_launcher_needs_only_the_workdir(e2e_run, tmp_path):
  _, workdir, _ = e2e_run
  out = tmp_path / "hf"
  proc = subprocess.run(
      [
          sys.executable,
          "-m",
          "launch.export",
          f"--workdir={workdir}",
          f"--out={out}",
      ],
      cwd=REPO,
      capture_output=True,
      text=True,
      timeout=600,
      check=False,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert (out / "model.safetensors").is_file() and (
      out / "tokenizer.model"
  ).is_file()


def test_resume_with_a_changed_field_warns_naming_it(
    e2e_run, tmp_path, monkeypatch
):
  config, workdir, _ = e2e_run
  resumed_dir = str(tmp_path / "resumed")
  shutil.copytree(workdir, resumed_dir)
  warnings = []
  monkeypatch.setattr(
      absl_logging, "warning", lambda msg, *args: warnings.append(msg % args)
  )
  changed = copy.deepcopy(config)
  changed.trainer.log_every = config.trainer.log_every + 1
  # Resumes at its last step, 4 of 4.
  trainer_lib.train_and_evaluate(changed, resumed_dir)
  field = f"trainer.log_every: {config.trainer.log_every} -> {config.trainer.log_every + 1}"
  assert [
      w for w in warnings if "differs from the recorded one" in w and field in w
  ]
  assert (
      workdir_lib.load_config(resumed_dir).trainer.log_every
      == changed.trainer.log_every
  )


def test_a_second_run_on_a_busy_workdir_is_refused(tmp_path):
  holder = workdir_lib.lock_workdir(str(tmp_path))
  try:
    with pytest.raises(RuntimeError, match=f"pid {os.getpid()}"):
      workdir_lib.lock_workdir(str(tmp_path))
  finally:
    holder.close()
  workdir_lib.lock_workdir(str(tmp_path)).close()  # Free again once released.
