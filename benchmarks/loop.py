"""Whole-loop overhead: the share of the RL loop's wall time spent
outside model compute.

  python -m benchmarks.loop
  python -m benchmarks.loop --steps=20 \
      --config.trainer.warm_start_dir=/tmp/base_policy
  # tiny settings: checks that it runs, times nothing useful
  python -m benchmarks.loop --quick
  # verifiers on the critical path
  python -m benchmarks.loop --config.rewards.overlap=False

Runs the real loop, `trainer.train_and_evaluate`, on the default config
(configs/scalerl.py, tiny_cpu; any `--config.*` field may be overridden) for
`--steps` RL steps in a fresh workdir, with timers put around its parts from
outside the library:

* model compute: the sampler's jitted weight regrouping (`programs.prepare`),
  prefill (`programs.start`) and decode (`programs.advance`) programs and the
  jitted train step (the trainer's
  `train_step` less the host-to-device placement of its batch), each call
  timed up to `jax.block_until_ready` of its outputs;
* outside model compute, by where it is spent: the sampler's small slot
  programs (free-slot flags, progress reads, harvest), the prompt pipeline,
  verification (the loop's waits for the reward pool: its `score` calls and
  the results of `submit`), the rest of the generate phase,
  collating and placing the batch, the step's bookkeeping, validation's host
  work, checkpoints (saving, and waiting for the asynchronous writes), metric
  lines, and the rest of the loop.

Each part's time is its own, less the parts timed inside it. Compilation
(jax.monitoring's tracing, lowering and backend-compile durations) is taken
out of whichever part it happened in and reported apart, as are the setup
(tokenizer, warm start, building the trainer) and closing; the shares are of
the loop's wall time without them. Blocking after every compute call removes
what overlap of host and device work the loop has (little: it reads a result
back right after each of those calls), so the overhead is, if anything,
overstated. Verification overlaps the next decode call (`rewards.overlap`,
rl/generation.py) in the reward pool's own thread and worker processes, which
blocking the loop's thread does not stop; only the loop's thread is timed,
so what is left of verification is the wait for scores still out. Compare
with `--config.rewards.overlap=False`, which waits for every score before
deciding the next call.

The warm start of the default config (1,500 supervised steps) is setup, not
measured, but it takes minutes on CPU: point `--config.trainer.warm_start_dir`
at the `base_policy` directory of an earlier run of the same config to reuse
its cached base policy.
"""

import collections
import contextlib
import os
import tempfile
import threading
import time
from typing import Any, Callable, Iterator
from unittest import mock

from absl import app
from absl import flags
import jax
from ml_collections import config_flags

from scalerl_jax import experiment
from scalerl_jax import sharding
from scalerl_jax import trainer as trainer_lib
from scalerl_jax.rl import batch as batch_lib

_CONFIG = config_flags.DEFINE_config_file(
    "config",
    "configs/scalerl.py",
    "Experiment config (default: the tiny_cpu ScaleRL run).",
    lock_config=True,
)
_STEPS = flags.DEFINE_integer(
    "steps", None, "RL steps; default the config's trainer.num_steps."
)
_WORKDIR = flags.DEFINE_string(
    "workdir", None, "Fresh run directory; default a temporary one."
)
_QUICK = flags.DEFINE_bool(
    "quick", False, "Tiny settings (_QUICK_FIELDS): checks the script runs."
)

