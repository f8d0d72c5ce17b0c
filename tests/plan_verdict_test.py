"""Tests of jobs/plan_verdict.py on synthetic runs with known sigmoids: the
fitted A per run, the claims, the replacement of a failed base, the early
call, the variance components and each point's registered steps; and of
launch/verdict.py, which prints them."""

import dataclasses
import datetime
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from scalerl_jax import workdir as workdir_lib
from scalerl_jax.jobs import plan_verdict
from scalerl_jax.jobs import registration
from scalerl_jax.scaling import registered_plan as plan_lib
from scalerl_jax.scaling import sigmoid
from tests import git_helpers

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = np.concatenate([np.arange(0, 51, 5), np.arange(60, 151, 10)])
FLOPS_PER_STEP = 1e11


def _write_run(workdir, a, seed, gate_passed=True):
  os.makedirs(workdir)
  rng = np.random.default_rng(seed)
  compute = STEPS * FLOPS_PER_STEP
  score = sigmoid.sigmoid(compute, a, 1.5, 3e12, 0.6)
  score = score + rng.normal(0, 0.002, len(STEPS)) * (STEPS > 0)
  with open(os.path.join(workdir, workdir_lib.METRICS_FILE), "w") as f:
    for s, c, y in zip(STEPS, compute, score):
      f.write(
          json.dumps(
              {
                  "step": int(s),
                  "compute/flops": float(c),
                  "val/mean_at_k": float(y),
                  "val/mean_at_k_stderr": 0.006,
                  "staleness/mean": 7.4,
              }
          )
          + "\n"
      )
  workdir_lib.mark_finished(workdir)
  with open(os.path.join(workdir, "base_gate.json"), "w") as f:
    json.dump(
        {
            "passed": gate_passed,
            "measured": {
                f"{k}/{l}": 0.5
                for k in ("chain_exact", "p_chain")
                for l in (1, 2, 3, 4)
            },
        },
        f,
    )


def _plan():
  claim = plan_lib.PlannedClaim(
      name="higher_a",
      first="base",
      relation="higher",
      second="other",
      statistic="A_fit",
      paper="p",
      effect=0.02,
      sd=0.02,
      sd_source="s",
      mechanism=("staleness/mean", "mean"),
  )
  return plan_lib.Plan(
      name="t",
      points=("base", "other"),
      claims=(claim,),
      bases=(1, 2),
      spare_bases=(3,),
      rl_seeds=(0, 1),
      steps=150,
      step_overrides={},
      base_gate={"levels": (2,)},
      min_pinned=3,
  )


@pytest.fixture(scope="module")
def found(tmp_path_factory):
  root = str(tmp_path_factory.mktemp("runs"))
  plan = _plan()
  # Base 2 fails its gate (its runs never count); spare 3 replaces it. Each
  # base lifts A by its own amount; "other" sits 0.05 below "base".
  for base, lift, passed in ((1, 0.0, True), (2, 0.1, False), (3, 0.03, True)):
    for seed in (0, 1):
      for i, (point, a) in enumerate((("base", 0.85), ("other", 0.80))):
        _write_run(
            os.path.join(plan_verdict.replicate_dir(root, (base, seed)), point),
            a + lift + 0.005 * seed,
            100 * base + 10 * seed + i,  # The noise's seed, fixed per run.
            passed,
        )
  runs = plan_verdict.load_runs(plan, root)
  return plan, runs, plan_verdict.load_gates(plan, root, runs)


def test_a_failed_base_is_replaced_by_the_next_spare(found):
  plan, _, gates = found
  assert plan_verdict.replicates(plan, gates) == (
      (1, 0),
      (1, 1),
      (3, 0),
      (3, 1),
  )
  assert "Gate passed by 2 of 3 bases" in plan_verdict.gate_table(gates)


def test_fitted_a_recovers_the_difference_and_the_claim_agrees(found):
  plan, runs, gates = found
  (result,) = plan_verdict.claim_results(plan, runs, gates)
  assert len(result.replicates) == 4
  assert result.test.mean == pytest.approx(0.05, abs=0.01)
  verdict, p = plan_lib.verdicts(plan, [result], ["higher_a"])["higher_a"]
  assert verdict == "agrees" and p < 0.01
  # The end point sits below A (the curve still rises at step 150), yet shows
  # the same order.
  assert 0 < result.end_point.mean < 0.05


def test_the_early_call_and_its_distance_from_the_final_fit(found):
  plan, runs, gates = found
  text = plan_verdict.scorecard(plan, runs, gates, {"higher_a": "agrees"})
  assert "| higher_a |" in text
  # The early call agrees too (fits of the first third pin, above), and the
  # final verdict decided the one claim.
  assert (
      "right on 1 of 1 claims, on 1 of the 1 the final verdict decided" in text
  )
  # Against an inconclusive final verdict the claim counts as undecided.
  text = plan_verdict.scorecard(plan, runs, gates, {"higher_a": "inconclusive"})
  assert (
      "right on 0 of 1 claims, on 0 of the 0 the final verdict decided" in text
  )
  gaps = [
      abs(f.early.fit.a - f.final.fit.a)
      for f in runs.values()
      if f.early.fit is not None and f.final.fit is not None
  ]
  # Fitted on the first third (steps <= 50, past C_mid at step 30): within a
  # few hundredths of the final A on noiseless-ish sigmoids.
  assert gaps and max(gaps) < 0.05
  assert f"median {np.median(gaps):.3f}" in text


