"""train_and_evaluate(config, workdir): the loop of generate and train phases.

One mesh holds the policy, shared by the sampler and the jitted train step
(`mesh.layout='disaggregated'`: the sampler on devices of its own, the
weights moved there each step, and with `buffer.sync_mode='free'` driven by
a host thread of its own, rl/free_running.py; docs/design/disaggregated.md).
A step generates as the schedule allows (`rl/generation.Generation`) until
the buffer can hand out P groups, takes one optimizer step on them
(`rl/train_step.py`), then writes metrics, validates every `eval_every` and
checkpoints every `checkpoint_every` steps. Every process of a
multi-controller run takes the same host decisions; process 0 alone writes
files. Design: docs/design/rl.md.

Resume order (one checkpoint holds it all): step and train state -> sampler
slots -> data iterator and prompt queue -> curriculum -> buffer and partial
groups -> work counts, meter, counters -> monitors -> metrics.jsonl cut.
"""

from __future__ import annotations

import time
from typing import Any

from absl import logging
import jax
import ml_collections

from scalerl_jax import evaluation
from scalerl_jax import optim
from scalerl_jax import workdir as workdir_lib
from scalerl_jax.checkpoint import checkpointer as checkpoint_lib
from scalerl_jax.experiment import Experiment
from scalerl_jax.metrics import busy
from scalerl_jax.metrics import compute
from scalerl_jax.metrics import counters as counters_lib
from scalerl_jax.metrics import monitors as monitors_lib
from scalerl_jax.metrics import progress as progress_lib
from scalerl_jax.metrics import writer as metrics_lib
from scalerl_jax.multihost import runtime
from scalerl_jax.rl import batch as batch_lib
from scalerl_jax.rl import free_running
from scalerl_jax.rl import generation as generation_lib
from scalerl_jax.rl import role_watchdog
from scalerl_jax.rl import train_step as train_step_lib
from scalerl_jax.rl import weight_sync


