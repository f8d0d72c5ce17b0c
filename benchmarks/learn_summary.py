"""One line per step of a run: where its time went, its MFU, and what it
learned; the validation curve's rise against its noise on top.

  python -m benchmarks.learn_summary --workdir=/tmp/gpu_learn \
      --started=1767000000.0 --json=/tmp/out/learn_summary.json

Read from the run's records alone (benchmarks/gpu_speed.sh's `learn` stage):
`metrics.jsonl` for the phases' seconds (`time/generate_s`, `time/train_s`),
the compute meter's cumulative `compute/flops` and `compute/device_seconds`,
rewards, `train/no_signal` and validation; the TensorBoard event files for
the wall clock of each step's write, which the JSON lines do not carry.

* wall: from the previous step's write to this one's. It holds the phases,
  the host's work between them (collation, metrics, the monitors) and, on a
  validation step, the validation; the final checkpoint is after the last.
* host: wall less generate and train; on a validation step that includes
  the validation (the totals list those steps' apart).
* MFU: the step's FLOPs as the meter counts them (generation and training)
  over its device-seconds (generate + train) at `--chip`'s dense bfloat16
  peak per device;
  wall MFU: the same FLOPs over the step's wall.
* noise: the validations' own sampling standard errors
  (`val/mean_at_k_stderr`), combined for the difference of the first and
  the last: the rise counts if it exceeds twice that.
"""

import glob
import json
import math
import os
import struct

from absl import app
from absl import flags
from tensorboardX.proto import event_pb2

from scalerl_jax import workdir as workdir_lib
from scalerl_jax.jobs.planner import accelerators
from scalerl_jax.metrics import rows as rows_lib

_WORKDIR = flags.DEFINE_string("workdir", None, "The run's workdir.")
_STARTED = flags.DEFINE_float(
    "started", 0.0, "Unix time the run's process started; 0 = unknown."
)
_CHIP = flags.DEFINE_enum(
    "chip",
    "h100",
    list(accelerators.ACCELERATORS),
    "The chip whose dense bfloat16 peak MFU is counted against.",
)
_JSON = flags.DEFINE_string("json", "", "Write the summary as JSON here.")


def write_times(tb_dir: str) -> dict[int, float]:
  """Step -> the earliest wall time of its scalars in `tb_dir`'s event files.

  Each file is a sequence of records: an 8-byte little-endian length, its
  4-byte checksum, the serialized Event, the Event's 4-byte checksum.
  """
  times: dict[int, float] = {}
  for path in sorted(glob.glob(os.path.join(tb_dir, "events.out.tfevents.*"))):
    with open(path, "rb") as f:
      data = f.read()
    offset = 0
    while offset + 12 <= len(data):
      (length,) = struct.unpack_from("<Q", data, offset)
      record = data[offset + 12 : offset + 12 + length]
      offset += 12 + length + 4
      event = event_pb2.Event.FromString(record)
      if event.summary.value:
        times[event.step] = min(
            times.get(event.step, math.inf), event.wall_time
        )
  return times


def step_rows(
    metrics: list[dict], times: dict[int, float], peak_flops: float
) -> list[dict]:
  """One summary row per RL step (module docstring)."""
  rows, before = [], None
  for line in metrics:
    if before is not None and "time/train_s" in line:
      gen, train = line["time/generate_s"], line["time/train_s"]
      flops = line["compute/flops"] - before["compute/flops"]
      device_s = (
          line["compute/device_seconds"] - before["compute/device_seconds"]
      )
      wall = times.get(line["step"], math.nan) - times.get(
          before["step"], math.nan
      )
      devices = device_s / (gen + train) if gen + train else 1.0
      rows.append(
          {
              "step": line["step"],
              "wall_s": wall,
              "generate_s": gen,
              "train_s": train,
              "host_s": wall - gen - train,
              "mfu": flops / device_s / peak_flops if device_s else math.nan,
              "wall_mfu": flops / (wall * devices * peak_flops),
              "reward": line["train/reward_mean"],
              "no_signal": line["train/no_signal"],
              "updated": line["train/l2_updates"] > 0,
              "val": line.get("val/mean_at_k"),
              "val_stderr": line.get("val/mean_at_k_stderr"),
          }
      )
    before = line
  return rows