def test_an_early_call_against_the_final_verdict_is_counted_opposite(found):
  plan, runs, gates = found
  # The early call agrees; a final "disagrees" is its opposite, a final
  # "inconclusive" is not.
  text = plan_verdict.scorecard(plan, runs, gates, {"higher_a": "disagrees"})
  assert "the opposite of the final verdict on 1." in text
  _, tally = plan_verdict.score(plan, runs, gates, {"higher_a": "inconclusive"})
  assert (tally.claims, tally.same, tally.decided, tally.opposite) == (
      1,
      0,
      0,
      0,
  )


def test_scores_of_plans_add_up():
  one = plan_verdict.Score(3, 2, 2, 1, 0, (0.01, 0.03))
  two = plan_verdict.Score(2, 1, 1, 0, 1, (0.02,))
  total = sum((one, two), plan_verdict.Score())
  assert total == plan_verdict.Score(5, 3, 3, 1, 1, (0.01, 0.03, 0.02))
  assert total.summary() == (
      "Early call right on 3 of 5 claims, on 1 of the 3 the final verdict "
      "decided; the opposite of the final verdict on 1. |A_early - A_final| "
      "over 3 runs: median 0.020, max 0.030."
  )


def test_variance_components_see_the_bases(found):
  plan, runs, gates = found
  text = plan_verdict.components(plan, runs, gates, "base")
  # Bases 1 and 3 (base 2 failed its gate and is left out) differ by 0.03,
  # their seeds by 0.005; one validation's variance is 0.006^2.
  assert "validation's sampling 3.60e-05" in text
  assert "2 bases, 2 seeds each" in text
  between = float(text.split("between bases ")[1].split(" ")[0])
  assert between == pytest.approx(0.03**2 / 2, rel=0.5)


def test_each_point_is_read_to_its_registered_steps(tmp_path):
  # Both points ran 150 steps; "other" is registered for 90 (an override).
  plan = dataclasses.replace(_plan(), step_overrides={"other": 90})
  for i, point in enumerate(plan.points):
    _write_run(
        os.path.join(plan_verdict.replicate_dir(str(tmp_path), (1, 0)), point),
        0.85,
        i,
    )
  runs = plan_verdict.load_runs(plan, str(tmp_path))
  for point, end in (("base", 150), ("other", 90)):
    f = runs[(1, 0), point]
    assert f.run.steps[-1] == f.final.steps[-1] == end
    # The early call fits the first third of the registered compute.
    assert f.early.extrapolation.split == pytest.approx(
        plan.early_fraction * end * FLOPS_PER_STEP
    )


def _verdict(*args, repo=None):
  """launch.verdict's run; with `repo`, registration read from that git
  checkout instead of this one (a plan is registered by its commits)."""
  if repo is None:
    argv = ["-m", "launch.verdict"]
  else:
    argv = [
        "-c",
        "import sys; from absl import app; from launch import verdict; "
        "verdict.REPO_ROOT = sys.argv.pop(1); app.run(verdict.main)",
        str(repo),
    ]
  return subprocess.run(
      [sys.executable, *argv, *args],
      cwd=REPO,
      capture_output=True,
      text=True,
      timeout=300,
  )


def _registered(repo, filename, plan, runs):
  """Writes `plan` to `repo`/`filename`, commits it, and writes base 1's
  runs below `runs`, each started from that commit a minute after it."""
  (repo / filename).write_text(
      "from scalerl_jax.scaling.registered_plan import Plan, PlannedClaim\n\n"
      f"PLAN = {plan!r}\n"
  )
  git_helpers.git(repo, "add", filename)
  git_helpers.git(repo, "commit", "-qm", filename)
  committed = datetime.datetime.fromisoformat(
      git_helpers.git(repo, "log", "-1", "--format=%cI")
  )
  record = {
      "git_dirty": False,
      "git_head": git_helpers.git(repo, "rev-parse", "HEAD"),
      "started_utc": (committed + datetime.timedelta(minutes=1)).isoformat(),
  }
  for seed in plan.rl_seeds:
    for i, (point, a) in enumerate((("base", 0.85), ("other", 0.80))):
      workdir = os.path.join(
          plan_verdict.replicate_dir(str(runs), (1, seed)), point
      )
      _write_run(workdir, a, 10 * seed + i)
      with open(
          os.path.join(workdir, registration.REGISTRATION_FILE), "w"
      ) as f:
        json.dump(record, f)
  return record