class Trainer:
  """The RL loop's state and its steps; `train_and_evaluate` drives it."""

  def __init__(self, config: ml_collections.ConfigDict, workdir: str):
    """Builds the experiment; restores the latest checkpoint, if any."""
    self.config, self.workdir = config, workdir
    # Before orbax touches a device.
    runtime.maybe_initialize_distributed(config.mesh)
    self.checkpointer = checkpoint_lib.for_workdir(
        workdir, max_to_keep=config.trainer.keep_checkpoints
    )
    restore_step = self.checkpointer.step_to_restore()
    resuming = restore_step is not None
    self.exp = exp = Experiment.build(config, workdir, base_params=not resuming)
    self.optimizer = optim.make_optimizer(config.optim)
    self.state, self.state_shardings = train_step_lib.init_train_state(
        self.optimizer, exp.params, exp.param_shardings, exp.mesh
    )
    exp.params = None  # Donated to the train state.
    slot_bytes = generation_lib.Generation.slot_bytes(config, exp.sampler)
    step, batch_sh = train_step_lib.jit_train_step(
        config,
        exp.model,
        exp.mesh,
        exp.rules,
        self.optimizer,
        self.state_shardings,
        hbm_budget=exp.train_step_budget(slot_bytes),
    )
    self.train_step = train_step_lib.host_step(
        step, batch_sh, exp.mesh, exp.rules
    )
    self.sampler, self.val_sampler = exp.budgeted_samplers(
        self.state, slot_bytes
    )
    self.pool = exp.reward_pool()
    # When each role's programs ran (time/<role>_*), and the weights' moves.
    self.clocks = {role: busy.BusyClock(role) for role in busy.ROLES}
    self.sync = weight_sync.WeightSync(exp)
    self.watch = role_watchdog.StepWatch.for_config(
        config, self.checkpointer.directory
    )
    self.generation = generation_lib.Generation(
        config,
        self.sampler,
        self.pool,
        exp.tok,
        exp.prompts("train"),
        clock=self.clocks["generator"],
        watch=self.watch,
    )
    # buffer.sync_mode='free': the generator on a host thread of its own.
    # `source` hands out the batches and the generator's scalars.
    self.free = free_running.FreeGenerator.for_config(
        config, self.generation, self.sampler, self.checkpointer.directory
    )
    self.source = self.free or self.generation
    self.val_batches = exp.eval_batches()
    self.writer = metrics_lib.MetricWriter(workdir)
    self.meter = compute.ComputeMeter()
    self.monitors = monitors_lib.Monitors.from_config(config)
    self.counters = counters_lib.initial()
    self.step = 0
    # Decode steps of the next step's generation run already, under the
    # previous weights (buffer.sync_at_decode_step).
    self.decoded_ahead = 0
    # Every prompt retired while decoding ahead: the next step stops the run.
    self.retired_ahead = False
    if resuming:
      self._restore(restore_step)

  def close(self) -> None:
    """Stops a free generator, then waits for checkpoints; stops the rest."""
    if self.free is not None:
      self.free.stop()
    self.watch.close()
    self.checkpointer.wait()
    self.writer.close()
    self.pool.close()
    self.sync.close()
    for clock in self.clocks.values():
      clock.close()

  # Checkpoints.

  def _checkpoint_items(self):
    slots, host, gen_extra = self.generation.state()
    device = {"train": self.state, "slots": slots}
    extra = {
        "step": self.step,
        **gen_extra,
        "meter": self.meter.state_dict(),
        "counters": self.counters,
        "monitors": self.monitors.state_dict(),
        "decoded_ahead": self.decoded_ahead,
    }
    return device, host, extra

  def save(self, force: bool = False) -> None:
    with free_running.paused(self.free):
      device, host, extra = self._checkpoint_items()
      self.checkpointer.save(
          self.step, device, extra, host_state=host, force=force
      )

  def _restore(self, step: int) -> None:
    device, _, _ = self._checkpoint_items()
    abstract = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
        device,
    )
    device, extra, host = self.checkpointer.restore(step, abstract)
    self.state = device["train"]
    self.step = int(extra["step"])
    self.generation.restore(device["slots"], host, extra)
    self.meter.load_state_dict(extra["meter"])
    self.counters = dict(extra["counters"])
    # Absent before monitors existed.
    self.monitors.load_state_dict(extra.get("monitors", {}))
    # Absent before the disaggregated layout existed.
    self.decoded_ahead = int(extra.get("decoded_ahead", 0))
    logging.info("Resumed from the checkpoint at step %d", self.step)

  # Phases.

  def generate(self) -> tuple[dict[str, float], Any]:
    """The generator's share of one step, as the schedule allows; its metrics
    and the weights it used where the next step decodes ahead with them.

    Ends once the schedule stops it, which is never before the buffer can hand
    out the next P groups. Its wall time and the FLOPs of every prompt it
    prefilled and token it decoded go into the compute meter here, whether or
    not those groups are ever trained on. The weights reach the generator's
    devices (`Experiment.to_generator`) and are regrouped for the sampler once
    per phase; colocated, the regrouped copy is dropped before training.
    Free-running, it waits for the batch the generator's thread makes.
    """
    if self.free is not None:
      if not self.free.started:
        self.free.start(self.sync.get(self.state.params, self.step), self.step)
      t0, flops0 = time.perf_counter(), self.free.flops
      self.free.wait_for_batch(self.step)
      t_gen = time.perf_counter() - t0
      self.meter.add(self.free.flops - flops0, t_gen, self.exp.num_devices)
      return {"time/generate_s": t_gen, **self.free.step_scalars()}, None
    if self.retired_ahead:
      raise StopIteration
    moved = self.sync.get(self.state.params, self.step)
    t0 = time.perf_counter()
    params = self.sampler.prepare(moved)
    self.clocks["generator"].watch(params.weights, t0)
    t0, flops0 = time.perf_counter(), self.generation.flops
    decoded = self.generation.run(params, self.step, decoded=self.decoded_ahead)
    t_gen = time.perf_counter() - t0
    self.meter.add(self.generation.flops - flops0, t_gen, self.exp.num_devices)
    ahead = params if self.config.buffer.sync_at_decode_step else None
    return {
        "time/generate_s": t_gen,
        "generator/decode_steps": float(decoded),
    }, ahead

  def train(self, groups, ahead=None) -> tuple[dict[str, float], int]:
    """One optimizer step on `groups`; (metrics, sequence length).

    With `ahead` (the generator's weights of this step), the next step's
    generation decodes its first `buffer.sync_at_decode_step` steps with them
    on the generator's devices while the trainer's compute the step.
    """
    host_batch = batch_lib.collate(groups)
    t0 = time.perf_counter()
    self.state, step_metrics = self.train_step(self.state, host_batch)
    # Ready read on the clock's thread: the decoding ahead is not held up.
    self.clocks["trainer"].watch(step_metrics, t0)
    if ahead is not None:  # The step is dispatched, not waited for.
      try:
        self.decoded_ahead = self.generation.run(
            ahead,
            self.step + 1,
            weights_version=self.step,
            until=self.config.buffer.sync_at_decode_step,
        )
      except StopIteration:
        # Raised where the step is already dispatched: it finishes and
        # counts, and the next step's generation stops the run.
        self.decoded_ahead, self.retired_ahead = 0, True
        logging.info(
            "step %d: every training prompt retired while the next step "
            "decoded ahead; the run stops after this step",
            self.step + 1,
        )
    step_metrics = {
        k: float(v) for k, v in jax.device_get(step_metrics).items()
    }
    if self.free is not None:  # Swapped in between two of its calls.
      version = self.step + 1
      moved = self.sync.get(self.state.params, version, keep=True)
      self.free.publish(moved, version)
    counters_lib.count_step(self.counters, step_metrics, self.step)
    return step_metrics, host_batch["tokens_BxS"].shape[1]

  def evaluate(self) -> dict[str, float]:
    with free_running.paused(self.free):
      return evaluation.evaluate(
          self.val_sampler,
          self.sync.get(self.state.params, self.step, keep=True),
          self.val_batches,
          self.exp.tok,
          self.pool,
          evaluation.validation_key(self.config),
          version=self.step,
      )

  def run_step(self) -> dict[str, float]:
    """One generate + train step; returns its metrics."""
    start = time.perf_counter()
    with self.watch.on(role_watchdog.GENERATOR, f"moving weights v{self.step}"):
      gen_metrics, ahead = self.generate()
    groups = self.source.take(self.step)
    row = self.generation.batch_metrics(groups, self.step)
    t1, flops1 = time.perf_counter(), self.source.flops
    try:
      with self.watch.on(role_watchdog.TRAINER, f"computing step {self.step}"):
        step_metrics, batch_len = self.train(groups, ahead)
    except Exception as e:
      if self.free is not None:
        e.add_note(f"trainer: step {self.step} failed; the generator stops")
      raise
    end = time.perf_counter()
    t_train = end - t1
    seq = [batch_len] * sum(len(g.scores_G) for g in groups)
    # The decoding ahead's FLOPs too: its time is the step's.
    self.meter.add(
        compute.train_flops(self.exp.model_cfg, seq)
        + self.source.flops
        - flops1,
        t_train,
        self.exp.num_devices,
    )
    self.step += 1
    t_gen = gen_metrics["time/generate_s"]
    row.update({f"train/{k}": v for k, v in step_metrics.items()})
    row.update(self.source.curriculum_scalars())
    row.update(
        {
            **gen_metrics,
            "time/train_s": t_train,
            "time/generate_frac": t_gen / max(t_gen + t_train, 1e-9),
            **self.source.scalars(),
            **{f"counters/{k}": float(v) for k, v in self.counters.items()},
            **self.source.work_scalars(),
            **self.meter.scalars(),
            **compute.memory_scalars(),
            **busy.scalars(
                {r: c.window(start, end) for r, c in self.clocks.items()},
                end - start,
            ),
            **self.sync.scalars(),
        }
    )
    return row


