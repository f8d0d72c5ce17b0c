"""Tests of jobs/plan_records.py on the committed records of parity_v3 and
parity_v1 (docs/runs/plans): which records seed a new workdir, which come
back as points land, and the check that a base warm-started again equals
its record; and of launch/plan_sweep.py's --records flag."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import orbax.checkpoint as ocp
import pytest

from configs.plans import parity_v1
from configs.plans import parity_v3
from scalerl_jax import warm_start
from scalerl_jax.jobs import plan_records
from tests import git_helpers

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
V3 = os.path.join(REPO, "docs", "runs", "plans", "parity_v3")
V1 = os.path.join(REPO, "docs", "runs", "plans", "parity_v1")


def _take(src_root, dst_root, rel):
  shutil.copytree(os.path.join(src_root, rel), os.path.join(dst_root, rel))


@pytest.fixture
def records(tmp_path):
  """Base 301 finished (its warm record and both seeds' 3 points), base
  302 half finished (its warm record and seed 0's 3 points)."""
  root = str(tmp_path / "records")
  for rel in ("bases/warm=301", "base=301", "bases/warm=302"):
    _take(V3, root, rel)
  _take(V3, root, "base=302/seed=0")
  return root


def _listing(root):
  return sorted(
      os.path.relpath(os.path.join(d, f), root)
      for d, _, files in os.walk(root)
      for f in files
  )


def test_seed_copies_finished_points_and_only_finished_bases(records, tmp_path):
  work = str(tmp_path / "work")
  seeded = plan_records.seed_workdir(parity_v3.PLAN, records, work)
  points = [
      f"base=301/seed={s}/{p}" for s in (0, 1) for p in parity_v3.PLAN.points
  ]
  points += [f"base=302/seed=0/{p}" for p in parity_v3.PLAN.points]
  # Base 302 still has seed 1 to run: it is warm-started again here.
  assert seeded == sorted(points + ["bases/warm=301/scalerl"])
  assert _listing(work) == sorted(
      os.path.join(rel, name)
      for rel in seeded
      for name in plan_records.RECORD_FILES
  )
  # Seeding again copies nothing; a workdir's own finished point stays.
  assert not plan_records.seed_workdir(parity_v3.PLAN, records, work)


def test_seed_leaves_an_unfinished_point_and_keeps_the_workdirs(
    records, tmp_path
):
  os.remove(os.path.join(records, "base=302", "seed=0", "gspo", "DONE"))
  work = str(tmp_path / "work")
  mine = os.path.join(work, "base=301", "seed=0", "dapo")
  os.makedirs(mine)
  with open(os.path.join(mine, "DONE"), "w") as f:
    f.write("here\n")
  seeded = plan_records.seed_workdir(parity_v3.PLAN, records, work)
  assert "base=302/seed=0/gspo" not in seeded
  assert "base=301/seed=0/dapo" not in seeded
  assert len(seeded) == 8
  with open(os.path.join(mine, "DONE")) as f:
    assert f.read() == "here\n"


def test_a_failed_gate_is_seeded_with_its_log(tmp_path):
  records, work = str(tmp_path / "records"), str(tmp_path / "work")
  _take(V1, records, "bases/warm=104")
  seeded = plan_records.seed_workdir(parity_v1.PLAN, records, work)
  assert seeded == ["bases/warm=104/scalerl"]
  assert sorted(os.listdir(os.path.join(work, seeded[0]))) == [
      "base_gate.json",
      "log.txt",
      "registration.json",
  ]


def test_export_copies_new_records_and_never_overwrites(records, tmp_path):
  shutil.rmtree(os.path.join(records, "base=301", "seed=1"))
  work = str(tmp_path / "work")
  _take(V3, work, "base=301/seed=1")
  # One point still running: a checkpoint, no DONE.
  running = os.path.join(work, "base=301", "seed=1", "gspo")
  os.remove(os.path.join(running, "DONE"))
  os.makedirs(os.path.join(running, "checkpoints"))
  # One point the records already hold, changed here.
  _take(V3, work, "base=301/seed=0/scalerl")
  with open(
      os.path.join(work, "base=301/seed=0/scalerl/metrics.jsonl"), "a"
  ) as f:
    f.write("{}\n")
  new = ["base=301/seed=1/dapo", "base=301/seed=1/scalerl"]
  assert plan_records.export_records(work, records) == new
  for rel in new:
    assert sorted(os.listdir(os.path.join(records, rel))) == sorted(
        plan_records.RECORD_FILES
    )
  for rel in new + ["base=301/seed=0/scalerl"]:
    with open(os.path.join(V3, rel, "metrics.jsonl")) as f:
      committed = f.read()
    with open(os.path.join(records, rel, "metrics.jsonl")) as f:
      assert f.read() == committed
  assert not os.path.exists(os.path.join(records, "base=301/seed=1/gspo"))
  assert not plan_records.export_records(work, records)


def test_check_base_names_what_differs(records, tmp_path):
  work = str(tmp_path / "work")
  assert (
      plan_records.check_base(parity_v3.PLAN, records, work, 302) is None
  )  # none here yet
  _take(records, work, "bases/warm=302")
  assert plan_records.check_base(parity_v3.PLAN, records, work, 302) is None
  path = os.path.join(work, "bases", "warm=302", "scalerl", "base_gate.json")
  with open(path) as f:
    gate = json.load(f)
  gate["measured"]["p_chain/2"] += 1e-9
  with open(path, "w") as f:
    json.dump(gate, f)
  message = plan_records.check_base(parity_v3.PLAN, records, work, 302)
  assert "base 302" in message and "in measured:" in message
  assert "passed" not in message.split(":")[0]


def _plan_sweep(*args):
  """launch.plan_sweep's refusal; were it to start the plan instead, the
  timeout ends the test."""
  return subprocess.run(
      [
          sys.executable,
          "-m",
          "launch.plan_sweep",
          "--plan=configs/plans/parity_v3.py",
          *args,
      ],
      cwd=REPO,
      capture_output=True,
      text=True,
      timeout=300,
  )


def test_plan_sweep_refuses_records_equal_to_workdir(tmp_path):
  out = _plan_sweep(f"--workdir={tmp_path}", f"--records={tmp_path}")
  assert out.returncode != 0
  assert "--records must differ from --workdir" in out.stderr


def test_plan_sweep_refuses_records_in_its_own_checkout(tmp_path):
  out = _plan_sweep(
      f"--workdir={tmp_path}", "--records=docs/runs/plans/parity_v3"
  )
  assert out.returncode != 0
  assert "lies in the checkout the runs start from" in out.stderr


def test_plan_sweep_refuses_commit_without_records(tmp_path):
  out = _plan_sweep(f"--workdir={tmp_path}", "--commit")
  assert out.returncode != 0
  assert "--commit commits what --records keeps" in out.stderr


def test_commit_records_commits_each_record_alone(tmp_path):
  repo = tmp_path / "repo"
  git_helpers.init(repo)
  kept = str(repo / "kept")
  (repo / "other.txt").write_text("staged, not the sweep's\n")
  git_helpers.git(repo, "add", "other.txt")
  _take(V3, str(tmp_path / "work"), "base=301/seed=1")
  new = plan_records.export_records(str(tmp_path / "work"), kept)
  assert plan_records.commit_records(kept, new, "parity_v3") == []
  log = git_helpers.git(repo, "log", "--format=%s", "--name-only")
  for rel in new:
    assert f"kept/{rel}: the finished point's record (plan parity_v3" in log
  assert "other.txt" not in log
  assert len(new) == 3  # seed 1's scalerl, dapo and gspo, a commit each
  assert len(git_helpers.git(repo, "log", "--format=%H").split()) == 3
  assert git_helpers.git(repo, "status", "--porcelain") == "A  other.txt"


def test_commit_records_outside_a_repository_keeps_them_to_retry(tmp_path):
  work, kept = str(tmp_path / "work"), str(tmp_path / "kept")
  _take(V3, work, "base=301/seed=0/dapo")
  new = plan_records.export_records(work, kept)
  assert new == ["base=301/seed=0/dapo"]
  assert plan_records.commit_records(kept, new, "parity_v3") == new


def _cached_base(root, warm_rel, fingerprint, passed=True):
  """A warm point's gate record naming `fingerprint`, and that base's cache
  (orbax parameters and warm phases) as warm_start.warm_start leaves it."""
  gate_path = os.path.join(root, warm_rel, "base_gate.json")
  with open(gate_path) as f:
    gate = json.load(f)
  gate.update(fingerprint=fingerprint, passed=passed)
  with open(gate_path, "w") as f:
    json.dump(gate, f)
  cache = os.path.join(root, "bases", fingerprint)
  checkpointer = ocp.StandardCheckpointer()
  params = {"w": np.arange(6.0, dtype=np.float32).reshape(2, 3) + len(root)}
  checkpointer.save(os.path.join(cache, warm_start.PARAMS_DIR), params)
  checkpointer.wait_until_finished()
  with open(os.path.join(cache, warm_start.PHASES_FILE), "w") as f:
    json.dump(gate["warm_phases"], f)
  return params


def test_a_passed_base_is_kept_and_seeded_back_bit_identical(tmp_path):
  work, records = str(tmp_path / "work"), str(tmp_path / "records")
  _take(V3, work, "bases/warm=302")
  _take(V3, work, "bases/warm=303")
  params = _cached_base(work, "bases/warm=302/scalerl", "f302")
  _cached_base(work, "bases/warm=303/scalerl", "f303", passed=False)
  exported = plan_records.export_records(work, records)
  # The failed gate's base is not kept; its gate record is.
  assert exported == [
      "bases/f302",
      "bases/warm=302/scalerl",
      "bases/warm=303/scalerl",
  ]
  assert not os.path.exists(os.path.join(records, "bases", "f303"))
  assert plan_records.export_records(work, records) == []
  # Base 302 has points left: a new machine gets its parameters and its
  # warm record (the gate stands); base 303 failed its gate: its record.
  fresh = str(tmp_path / "fresh")
  seeded = plan_records.seed_workdir(parity_v3.PLAN, records, fresh)
  assert seeded == exported
  assert plan_records.check_base(parity_v3.PLAN, records, fresh, 302) is None
  restored = ocp.StandardCheckpointer().restore(
      os.path.join(fresh, "bases", "f302", warm_start.PARAMS_DIR)
  )
  np.testing.assert_array_equal(restored["w"], params["w"])
  for root in (work, fresh):
    with open(os.path.join(root, "bases", "f302", warm_start.PHASES_FILE)) as f:
      assert json.load(f)["chain_steps"] == 3250  # base 302's record
  assert "bases/f302" not in plan_records.seed_workdir(
      parity_v3.PLAN, records, fresh
  )


def test_a_base_that_differs_from_its_record_is_not_kept(tmp_path):
  work, records = str(tmp_path / "work"), str(tmp_path / "records")
  _take(V3, work, "bases/warm=302")
  _take(V3, records, "bases/warm=302")
  _cached_base(work, "bases/warm=302/scalerl", "f302")
  gate_path = os.path.join(work, "bases/warm=302/scalerl/base_gate.json")
  with open(gate_path) as f:
    gate = json.load(f)
  gate["measured"]["chain_exact/1"] = 0.5
  with open(gate_path, "w") as f:
    json.dump(gate, f)
  assert plan_records.export_records(work, records) == []
  # Its record equal (the fingerprint aside), the same base is kept.
  gate["measured"]["chain_exact/1"] = 1.0
  with open(gate_path, "w") as f:
    json.dump(gate, f)
  assert plan_records.export_records(work, records) == ["bases/f302"]
