"""Runs a registered plan's replicates in order: each base's RL seeds, one
`launch.sweep` each, a base that fails its gate replaced by the next spare.

  python -m launch.plan_sweep --plan=configs/plans/parity_v1.py \
      --workdir=/tmp/plans/parity_v1 --parallel=2

Runs land in `<workdir>/base=B/seed=S/<point>` (what `launch.verdict`
reads), bases share `<workdir>/bases` as their warm-start cache. Finished
points are skipped, so rerunning resumes; --replicates=N stops after the
first N replicates (a session's share of a long plan).

On a new machine, resume from the records a repository keeps, running from
a clean worktree (records kept inside the checkout the runs start from
would leave it with uncommitted changes, so this refuses them):

  git worktree add --detach /tmp/plan_code HEAD && cd /tmp/plan_code
  python -m launch.plan_sweep --plan=configs/plans/parity_v3.py \
      --workdir=/tmp/plans/parity_v3 \
      --records=$OLDPWD/docs/runs/plans/parity_v3 --commit

--records seeds the workdir with the finished points recorded there, and
copies each point's record back as it lands (every 30 s and after each
replicate; --commit: and commits it); a base with points left is
warm-started again here and must reach its recorded gate
(scalerl_jax/jobs/plan_records.py).
"""

import os
import subprocess
import sys
import threading

from absl import app
from absl import flags

from launch import REPO_ROOT
from scalerl_jax.jobs import plan_records
from scalerl_jax.jobs import plan_verdict
from scalerl_jax.jobs import registration