def test_the_verdict_launcher_prints_every_claim_and_the_early_call(tmp_path):
  plan = _plan()
  exploratory = dataclasses.replace(
      plan.claims[0], name="b", statistic="B_shared", confirmatory=False
  )
  plan = dataclasses.replace(plan, claims=plan.claims + (exploratory,))
  # The plan file is the plan written out, committed in a repository of its
  # own; every run started, from that commit, a minute after it.
  repo = tmp_path / "repo"
  git_helpers.init(repo)
  runs = tmp_path / "runs"
  record = _registered(repo, "plan.py", plan, runs)
  proc = _verdict(f"--plan={repo / 'plan.py'}", f"--runs={runs}", repo=repo)
  assert proc.returncode == 0, proc.stderr
  lines = proc.stdout.splitlines()
  assert "# Plan t: 4 finished runs" in lines
  header = [l for l in lines if l.startswith("| claim | paper | statistic |")]
  assert len(header) == 1
  row = [l for l in lines if l.startswith("| higher_a: base > other |")]
  assert (
      len(row) == 1 and f"| confirmatory; {record['git_head'][:8]} |" in row[0]
  )
  row = [l for l in lines if l.startswith("| b: base > other |")]
  assert (
      len(row) == 1 and "| exploratory: registered as exploratory; " in row[0]
  )
  early = lines[lines.index("## Called early, then checked") :]
  assert early[2].startswith("| claim | early call (1/3 of compute) |")
  assert any(l.startswith("| higher_a | ") for l in early)
  assert any(l.startswith("| b | ") for l in early)
  assert any(l.startswith("Early call right on ") for l in early)


def test_the_verdict_launcher_reads_several_plans_together(tmp_path):
  repo = tmp_path / "repo"
  git_helpers.init(repo)
  # Base 1's two pairs decide a claim (base 2 has no runs).
  one = dataclasses.replace(_plan(), min_pinned=2)
  two = dataclasses.replace(one, name="u")
  _registered(repo, "one.py", one, tmp_path / "one")
  _registered(repo, "two.py", two, tmp_path / "two")
  proc = _verdict(
      f"--plan={repo / 'one.py'}",
      f"--runs={tmp_path / 'one'}",
      f"--plan={repo / 'two.py'}",
      f"--runs={tmp_path / 'two'}",
      repo=repo,
  )
  assert proc.returncode == 0, proc.stderr
  lines = proc.stdout.splitlines()
  assert "# Plan t: 4 finished runs" in lines
  assert "# Plan u: 4 finished runs" in lines
  across = lines[lines.index("# Across the plans") :]
  rows = {
      l.split(" | ")[0][2:]: l.strip("| ").split(" | ")
      for l in across
      if l.startswith(("| t | higher_a |", "| u | higher_a |"))
  }
  assert set(rows) == {"t", "u"}
  # Each plan's family holds its one claim, decided alone at its raw p; the
  # two plans' runs are the same curves, so over both, each p doubles: past
  # the level, which each plan alone is below.
  for cells in rows.values():
    p, p_plan, p_all = (float(cells[i]) for i in (2, 3, 5))
    assert p_plan == p < 0.05 < p_all == pytest.approx(2 * p, rel=1e-2)
    assert (cells[4], cells[6]) == ("agrees", "inconclusive")
  assert across[-1].startswith(
      "Over the 2 plans: Early call right on 0 of 2 claims, on 0 of the 2 "
      "the final verdict decided"
  )
  proc = _verdict(
      f"--plan={repo / 'one.py'}",
      f"--runs={tmp_path / 'one'}",
      f"--plan={repo / 'two.py'}",
      repo=repo,
  )
  assert proc.returncode != 0
  assert "one --runs per --plan, in order: got 2 plans and 1" in proc.stderr


def test_the_verdict_launcher_names_a_missing_plan(tmp_path):
  absent = tmp_path / "absent.py"
  proc = _verdict(f"--plan={absent}", f"--runs={tmp_path}")
  assert proc.returncode != 0
  message = proc.stderr.strip().splitlines()[-1]
  assert message.startswith("launch.verdict: ") and str(absent) in message
  assert "Traceback" not in proc.stderr


def test_runs_that_stop_before_their_registered_steps_are_named(tmp_path):
  plan = _plan()
  root = str(tmp_path)
  for point in ("base", "other"):
    _write_run(
        os.path.join(plan_verdict.replicate_dir(root, (1, 0)), point), 0.8, 0
    )
  # "other" stops at step 104 of 150 with its 320 prompts retired: a line
  # past its last validation carries the step it stopped at.
  metrics = os.path.join(
      plan_verdict.replicate_dir(root, (1, 0)), "other", "metrics.jsonl"
  )
  rows = [json.loads(l) for l in open(metrics)]
  rows = [r for r in rows if r["step"] <= 100]
  rows.append({"step": 104, "prompts_retired": 320})
  with open(metrics, "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in rows)
  runs = plan_verdict.load_runs(plan, root)
  text = plan_verdict.short_runs(plan, runs)
  assert text.splitlines() == [
      "1 of 2 runs stopped before their registered steps, fitted on the "
      "compute they reached:",
      "- base 1, seed 0, other: stopped at step 104 of 150 (last validation "
      "at step 100; prompts retired by then: 320)",
  ]
  del runs[(1, 0), "other"]
  assert plan_verdict.short_runs(plan, runs) == (
      "Every run reached its registered steps."
  )