# Config fields --quick sets before --steps and after --config.*.
_QUICK_FIELDS = {
    "trainer.num_steps": 2,
    "trainer.warm_start_steps": 5,
    "trainer.eval_every": 2,
    "trainer.eval_num_prompts": 8,
    "trainer.checkpoint_every": 2,
    "data.prompts_per_step": 4,
    "data.builtin_num_train": 200,
    "data.builtin_num_val": 16,
}
_COMPILE_EVENTS = (
    "/jax/core/compile/jaxpr_trace_duration",
    "/jax/core/compile/jaxpr_to_mlir_module_duration",
    "/jax/core/compile/backend_compile_duration",
)
# The sampler's jitted programs and the part each one's calls are timed as.
_SAMPLER_PROGRAMS = {
    "prepare": "decode weights",
    "start": "prefill",
    "advance": "decode",
    "take": "slot programs",
    "flags": "slot programs",
    "longest": "slot programs",
    "progress": "slot programs",
    "empty": "slot programs",
}
# Trainer methods (and methods of its members) and their parts.
_TRAINER_PARTS = {
    ("run_step",): "step",
    ("generate",): "generate",
    ("train",): "train",
    ("evaluate",): "validation",
    ("save",): "checkpoint",
    ("close",): "close",
    ("train_step",): "train step",
    ("pool", "score"): "verify",
    ("writer", "write"): "metric lines",
    ("checkpointer", "wait"): "checkpoint wait",
}
_COMPUTE = ("decode weights", "prefill", "decode", "train step")
_NOT_COUNTED = ("setup", "close")
# What each part's own time is spent on (for a part holding
# others, what is left).
_WHAT = {
    "loop": "monitors, progress line, run config",
    "step": "buffer take, batch metrics, compute meter",
    "generate": "scheduling, sampler host checks, detokenizing, grouping, buffer",
    "train": "metrics read back, counters",
    "validation": "batching, detokenizing, summarising",
    "checkpoint": "gathering state, starting the asynchronous write",
    "decode weights": "programs.prepare (weights regrouped for decoding)",
    "prefill": "programs.start",
    "decode": "programs.advance",
    "train step": "the jitted step (its batch placement apart)",
    "slot programs": "Sampler free-slot flags, progress, longest, harvest",
    "verify": "waits for the reward pool (score, submitted results)",
    "prompt pipeline": "next prompt batch",
    "collate": "batch.collate",
    "placement": "sharding.place_global of the batch",
    "metric lines": "MetricWriter.write",
    "checkpoint wait": "Checkpointer.wait",
}


class Timers:
  """Wall time of nested parts: each part's own, less its
  children and compilation."""

  def __init__(self):
    # The loop's thread: the only one timed.
    self._thread = threading.get_ident()
    self.own: dict[tuple[str, ...], float] = collections.defaultdict(float)
    self.calls: dict[tuple[str, ...], int] = collections.Counter()
    self.compile_s = 0.0
    self._path: tuple[str, ...] = ()
    # Seconds of the children of the innermost open part so far.
    self._children = [0.0]

  def on_duration(self, event: str, duration: float, **kwargs) -> None:
    """A jax.monitoring duration listener that sums compilation."""
    del kwargs
    if event in _COMPILE_EVENTS:
      self.compile_s += duration

  @contextlib.contextmanager
  def part(self, name: str) -> Iterator[None]:
    # Overlaps the loop (the pool's thread).
    if threading.get_ident() != self._thread:
      yield
      return
    outer, outer_children = self._path, self._children
    self._path, self._children = outer + (name,), [0.0]
    start, compile_start = time.perf_counter(), self.compile_s
    try:
      yield
    finally:
      total = time.perf_counter() - start - (self.compile_s - compile_start)
      self.own[self._path] += total - self._children[0]
      self.calls[self._path] += 1
      outer_children[0] += total
      self._path, self._children = outer, outer_children

  def wrap(
      self, name: str, fn: Callable[..., Any], block: bool = False
  ) -> Callable[..., Any]:
    """`fn` timed as part `name`; with `block`, up to
    `jax.block_until_ready` of its result."""

    def timed(*args, **kwargs):
      with self.part(name):
        out = fn(*args, **kwargs)
        return jax.block_until_ready(out) if block else out

    return timed


class _TimedIterator:
  """An iterator whose `next` is timed (StopIteration passes through,
  as the trainer needs)."""

  def __init__(self, timers: Timers, name: str, iterator: Iterator[Any]):
    self._timers, self._name, self._iterator = timers, name, iterator

  def __iter__(self):
    return self

  def __next__(self):
    with self._timers.part(self._name):
      return next(self._iterator)


def instrument(trainer: trainer_lib.Trainer, timers: Timers) -> None:
  """Times the trainer's phases, the sampler's programs and the
  helpers (module docstring)."""
  programs = trainer.exp.sampler.programs
  for attr, name in _SAMPLER_PROGRAMS.items():
    setattr(
        programs, attr, timers.wrap(name, getattr(programs, attr), block=True)
    )
  for (*owner, attr), name in _TRAINER_PARTS.items():
    obj = trainer
    for field in owner:
      obj = getattr(obj, field)
    setattr(
        obj, attr, timers.wrap(name, getattr(obj, attr), block=name in _COMPUTE)
    )
  runner = trainer.generation.slot_runner
  runner.prompts = _TimedIterator(timers, "prompt pipeline", runner.prompts)
  submit = trainer.pool.submit

  def submit_timing_the_wait(*args, **kwargs):
    scoring = submit(*args, **kwargs)
    scoring.result = timers.wrap("verify", scoring.result)
    return scoring

  trainer.pool.submit = submit_timing_the_wait


