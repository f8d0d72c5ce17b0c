"""Tests of jobs/registration.py on a throwaway git repository: a claim counts
only for runs that started after the commit that registered it, as it
stands."""

import datetime
import json
import os
import time

import pytest

from scalerl_jax import workdir as workdir_lib
from scalerl_jax.jobs import registration
from tests import git_helpers

_PLAN = """
from scalerl_jax.scaling import registered_plan as plan_lib

def _c(name, second, effect=0.02, confirmatory=True):
  return plan_lib.PlannedClaim(
      name=name, first="base", relation="higher", second=second,
      statistic="A_fit", paper="p", effect=effect, sd=0.02, sd_source="s",
      mechanism=("k", "mean"), confirmatory=confirmatory)

PLAN = plan_lib.Plan(
    name="t", points=("base", "x", "y"), claims=({claims}),
    bases=(1, 2), spare_bases=(3,), rl_seeds=(0,), steps=10,
    step_overrides={{}}, base_gate={{"levels": (2,)}})
"""


def _commit(repo, claims, message):
  (repo / "plan.py").write_text(_PLAN.format(claims=claims))
  git_helpers.git(repo, "add", "plan.py")
  git_helpers.git(repo, "commit", "-qm", message)
  return git_helpers.git(repo, "rev-parse", "HEAD")


@pytest.fixture
def repo(tmp_path):
  repo = tmp_path / "repo"
  git_helpers.init(repo)
  return repo


def _start(repo, workdir):
  return registration.record_start(
      str(workdir), str(repo / "plan.py"), str(repo)
  )


def test_claims_register_at_their_first_commit_and_runs_after_count(
    repo, tmp_path
):
  first = _commit(repo, '_c("one", "x"),', "plan")
  time.sleep(1.1)  # Commit times have one-second resolution.
  run = _start(repo, tmp_path / "runs" / "x")
  assert run["git_head"] == first and not run["git_dirty"]
  # A claim added after the run started, and one changed after it, are
  # exploratory; the unchanged one stays confirmatory.
  time.sleep(1.1)
  _commit(repo, '_c("one", "x"), _c("two", "y")', "add two")
  plan = registration.load_plan(str(repo / "plan.py"))
  records = {"x": [run], "y": [run]}
  status = registration.classify(
      plan, str(repo / "plan.py"), records, str(repo)
  )
  # Adding a claim to the family changes every confirmatory claim's
  # identity (the correction spans the family): "one" is re-registered too.
  assert (
      not status["one"][0] and "before the claim's commit" in status["one"][1]
  )
  assert not status["two"][0]
  # A run started after the second commit counts for both.
  time.sleep(1.1)
  later = _start(repo, tmp_path / "runs2" / "x")
  status = registration.classify(
      plan, str(repo / "plan.py"), {"x": [later], "y": [later]}, str(repo)
  )
  assert status["one"][0] and status["two"][0]
  assert status["one"][2].commit == git_helpers.git(repo, "rev-parse", "HEAD")


def test_a_run_keeps_its_first_start_and_finished_runs_get_none(repo, tmp_path):
  _commit(repo, '_c("one", "x"),', "plan")
  workdir = tmp_path / "x"
  first = _start(repo, workdir)
  time.sleep(1.1)
  assert _start(repo, workdir) == first
  done = tmp_path / "done"
  done.mkdir()
  workdir_lib.mark_finished(str(done))
  assert _start(repo, done) is None
  assert not os.path.exists(done / registration.REGISTRATION_FILE)


def test_dirty_checkouts_and_foreign_code_do_not_count(repo, tmp_path):
  _commit(repo, '_c("one", "x"),', "plan")
  (repo / "other.py").write_text("x = 1\n")
  git_helpers.git(repo, "add", "other.py")
  run = _start(repo, tmp_path / "x")
  assert run["git_dirty"]
  plan = registration.load_plan(str(repo / "plan.py"))
  reg = registration.claim_registrations(str(repo / "plan.py"), str(repo))
  ok, why = registration.run_counts(
      run, reg[plan.claim_identity(plan.claims[0])], str(repo)
  )
  assert not ok and "uncommitted" in why
  # A clean record from a commit that does not contain the claim's.
  fake = dict(run, git_dirty=False, git_head="0" * 40)
  fake["started_utc"] = (
      datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=1)
  ).isoformat()
  ok, why = registration.run_counts(
      fake, reg[plan.claim_identity(plan.claims[0])], str(repo)
  )
  assert not ok and "without the claim's commit" in why


def test_an_uncommitted_claim_is_never_confirmatory(repo, tmp_path):
  _commit(repo, '_c("one", "x"),', "plan")
  (repo / "plan.py").write_text(_PLAN.format(claims='_c("one", "x", 0.05),'))
  plan = registration.load_plan(str(repo / "plan.py"))
  status = registration.classify(plan, str(repo / "plan.py"), {}, str(repo))
  assert not status["one"][0]
  assert "never committed" in status["one"][1]
  assert json.dumps(str(status["one"][2]))


def test_loading_a_plan_leaves_no_bytecode_beside_it(repo, monkeypatch):
  # An untracked __pycache__ in the plan's folder would make every later
  # run's checkout read as dirty (CI writes bytecode; this machine does not).
  monkeypatch.setattr("sys.dont_write_bytecode", False)
  _commit(repo, '_c("one", "x"),', "plan")
  registration.load_plan(str(repo / "plan.py"))
  assert not (repo / "__pycache__").exists()
  assert not git_helpers.git(repo, "status", "--porcelain")


def test_a_launcher_exits_naming_a_file_that_is_no_plan(tmp_path):
  (tmp_path / "sweep.py").write_text("SWEEP = ()\n")
  with pytest.raises(SystemExit, match=r"^launch\.x: .*sweep\.py: .*PLAN"):
    registration.load_plan_or_exit(
        str(tmp_path / "sweep.py"), "launch.x", str(tmp_path)
    )
  with pytest.raises(SystemExit, match=r"^launch\.x: .*absent\.py"):
    registration.load_plan_or_exit(
        str(tmp_path / "absent.py"), "launch.x", str(tmp_path)
    )


def test_a_plan_outside_the_checkout_is_refused_by_name(repo, tmp_path):
  _commit(repo, '_c("one", "x"),', "plan")
  outside = tmp_path / "plan.py"
  outside.write_text((repo / "plan.py").read_text())
  with pytest.raises(SystemExit, match=r"^launch\.x: .*plan\.py is outside"):
    registration.load_plan_or_exit(str(outside), "launch.x", str(repo))
  with pytest.raises(ValueError, match="outside the checkout"):
    registration.record_start(str(tmp_path / "w"), str(outside), str(repo))
  # Inside it, the same file loads.
  assert (
      registration.load_plan_or_exit(
          str(repo / "plan.py"), "launch.x", str(repo)
      ).name
      == "t"
  )


def test_a_run_without_a_start_record_never_counts(repo, tmp_path):
  _commit(repo, '_c("one", "x"),', "plan")
  plan = registration.load_plan(str(repo / "plan.py"))
  status = registration.classify(
      plan, str(repo / "plan.py"), {"x": [{}]}, str(repo)
  )
  assert not status["one"][0]
  assert "has no registration.json" in status["one"][1]