def train_and_evaluate(
    config: ml_collections.ConfigDict, workdir: str
) -> dict[str, float]:
  """Runs (or resumes) the run in `workdir`; the last metrics written."""
  runtime.maybe_initialize_distributed(config.mesh)
  lock = workdir_lib.lock_workdir(workdir) if jax.process_index() == 0 else None
  try:
    return _train(config, workdir)
  finally:
    if lock is not None:
      lock.close()


def _train(config: ml_collections.ConfigDict, workdir: str) -> dict[str, float]:
  trainer = Trainer(config, workdir)
  # Resolved: model fields from hf_path included.
  workdir_lib.record_config(trainer.config, workdir)
  t = config.trainer
  # Lines past the checkpoint will be written again by the resumed run; at
  # step 0 that includes step 0's validation line (a kill before the first
  # checkpoint would otherwise leave it twice).
  trainer.writer.truncate_after(trainer.step if trainer.step else -1)
  progress = progress_lib.Progress(t.num_steps, trainer.step)
  last: dict[str, float] = {}
  try:
    if trainer.step == 0:
      last = {
          **trainer.evaluate(),
          **trainer.meter.scalars(),
          **compute.memory_scalars(),
      }
      last.update(trainer.monitors.scalars(trainer.monitors.check(0, last)))
      trainer.writer.write(0, last)
      logging.info(
          "step 0: validation mean@%d %.3f",
          t.eval_samples,
          last["val/mean_at_k"],
      )
      progress.update(0, val=last["val/mean_at_k"])
    while trainer.step < t.num_steps:
      try:
        row = trainer.run_step()
      except StopIteration:
        logging.warning(
            "step %d: every training prompt is retired (No-Positive-Resampling); "
            "stopping early",
            trainer.step,
        )
        trainer.save(force=True)
        break
      if trainer.counters["consecutive_nonfinite"] >= t.max_nonfinite_steps:
        raise FloatingPointError(
            f"step {trainer.step}: {t.max_nonfinite_steps} consecutive non-finite steps "
            f"(trainer.max_nonfinite_steps); stopping. The last good checkpoint is in "
            f"{trainer.checkpointer.directory}"
        )
      if evaluation.is_eval_step(t, trainer.step):
        row.update(trainer.evaluate())
      alerts = trainer.monitors.check(trainer.step, row)
      row.update(trainer.monitors.scalars(alerts))
      if trainer.step % t.log_every == 0 or "val/mean_at_k" in row or alerts:
        trainer.writer.write(trainer.step, row)
      last = row
      progress.update(
          trainer.step,
          reward=row["train/reward_mean"],
          # None: the last value stays.
          val=row.get("val/mean_at_k"),
      )
      stop = bool(alerts) and trainer.monitors.stop_on_alert
      if (
          trainer.step % t.checkpoint_every == 0
          or trainer.step == t.num_steps
          or stop
      ):
        trainer.save(force=stop)
      if stop:
        raise monitors_lib.AlertStop(
            f"step {trainer.step}: monitor.stop_on_alert: {alerts[0].message}; the run stopped "
            f"after checkpointing this step in {trainer.checkpointer.directory}. To go on, "
            "raise the threshold (monitor.*) or set monitor.stop_on_alert=False and restart"
        )
    trainer.checkpointer.wait()
    if jax.process_index() == 0:
      workdir_lib.mark_finished(workdir)
  finally:
    progress.close()
    trainer.close()
  return last
