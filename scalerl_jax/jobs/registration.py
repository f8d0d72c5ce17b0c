"""Registration: was each claim of a plan committed before its runs started?

A plan's sweep writes `REGISTRATION_FILE` into every point's workdir when it
first launches it: the plan file's path and sha256, the checkout's git HEAD
and whether it had uncommitted changes, and the time. A claim (identified by
`Plan.claim_identity`: the claim and everything that decides it) is
registered at the first commit of the plan file whose PLAN holds that
identity. A claim is confirmatory only if every run it reads started, from a
clean checkout that contains that commit, after that commit's time; a claim
added or changed after any of its runs started is exploratory, whatever it
shows.

Design: docs/design/verdicts.md.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from typing import Mapping, Optional, Sequence

from scalerl_jax import workdir as workdir_lib
from scalerl_jax.scaling import registered_plan as plan_lib

REGISTRATION_FILE = "registration.json"


def git(repo: str, *args: str) -> str:
  """`git -C repo *args`'s output; raises CalledProcessError if git fails."""
  return subprocess.run(
      ["git", "-C", repo, *args], check=True, capture_output=True, text=True
  ).stdout


def file_sha256(path: str) -> str:
  with open(path, "rb") as f:
    return hashlib.sha256(f.read()).hexdigest()


def load_plan(path: str) -> plan_lib.Plan:
  """The PLAN of the plan file at `path`. ValueError when it has none."""
  spec = importlib.util.spec_from_file_location(
      "_plan_" + file_sha256(path)[:12], path
  )
  module = importlib.util.module_from_spec(spec)
  # Loading must leave no __pycache__ beside the plan: an untracked file
  # there would make the next run's checkout read as dirty.
  writes_bytecode = sys.dont_write_bytecode
  sys.dont_write_bytecode = True
  try:
    spec.loader.exec_module(module)
  finally:
    sys.dont_write_bytecode = writes_bytecode
  found = getattr(module, "PLAN", None)
  if not isinstance(found, plan_lib.Plan):
    raise ValueError(
        f"{path}: a plan file defines PLAN, a scaling.registered_plan.Plan"
    )
  return found


def plan_in_checkout(plan_path: str, repo: str) -> str:
  """The plan file's path inside the git checkout `repo`; ValueError when it
  lies outside it (a claim registers at a commit of the code that runs it)."""
  rel = os.path.relpath(os.path.abspath(plan_path), os.path.abspath(repo))
  if rel.startswith(os.pardir + os.sep) or os.path.isabs(rel):
    raise ValueError(
        f"{plan_path} is outside the checkout {repo}: a plan is registered "
        "by the commits of the checkout that runs it; move it under configs/"
    )
  return rel


def load_plan_or_exit(path: str, program: str, repo: str) -> plan_lib.Plan:
  """`load_plan(path)` for a launcher named `program` run from the checkout
  `repo`: a plan file that is missing, unreadable, outside the checkout or
  defines no PLAN exits with a message naming it."""
  try:
    plan_in_checkout(path, repo)
    return load_plan(path)
  except (OSError, ValueError) as e:
    raise SystemExit(f"{program}: {e}") from None


def defines_plan(sweep_path: str) -> bool:
  """Whether the sweep file at `sweep_path` is a plan (defines PLAN)."""
  try:
    load_plan(sweep_path)
  except ValueError:
    return False
  return True


def record_start(workdir: str, plan_path: str, repo: str) -> Optional[dict]:
  """Writes `<workdir>/REGISTRATION_FILE` unless it exists (a resumed point
  keeps its first start) or the point has finished without one (its start
  is unknown: it never counts); returns the record, or None."""
  path = os.path.join(workdir, REGISTRATION_FILE)
  if os.path.exists(path):
    with open(path) as f:
      return json.load(f)
  if workdir_lib.is_finished(workdir):
    return None
  rel = plan_in_checkout(plan_path, repo)
  record = {
      "plan": rel,
      "plan_sha256": file_sha256(plan_path),
      "git_head": git(repo, "rev-parse", "HEAD").strip(),
      "git_dirty": bool(git(repo, "status", "--porcelain", "--", ".").strip()),
      "started_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(),
  }
  os.makedirs(workdir, exist_ok=True)
  with open(path, "w") as f:
    json.dump(record, f, indent=1, sort_keys=True)
  return record


@dataclasses.dataclass(frozen=True)
class Registered:
  """Where a claim's identity first appears in the plan file's history."""

  commit: Optional[str]  # None: never committed.
  time: Optional[datetime.datetime]


def claim_registrations(plan_path: str, repo: str) -> dict[str, Registered]:
  """identity -> its first commit, over every committed version of the
  plan file (oldest first)."""
  rel = plan_in_checkout(plan_path, repo)
  log = git(repo, "log", "--reverse", "--format=%H %cI", "--", rel)
  out: dict[str, Registered] = {}
  for line in log.splitlines():
    commit, when = line.split()
    text = git(repo, "show", f"{commit}:{rel}")
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
      f.write(text)
    try:
      version = load_plan(f.name)
    except Exception:  # An old version that no longer loads registers nothing.
      continue
    finally:
      os.unlink(f.name)
    for claim in version.claims:
      identity = version.claim_identity(claim)
      out.setdefault(
          identity,
          Registered(commit, datetime.datetime.fromisoformat(when)),
      )
  return out


def run_counts(
    record: Mapping[str, object], registered: Registered, repo: str
) -> tuple[bool, str]:
  """Whether a run (its REGISTRATION_FILE record) counts for a claim
  registered at `registered`, and why not."""
  if registered.commit is None:
    return False, "the claim was never committed"
  if "started_utc" not in record:
    return False, f"has no {REGISTRATION_FILE} (its start is unknown)"
  if record.get("git_dirty"):
    return False, "started from a checkout with uncommitted changes"
  started = datetime.datetime.fromisoformat(str(record["started_utc"]))
  if started <= registered.time:
    return False, f"started {started:%Y-%m-%d %H:%M} before the claim's commit"
  ancestor = subprocess.run(
      [
          "git",
          "-C",
          repo,
          "merge-base",
          "--is-ancestor",
          registered.commit,
          str(record["git_head"]),
      ],
      capture_output=True,
  )
  if ancestor.returncode != 0:
    return False, "started from code without the claim's commit"
  return True, ""


def classify(
    plan: plan_lib.Plan,
    plan_path: str,
    records: Mapping[str, Sequence[Mapping[str, object]]],
    repo: str,
) -> dict[str, tuple[bool, str, Registered]]:
  """claim name -> (confirmatory, why not, registration). `records` maps a
  point to the REGISTRATION_FILE records of its runs."""
  registrations = claim_registrations(plan_path, repo)
  out = {}
  for claim in plan.claims:
    reg = registrations.get(plan.claim_identity(claim), Registered(None, None))
    why = "" if claim.confirmatory else "registered as exploratory"
    if claim.confirmatory:
      for point in (claim.first, claim.second):
        if not records.get(point):
          continue
        for record in records[point]:
          ok, reason = run_counts(record, reg, repo)
          if not ok:
            why = f"a run of {point} {reason}"
            break
        if why:
          break
      if reg.commit is None:
        why = "the claim as it stands was never committed"
    out[claim.name] = (not why, why, reg)
  return out
