"""The default recipe colocated and disaggregated, and PipelineRL-8 against
PPO-off-policy-8 on a wall-clock axis (issue 57, item 3).

  python -m benchmarks.layouts --workdir=/tmp/layouts --stage=warm
  python -m benchmarks.layouts --workdir=/tmp/layouts --stage=run
  python -m benchmarks.layouts --workdir=/tmp/layouts --stage=report \
      --json=/tmp/layouts/report.json

`warm` trains each seed's base policy (`trainer.num_steps=0`, one CPU
device), which every point of that seed then shares
(`trainer.warm_start_dir`): it is not timed, so it may run beside other work.
`run` runs every point of `POINTS` for each of `SEEDS`, one process at a
time, each with the CPU devices it asks for (`XLA_FLAGS`'s host device
count): run it with nothing else on the machine, since its wall times are
the measurement. A point whose workdir holds `DONE` is skipped; a point cut
short resumes from its checkpoint. `report` reads the runs' metrics.jsonl
and prints, per run: the step's seconds (generate + train, the mean over
steps 2-60; step 1 holds the compiles), each role's idle fraction (the mean
of `time/<role>_idle_frac`), the weights' bytes per step and per second of
transfer (`sync/bytes` over `time/sync_s`), and the validation curve; then
the two judgments below.

The judgments were registered (committed) before any of these runs started
(docs/design/disaggregated.md, "Item 3: how it is judged"):

* `same_learning`: free - colocated, paired by seed over `SEEDS`, on the
  mean of each run's last two validations (steps 50 and 60). "same" when
  two one-sided tests against the paper's +-0.02 reject at 5%; "differs"
  when the two-sided paired t test does (p < 0.05); otherwise
  "inconclusive".
* `pipeline_b_wall`: pipeline_free - ppo_k8, paired by seed, on the mean
  validation over equal wall time: the area under each run's validation
  curve (linear between evaluations) against its cumulative step seconds,
  from 0 to T = the shorter run's total of the pair, divided by T. The
  paper's claim (PipelineRL-8's higher B) agrees when the 95% paired t
  interval lies above 0, disagrees when below, else "inconclusive". Beside
  it, not judged: the same statistic on the step axis, each run's end
  point, and the step-seconds ratio.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from absl import app
from absl import flags
import numpy as np

from configs import scalerl
from scalerl_jax import workdir as workdir_lib
from scalerl_jax.metrics import busy
from scalerl_jax.metrics import compute
from scalerl_jax.metrics import rows as rows_lib
from scalerl_jax.rl import schedules
from scalerl_jax.scaling import significance


def _define_flags():
  """The command's flags, defined only when it runs, so that tests may import
  this module beside other benchmarks that define `workdir` and `json`."""
  flags.DEFINE_string("workdir", None, "Where the runs go.")
  flags.DEFINE_enum("stage", "report", ["warm", "run", "report"], "")
  flags.DEFINE_string("json", "", "report: also write it here as JSON.")
  flags.mark_flag_as_required("workdir")


SEEDS = (0, 1, 2)
# The paper's margin for "same" (PAPER.md: A within +-0.02 across seeds).
SAME_MARGIN = 0.02
ALPHA = 0.05
# Validations averaged for a run's end point (steps 50 and 60).
END_VALIDATIONS = 2


def _points() -> dict[str, tuple[int, dict[str, object], tuple[int, ...]]]:
  """name -> (CPU devices, config overrides, seeds)."""
  slots = schedules.num_slots(scalerl.get_config())
  disaggregated = {"mesh.layout": "disaggregated"}
  return {
      # The README's first command: one device, generate and train in turns.
      "colocated": (1, {}, SEEDS),
      # One device a role; the new weights swapped in at decode step 8 of
      # each step's generation (reproducible).
      "fixed8": (2, {**disaggregated, "buffer.sync_at_decode_step": 8}, (0,)),
      # One device a role; the generator never waits (PipelineRL-8).
      "pipeline_free": (
          2,
          {**disaggregated, "buffer.sync_mode": "free"},
          SEEDS,
      ),
      # One device a role; PPO-off-policy-8 on PipelineRL's slots, as
      # configs/ablations/off_policy.py pairs them: the generator decodes a
      # set with one version, then waits while the trainer takes 8 steps.
      "ppo_k8": (
          2,
          {
              **disaggregated,
              "buffer.schedule": "ppo_off_policy",
              "buffer.max_off_policy": 8,
              "sampling.num_slots": slots,
          },
          SEEDS,
      ),
  }


POINTS = _points()


def _workdir(root: str, seed: int, point: str) -> str:
  return os.path.join(root, f"seed={seed}", point)


def _launch(workdir: str, seed: int, devices: int, overrides, bases: str):
  """Runs launch.train on `workdir` to its end; its output in <workdir>.log."""
  os.makedirs(os.path.dirname(workdir), exist_ok=True)
  args = [
      sys.executable,
      "-m",
      "launch.train",
      "--config=configs/scalerl.py",
      f"--workdir={workdir}",
      f"--config.seed={seed}",
      f"--config.trainer.warm_start_dir={bases}",
  ] + [f"--config.{k}={v}" for k, v in overrides.items()]
  env = dict(os.environ)
  flags_ = [
      f
      for f in env.get("XLA_FLAGS", "").split()
      if not f.startswith("--xla_force_host_platform_device_count")
  ]
  env["XLA_FLAGS"] = " ".join(
      flags_ + [f"--xla_force_host_platform_device_count={devices}"]
  )
  t0 = time.time()
  with open(workdir + ".log", "a") as log:
    rc = subprocess.run(args, env=env, stdout=log, stderr=log).returncode
  print(f"{workdir}: exit {rc} after {time.time() - t0:.0f} s", flush=True)
  if rc:
    raise SystemExit(f"{workdir}: launch.train exited {rc}; see {workdir}.log")


def warm(root: str) -> None:
  bases = os.path.join(root, "bases")
  for seed in SEEDS:
    _launch(
        os.path.join(root, "warm", f"seed={seed}"),
        seed,
        1,
        {"trainer.num_steps": 0},
        bases,
    )


def run(root: str) -> None:
  bases = os.path.join(root, "bases")
  for seed in SEEDS:
    for point, (devices, overrides, seeds) in POINTS.items():
      wd = _workdir(root, seed, point)
      if seed not in seeds:
        continue
      if os.path.exists(os.path.join(wd, workdir_lib.DONE_FILE)):
        print(f"{wd}: finished, skipped", flush=True)
        continue
      _launch(wd, seed, devices, overrides, bases)


def summarise(workdir: str, devices: int) -> dict:
  """One run's systems numbers and its validation curve; `devices` is the
  CPU devices its point ran on (`POINTS`)."""
  all_rows = rows_lib.by_step(workdir)
  rows = [r for r in all_rows if "time/train_s" in r]
  step_s = [r["time/generate_s"] + r["time/train_s"] for r in rows]
  out = {
      "steps": len(rows),
      "devices": devices,
      "step_s_mean": float(np.mean(step_s[1:])),
      "step_s_first": float(step_s[0]),
      "step_s_total": float(np.sum(step_s)),
      "generate_s_mean": float(
          np.mean([r["time/generate_s"] for r in rows[1:]])
      ),
      "train_s_mean": float(np.mean([r["time/train_s"] for r in rows[1:]])),
  }
  for role in busy.ROLES:
    key = f"time/{role}_idle_frac"
    out[f"{role}_idle_frac"] = float(np.mean([r[key] for r in rows[1:]]))
  sync_bytes = sum(r.get("sync/bytes", 0.0) for r in rows)
  sync_s = sum(r.get("time/sync_s", 0.0) for r in rows)
  out["sync_bytes_per_step"] = sync_bytes / len(rows)
  out["sync_s_per_step"] = sync_s / len(rows)
  out["sync_bytes_per_s"] = sync_bytes / sync_s if sync_s else 0.0
  # The compute meter's device-seconds are the steps' generate + train
  # seconds times the devices: per device, the step-seconds so far.
  val = [r for r in all_rows if "val/mean_at_k" in r]
  out["val_steps"] = [r["step"] for r in val]
  out["val"] = [r["val/mean_at_k"] for r in val]
  out["val_wall_s"] = [
      r.get(compute.DEVICE_SECONDS_KEY, 0.0) / devices for r in val
  ]
  out["end"] = float(np.mean(out["val"][-END_VALIDATIONS:]))
  return out


def mean_until(x, y, t: float) -> float:
  """Mean of the piecewise-linear curve y(x) over [x[0], t], t <= x[-1]."""
  x, y = np.asarray(x, float), np.asarray(y, float)
  if not x[0] < t <= x[-1]:
    raise ValueError(f"t={t} outside ({x[0]}, {x[-1]}]")
  keep = x < t
  xs = np.append(x[keep], t)
  ys = np.append(y[keep], np.interp(t, x, y))
  area = float(np.sum((xs[1:] - xs[:-1]) * (ys[1:] + ys[:-1]) / 2))
  return area / (t - x[0])


def _test(d: list[float]) -> dict:
  t = significance.paired_t(d, ALPHA)
  return {
      "n": t.n,
      "mean": t.mean,
      "ci": list(t.ci),
      "p": t.p,
      "tost_p": significance.tost(d, SAME_MARGIN),
  }


def judge(summaries: dict) -> dict:
  """The two registered judgments (module docstring) from run summaries
  keyed (seed, point)."""

  def pairs(first, second):
    return [
        s for s in SEEDS if (s, first) in summaries and (s, second) in summaries
    ]

  out = {}
  seeds = pairs("pipeline_free", "colocated")
  if len(seeds) >= 2:
    d = [
        summaries[(s, "pipeline_free")]["end"]
        - summaries[(s, "colocated")]["end"]
        for s in seeds
    ]
    test = _test(d)
    test["verdict"] = (
        "same"
        if test["tost_p"] < ALPHA
        else "differs"
        if test["p"] < ALPHA
        else "inconclusive"
    )
    out["same_learning"] = {"seeds": seeds, "differences": d, **test}
  seeds = pairs("pipeline_free", "ppo_k8")
  if len(seeds) >= 2:
    rows = {}
    for axis in ("val_wall_s", "val_steps"):
      d = []
      for s in seeds:
        a, b = summaries[(s, "pipeline_free")], summaries[(s, "ppo_k8")]
        t = min(a[axis][-1], b[axis][-1])
        d.append(
            mean_until(a[axis], a["val"], t) - mean_until(b[axis], b["val"], t)
        )
      rows[axis] = {"differences": d, **_test(d)}
    wall = rows["val_wall_s"]
    lo, hi = wall["ci"]
    wall["verdict"] = (
        "agrees" if lo > 0 else "disagrees" if hi < 0 else ("inconclusive")
    )
    out["pipeline_b_wall"] = {
        "seeds": seeds,
        "wall": wall,
        "steps": rows["val_steps"],
        "step_s_ratio_ppo_over_pipeline": [
            summaries[(s, "ppo_k8")]["step_s_mean"]
            / summaries[(s, "pipeline_free")]["step_s_mean"]
            for s in seeds
        ],
    }
  return out


def report(root: str) -> dict:
  summaries = {}
  for seed in SEEDS:
    for point, (devices, _, seeds) in POINTS.items():
      wd = _workdir(root, seed, point)
      if seed in seeds and os.path.exists(
          os.path.join(wd, workdir_lib.DONE_FILE)
      ):
        summaries[(seed, point)] = summarise(wd, devices)
  print(
      f"{'seed':>4} {'point':<14} {'dev':>3} {'step s':>7} {'gen s':>6} "
      f"{'train s':>7} {'gen idle':>8} {'tr idle':>7} {'MB/step':>8} "
      f"{'MB/s':>7} {'end':>6}  validation"
  )
  for (seed, point), s in summaries.items():
    print(
        f"{seed:>4} {point:<14} {s['devices']:>3} {s['step_s_mean']:7.3f} "
        f"{s['generate_s_mean']:6.3f} {s['train_s_mean']:7.3f} "
        f"{s['generator_idle_frac']:8.3f} {s['trainer_idle_frac']:7.3f} "
        f"{s['sync_bytes_per_step'] / 1e6:8.3f} "
        f"{s['sync_bytes_per_s'] / 1e6:7.1f} {s['end']:6.3f}  "
        + " ".join(f"{v:.3f}" for v in s["val"])
    )
  verdicts = judge(summaries)
  print(json.dumps(verdicts, indent=1))
  return {
      "runs": {f"seed={k[0]}/{k[1]}": v for k, v in summaries.items()},
      "judgments": verdicts,
  }


def main(argv):
  del argv
  f = flags.FLAGS
  root = os.path.abspath(f.workdir)
  if f.stage == "warm":
    warm(root)
  elif f.stage == "run":
    run(root)
  else:
    out = report(root)
    if f.json:
      with open(f.json, "w") as out_file:
        json.dump(out, out_file, indent=1)


if __name__ == "__main__":
  _define_flags()
  app.run(main)