_PLAN = flags.DEFINE_string("plan", None, "Plan file.", required=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Runs root.", required=True)
_PARALLEL = flags.DEFINE_integer("parallel", 1, "Points run at once.")
_REPLICATES = flags.DEFINE_integer(
    "replicates", 0, "Stop after this many replicates (0: all)."
)
_RECORDS = flags.DEFINE_string(
    "records",
    None,
    "Directory of the plan's kept records: seeds the workdir, and receives "
    "each finished point's record as it lands.",
)
_COMMIT = flags.DEFINE_bool(
    "commit",
    False,
    "Commit each record kept in --records, as it lands, in the repository "
    "that holds --records (one commit a point, nothing else of its index).",
)
# Seconds between copies of new records into --records while points run.
EXPORT_EVERY_S = 30


def _sweep_argv(base, workdir, sets, parallel, points=()):
  argv = [
      sys.executable,
      "-m",
      "launch.sweep",
      f"--sweep={_PLAN.value}:base={base}",
      f"--workdir={workdir}",
      f"--parallel={parallel}",
  ] + [f"--set={s}" for s in sets]
  return argv + ([f"--points={','.join(points)}"] if points else [])


def _gate_failed(replicate_dir: str, points) -> bool:
  gate = plan_verdict.replicate_gate(replicate_dir, points)
  return gate is not None and not gate["passed"]


class _Keeper:
  """Copies new records into --records and, with --commit, commits them
  (those git refuses are tried again at the next copy)."""

  def __init__(self, plan, root, records, commit):
    self.plan = plan
    self.root = root
    self.records = records
    self.commit = commit
    self.uncommitted = []
    self.lock = threading.Lock()

  def keep(self):
    with self.lock:
      new = plan_records.export_records(self.root, self.records)
      for rel in new:
        print(
            f"launch.plan_sweep: record kept: {self.records}/{rel}", flush=True
        )
      if self.commit:
        self.uncommitted = plan_records.commit_records(
            self.records, self.uncommitted + new, self.plan.name
        )

  def keep_every(self, seconds, stop):
    while not stop.wait(seconds):
      self.keep()


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  plan = registration.load_plan_or_exit(
      _PLAN.value, "launch.plan_sweep", REPO_ROOT
  )
  root = os.path.abspath(_WORKDIR.value)
  records = _RECORDS.value and os.path.abspath(_RECORDS.value)
  if not records:
    if _COMMIT.value:
      raise app.UsageError("--commit commits what --records keeps: set both")
    return _run(plan, root, None)
  if records == root:
    raise app.UsageError(
        "--records must differ from --workdir: records are kept apart from "
        "the checkpoints and caches a workdir holds"
    )
  if not os.path.isdir(records):
    raise app.UsageError(f"--records={records}: no such directory")
  if plan_records.inside(records, REPO_ROOT):
    raise app.UsageError(
        f"--records={records} lies in the checkout the runs start from "
        f"({REPO_ROOT}): records kept there leave it with uncommitted "
        "changes, and a run started from such a checkout never counts "
        "(docs/design/verdicts.md). Run from a clean worktree of your "
        "checkout (git worktree add --detach /tmp/plan_code HEAD) and keep "
        "the records in your checkout"
    )
  seeded = plan_records.seed_workdir(plan, records, root)
  print(
      f"launch.plan_sweep: {len(seeded)} finished records from {records}",
      flush=True,
  )
  keeper = _Keeper(plan, root, records, _COMMIT.value)
  stop = threading.Event()
  thread = threading.Thread(
      target=keeper.keep_every, args=(EXPORT_EVERY_S, stop), daemon=True
  )
  thread.start()
  try:
    return _run(plan, root, keeper)
  finally:
    stop.set()
    thread.join()
    keeper.keep()


def _run(plan, root, keeper):
  """The plan's bases in order, each base's RL seeds one sweep each."""
  records = keeper and keeper.records
  cache = f"trainer.warm_start_dir={os.path.join(root, 'bases')}"
  queue, spares, done = list(plan.bases), list(plan.spare_bases), 0
  unresumable = []
  while queue:
    base = queue.pop(0)
    # The base alone first (its warm start, gate and step-0 validation), so
    # that the points running in parallel do not each train it.
    warm_dir = plan_verdict.warm_dir(root, base)
    if _gate_failed(warm_dir, plan.points):
      print(f"launch.plan_sweep: base {base}: failed its gate", flush=True)
    else:
      print(f"launch.plan_sweep: base {base}: warm start", flush=True)
      subprocess.run(
          _sweep_argv(
              base, warm_dir, [cache, "trainer.num_steps=0"], 1, plan.points[:1]
          ),
          cwd=REPO_ROOT,
      )
    differs = records and plan_records.check_base(plan, records, root, base)
    if differs:
      # Not a gate failure: no spare replaces it. Its recorded points stay;
      # those left are lost to the plan, and the other bases go on.
      print(f"launch.plan_sweep: skipped: {differs}", flush=True)
      unresumable.append(base)
      continue
    for seed in plan.rl_seeds:
      if _REPLICATES.value and done >= _REPLICATES.value:
        return
      rep_dir = plan_verdict.replicate_dir(root, (base, seed))
      if _gate_failed(warm_dir, plan.points):
        rep_dir = warm_dir
      else:
        print(f"launch.plan_sweep: base {base}, seed {seed}", flush=True)
        code = subprocess.run(
            _sweep_argv(
                base, rep_dir, [f"seed={seed}", cache], _PARALLEL.value
            ),
            cwd=REPO_ROOT,
        ).returncode
        done += 1
        if keeper:
          keeper.keep()
      if _gate_failed(rep_dir, plan.points):
        if not spares:
          raise SystemExit(
              f"launch.plan_sweep: base {base} failed its gate and no spare "
              "is left"
          )
        queue.append(spares.pop(0))
        print(
            f"launch.plan_sweep: base {base} failed its gate; spare "
            f"{queue[-1]} replaces it",
            flush=True,
        )
        break
      if code:
        raise SystemExit(
            f"launch.plan_sweep: base {base}, seed {seed} did not finish "
            f"(exit code {code}); rerun to resume"
        )
  if unresumable:
    raise SystemExit(
        f"launch.plan_sweep: the points left of bases {unresumable} were not "
        "run: each base, warm-started here, differs from its record (above)"
    )


if __name__ == "__main__":
  app.run(main)