def run_loop(config, workdir: str, timers: Timers) -> None:
  """`trainer.train_and_evaluate` with every part timed in
  `timers` under 'loop'."""
  trainer_class = trainer_lib.Trainer

  def make_trainer(*args, **kwargs):
    with timers.part("setup"):
      trainer = trainer_class(*args, **kwargs)
    instrument(trainer, timers)
    return trainer

  jax.monitoring.register_event_duration_secs_listener(timers.on_duration)
  with mock.patch.object(
      trainer_lib, "Trainer", make_trainer
  ), mock.patch.object(
      sharding,
      "place_global",
      timers.wrap("placement", sharding.place_global, block=True),
  ), mock.patch.object(
      batch_lib, "collate", timers.wrap("collate", batch_lib.collate)
  ), timers.part(
      "loop"
  ):
    trainer_lib.train_and_evaluate(config, workdir)


def report(timers: Timers) -> str:
  """The markdown table of the parts' own times, and the overhead ratios."""

  def seconds_under(first: str) -> float:
    return sum(s for path, s in timers.own.items() if path[1:2] == (first,))

  # Paths below 'loop', without it; () is the loop's own time.
  counted = {
      path[1:]: s
      for path, s in timers.own.items()
      if not set(path[1:2]) & set(_NOT_COUNTED)
  }
  compute = {
      path: s for path, s in counted.items() if path and path[-1] in _COMPUTE
  }
  steps = max(timers.calls[("loop", "step")], 1)
  total = sum(counted.values())
  lines = ["| part | what | s | ms/step | % of loop |", "|---|---|---|---|---|"]
  outside = sorted(
      ((p, s) for p, s in counted.items() if p not in compute),
      key=lambda r: -r[1],
  )
  for path, s in sorted(compute.items()) + outside:
    kind = "model compute" if path in compute else "outside"
    lines.append(
        f"| {'/'.join(path) or 'loop'} ({kind}) | {_WHAT[(('loop',) + path)[-1]]} "
        f"| {s:.2f} | {1e3 * s / steps:.1f} | {100 * s / total:.1f}% |"
    )
  step_total = seconds_under("step")
  step_compute = sum(s for path, s in compute.items() if path[0] == "step")
  overhead = 1 - sum(compute.values()) / total
  lines += [
      "",
      f"{steps} steps, loop {total:.1f} s ({total / steps:.2f} s/step), "
      f"model compute {sum(compute.values()):.1f} s",
      f"outside model compute: {100 * overhead:.1f}% of the loop (goal: under 10%); "
      f"{100 * (1 - step_compute / step_total):.1f}% of the steps alone (generate + "
      "train, without validation, checkpoints and metric lines)",
      f"not counted: compilation {timers.compile_s:.1f} s, setup "
      f"{seconds_under('setup'):.1f} s, closing {seconds_under('close'):.1f} s",
  ]
  return "\n".join(lines)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  experiment.configure_logging()
  config = _CONFIG.value
  overrides = dict(_QUICK_FIELDS) if _QUICK.value else {}
  if _STEPS.value is not None:
    overrides["trainer.num_steps"] = _STEPS.value
  for name, value in overrides.items():
    section, field = name.split(".")
    config[section][field] = value
  t, d = config.trainer, config.data
  print(f"devices: {jax.devices()}  cpu cores: {os.cpu_count()}")
  print(
      f"config: {config.variant}, P x G = {d.prompts_per_step} x {d.generations_per_prompt}, "
      f"{config.buffer.schedule}, {t.num_steps} steps, validation every {t.eval_every} "
      f"({t.eval_num_prompts} x {t.eval_samples}), checkpoint every {t.checkpoint_every}, "
      f"rewards.overlap={config.rewards.overlap}\n"
  )
  timers = Timers()
  with contextlib.ExitStack() as stack:
    workdir = _WORKDIR.value or stack.enter_context(
        tempfile.TemporaryDirectory(prefix="loop_")
    )
    run_loop(config, workdir, timers)
  print(report(timers))


if __name__ == "__main__":
  app.run(main)
