"""A plan's committed records: resuming its sweep from them on a new machine,
and keeping them current as points land (`launch.plan_sweep --records=`).

A record is the part of a point's workdir that `launch.verdict` reads and a
repository keeps (RECORD_FILES: a few KB, no checkpoints): every finished
point's, and the gate record of a base that failed its gate. Records sit
in the runs layout of plan_verdict (`base=B/seed=S/<point>` and
`bases/warm=B/<point>`).

Seeding a workdir copies the records of finished points, so the sweep
skips them. A base's own warm-start record is copied only where nothing of
that base is left to run (all its points finished, or its gate failed):
otherwise the base is warm-started and gated again here, where the points
left need its parameters, and `check_base` holds its gate against the
record, since points paired within a base must share it.

The warm start is not reproducible across machines (the chain is learned
in a sudden drop whose step and outcome depend on the machine's float
kernels: parity_v2's base 103 passed its gate on two machines with
different parameters), so the records also keep each base that passed its
gate: its cached parameters (`bases/<fingerprint>/`, about 3 MB; the
fingerprint is in the gate record), copied back when a workdir is seeded,
with the base's warm-start record. The base is then neither trained nor
gated again, and its points resume on the parameters their recorded
partners had (each point still checks the gate as it starts).
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
from typing import Optional

from absl import logging

from scalerl_jax import warm_start
from scalerl_jax import workdir as workdir_lib
from scalerl_jax.jobs import plan_verdict
from scalerl_jax.jobs import registration
from scalerl_jax.jobs import sweep as sweep_lib
from scalerl_jax.scaling import registered_plan as plan_lib

# In the order copied: the files that mark a record (the gate, then DONE)
# last, so that whoever watches a records dir never sees a part of one.
RECORD_FILES = (
    workdir_lib.CONFIG_FILE,
    workdir_lib.METRICS_FILE,
    registration.REGISTRATION_FILE,
    warm_start.GATE_FILE,
    workdir_lib.DONE_FILE,
)
# A failed gate stops its point before it finishes; its log says why.
FAILED_GATE_FILES = (sweep_lib.LOG,) + RECORD_FILES


def _point_dirs(root: str) -> list[str]:
  """Point directories below `root`, relative to it, in a stable order."""
  patterns = ("base=*/seed=*/*", "bases/warm=*/*")
  found = []
  for pattern in patterns:
    for path in glob.glob(os.path.join(root, pattern)):
      if os.path.isdir(path):
        found.append(os.path.relpath(path, root))
  return sorted(found)


def _gate_failed(point_dir: str) -> bool:
  gate = plan_verdict.read_gate(point_dir)
  return gate is not None and not gate["passed"]


def _is_record(point_dir: str) -> bool:
  return workdir_lib.is_finished(point_dir) or _gate_failed(point_dir)


def _copy(src: str, dst: str) -> None:
  names = FAILED_GATE_FILES if _gate_failed(src) else RECORD_FILES
  os.makedirs(dst, exist_ok=True)
  for name in names:
    if os.path.exists(os.path.join(src, name)):
      shutil.copy2(os.path.join(src, name), os.path.join(dst, name))


def _base_finished(plan: plan_lib.Plan, records: str, base: int) -> bool:
  """Whether every point of every RL seed of `base` has a finished record."""
  return all(
      workdir_lib.is_finished(
          os.path.join(plan_verdict.replicate_dir(records, (base, seed)), p)
      )
      for seed in plan.rl_seeds
      for p in plan.points
  )


def _kept_bases(root: str, records: Optional[str] = None) -> list[str]:
  """`bases/<fingerprint>` below `root` for each passed gate's base whose
  parameters are there (relative to `root`); with `records`, only those
  whose gate equals the record there, if it has one (a base that differs
  is not the one its recorded points trained on)."""
  found = []
  for rel in _point_dirs(root):
    gate = plan_verdict.read_gate(os.path.join(root, rel))
    if not rel.startswith("bases" + os.sep) or not gate or not gate["passed"]:
      continue
    recorded = records and plan_verdict.read_gate(os.path.join(records, rel))
    if recorded and _gate_differs(gate, recorded):
      continue
    kept = _base_rel(gate)
    if kept and _has_base(root, kept):
      found.append(kept)
  return sorted(set(found))


def _base_rel(gate: Optional[dict]) -> Optional[str]:
  """`bases/<fingerprint>` of the base a gate record names, or None."""
  fingerprint = (gate or {}).get("fingerprint")
  return os.path.join("bases", fingerprint) if fingerprint else None


def _has_base(root: str, rel: str) -> bool:
  """Whether `root/rel` holds a cached base's parameters."""
  return os.path.isdir(os.path.join(root, rel, warm_start.PARAMS_DIR))