def verdict(metrics: list[dict]) -> dict:
  """The validation curve's first and last points, rise and noise."""
  vals = [m for m in metrics if "val/mean_at_k" in m]
  if len(vals) < 2:
    return {"validations": len(vals)}
  first, last = vals[0], vals[-1]
  noise = math.hypot(
      first["val/mean_at_k_stderr"], last["val/mean_at_k_stderr"]
  )
  rise = last["val/mean_at_k"] - first["val/mean_at_k"]
  return {
      "validations": len(vals),
      "curve": {m["step"]: round(m["val/mean_at_k"], 4) for m in vals},
      "rise": rise,
      "noise": noise,
      "rise_over_noise": rise / noise if noise else math.inf,
      "learned": rise > 2 * noise,
  }


def summarize(workdir: str, started: float, peak_tflops: float) -> dict:
  """The run's summary: per step, totals and the verdict."""
  metrics = rows_lib.by_step(workdir)
  times = write_times(os.path.join(workdir, workdir_lib.TB_DIR))
  steps = step_rows(metrics, times, peak_tflops * 1e12)
  total = {
      name: sum(row[name] for row in steps)
      for name in ("wall_s", "generate_s", "train_s")
  }
  total["host_s"] = sum(r["host_s"] for r in steps if r["val"] is None)
  total["host_and_validation_s"] = sum(
      r["host_s"] for r in steps if r["val"] is not None
  )
  return {
      "workdir": workdir,
      # Process start to step 0's write: imports, the warm start with its
      # compiles, the sampler's first compiles and step 0's validation.
      "setup_s": times.get(0, math.nan) - started if started else None,
      "steps": len(steps),
      "rewarded_steps": sum(row["reward"] > 0 for row in steps),
      "no_signal_steps": sum(row["no_signal"] > 0 for row in steps),
      "updated_steps": sum(row["updated"] for row in steps),
      "total_s": total,
      "verdict": verdict(metrics),
      "per_step": steps,
  }


def table(summary: dict) -> str:
  """The summary as markdown: the answer on top, then one row per step."""
  v, t = summary["verdict"], summary["total_s"]
  setup = summary["setup_s"]
  lines = [
      f"steps {summary['steps']}, setup "
      f"{'unknown' if setup is None else f'{setup:.1f} s'}, rewarded "
      f"{summary['rewarded_steps']}, updated {summary['updated_steps']}, "
      f"no signal {summary['no_signal_steps']}",
      "steps' wall {wall_s:.1f} s: generate {generate_s:.1f}, train "
      "{train_s:.1f}, host {host_s:.1f}, host on validation steps with the "
      "validations {host_and_validation_s:.1f}".format(**t),
  ]
  if "rise" in v:
    lines.append(
        f"validation {v['curve']}: rise {v['rise']:+.3f}, noise "
        f"{v['noise']:.4f} ({v['rise_over_noise']:.1f}x), learned: "
        f"{v['learned']}"
    )
  lines += [
      "",
      "| step | wall s | generate s | train s | host (+ val) s | MFU | wall MFU "
      "| reward | no signal | val |",
      "|---|---|---|---|---|---|---|---|---|---|",
  ]
  for r in summary["per_step"]:
    val = "" if r["val"] is None else f"{r['val']:.3f}"
    lines.append(
        f"| {r['step']} | {r['wall_s']:.2f} | {r['generate_s']:.2f} | "
        f"{r['train_s']:.2f} | {r['host_s']:.2f} | {r['mfu']:.2e} | "
        f"{r['wall_mfu']:.2e} | {r['reward']:.3f} | {r['no_signal']:.0f} | "
        f"{val} |"
    )
  return "\n".join(lines)


def main(argv):
  del argv
  summary = summarize(
      _WORKDIR.value,
      _STARTED.value,
      accelerators.ACCELERATORS[_CHIP.value].peak_flops / 1e12,
  )
  print(table(summary))
  if _JSON.value:
    with open(_JSON.value, "w") as f:
      json.dump(summary, f, indent=1)


if __name__ == "__main__":
  flags.mark_flag_as_required("workdir")
  app.run(main)