def _gate_differs(mine: dict, theirs: dict) -> list[str]:
  """The keys of two gate records of one base that differ."""
  return [
      key
      for key in ("passed", "measured", "warm_phases")
      if mine.get(key) != theirs.get(key)
  ]


def _copy_bases(src_root: str, dst_root: str, rels: list[str]) -> list[str]:
  """Copies the cached bases `rels` that `dst_root` lacks; returns them."""
  copied = [rel for rel in rels if not _has_base(dst_root, rel)]
  for rel in copied:
    _copy_base(os.path.join(src_root, rel), os.path.join(dst_root, rel))
  return copied


def _copy_base(src: str, dst: str) -> None:
  """Copies a cached base, its parameters last (their presence marks it)."""
  os.makedirs(dst, exist_ok=True)
  phases = os.path.join(src, warm_start.PHASES_FILE)
  if os.path.exists(phases):
    shutil.copy2(phases, os.path.join(dst, warm_start.PHASES_FILE))
  tmp = os.path.join(dst, warm_start.PARAMS_DIR + ".partial")
  shutil.rmtree(tmp, ignore_errors=True)
  shutil.copytree(os.path.join(src, warm_start.PARAMS_DIR), tmp)
  os.rename(tmp, os.path.join(dst, warm_start.PARAMS_DIR))


def seed_workdir(plan: plan_lib.Plan, records: str, workdir: str) -> list[str]:
  """Copies into `workdir` the records it lacks, and the bases the records
  keep (see the module's docstring); returns the relative paths copied."""
  kept = _kept_bases(records)
  copied = _copy_bases(records, workdir, kept)
  for rel in _point_dirs(records):
    src, dst = os.path.join(records, rel), os.path.join(workdir, rel)
    if not _is_record(src) or _is_record(dst):
      continue
    if rel.startswith("bases" + os.sep):
      base = int(rel.split(os.sep)[1].removeprefix("warm="))
      # A kept base is the recorded one: its gate record stands, rather
      # than a regating here whose floats may differ in the last bits.
      if not (
          _gate_failed(src)
          or _base_finished(plan, records, base)
          or _base_rel(plan_verdict.read_gate(src)) in kept
      ):
        continue
    _copy(src, dst)
    copied.append(rel)
  return copied


def export_records(workdir: str, records: str) -> list[str]:
  """Copies into `records` every record of `workdir` it lacks, and each base
  that passed its gate there; returns the relative paths copied. An
  existing record or base is never overwritten."""
  copied = _copy_bases(workdir, records, _kept_bases(workdir, records))
  for rel in _point_dirs(workdir):
    src, dst = os.path.join(workdir, rel), os.path.join(records, rel)
    if _is_record(src) and not _is_record(dst):
      _copy(src, dst)
      copied.append(rel)
  return copied


def commit_records(records: str, rels: list[str], plan_name: str) -> list[str]:
  """Commits each record `rels` (relative to `records`) in the repository
  holding `records`, one commit each, with nothing else of that repository's
  index; returns those git refused (to try again later)."""
  try:
    top = registration.git(records, "rev-parse", "--show-toplevel").strip()
  except subprocess.CalledProcessError as e:
    logging.warning("could not commit in %s: %s", records, e.stderr.strip())
    return list(rels)
  failed = []
  for rel in rels:
    path = os.path.join(records, rel)
    what = "the finished point's record"
    if _has_base(records, rel):
      what = "a gated base's parameters, kept to resume its points elsewhere"
    message = f"{os.path.relpath(path, top)}: {what} "
    message += f"(plan {plan_name}, launch.plan_sweep)"
    try:
      registration.git(records, "add", "--", path)
      registration.git(records, "commit", "-q", "-m", message, "--", path)
    except subprocess.CalledProcessError as e:
      logging.warning("could not commit %s: %s", path, e.stderr.strip())
      failed.append(rel)
  return failed


def inside(path: str, root: str) -> bool:
  """Whether `path` lies in the directory tree of `root`."""
  path, root = os.path.realpath(path), os.path.realpath(root)
  return os.path.commonpath([path, root]) == root


def check_base(
    plan: plan_lib.Plan, records: str, workdir: str, base: int
) -> Optional[str]:
  """None if the gate `base` reached here equals its record in `records`
  (or either is missing); else what differs, for an error."""
  mine, theirs = (
      plan_verdict.replicate_gate(
          plan_verdict.warm_dir(root, base), plan.points
      )
      for root in (workdir, records)
  )
  if mine is None or theirs is None:
    return None
  differ = _gate_differs(mine, theirs)
  if not differ:
    return None
  return (
      f"base {base} warm-started here differs from its record in {records} "
      f"in {', '.join(differ)}: here {[mine.get(k) for k in differ]}, "
      f"recorded {[theirs.get(k) for k in differ]}. Its points left to run "
      "would not share a base with the points recorded; run them all on one "
      "machine (a workdir without --records)"
  )
