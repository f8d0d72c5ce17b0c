"""A registered plan's verdicts: the confirmatory table, the early-call
scorecard, the bases' gates and the variance components.

  python -m launch.verdict --plan=configs/plans/parity_v1.py \
      --runs=docs/runs/plans/parity_v1
  python -m launch.verdict \
      --plan=configs/plans/parity_v1.py --runs=docs/runs/plans/parity_v1 \
      --plan=configs/plans/parity_v3.py --runs=docs/runs/plans/parity_v3

Reads the plan (configs/plans/*.py, PLAN) and its runs below --runs
(`base=B/seed=S/<point>`), and git's history of the plan file: a claim is
confirmatory only if every run it reads started after the commit that
registered it, as it stands (scalerl_jax/jobs/registration.py). Tests,
corrections and thresholds are the plan's
(scalerl_jax/scaling/registered_plan.py). With several plans it prints
each, then every confirmatory claim under Holm's correction over all the
plans' families at once (a stricter sensitivity reading; each plan's own
family decides its verdicts) and the early-call scorecard summed over them.
"""

from absl import app
from absl import flags

from launch import REPO_ROOT
from scalerl_jax.jobs import plan_verdict
from scalerl_jax.jobs import registration

_PLAN = flags.DEFINE_multi_string(
    "plan", None, "Plan file; repeat, with --runs, for several.", required=True
)
_RUNS = flags.DEFINE_multi_string(
    "runs",
    None,
    "Directory of base=B/seed=S/<point> runs, one per --plan, in order.",
    required=True,
)


def _print_plan(reading):
  plan = reading.plan
  print(f"# Plan {plan.name}: {len(reading.found)} finished runs\n")
  print(plan_verdict.verdict_table(reading) + "\n")
  print(plan_verdict.short_runs(plan, reading.found) + "\n")
  print("## Called early, then checked\n")
  print(reading.early + "\n\n" + reading.score.summary() + "\n")
  print("## Bases\n")
  print(plan_verdict.gate_table(reading.gates) + "\n")
  print("## Variance components\n")
  for point in plan.points:
    print(
        "- "
        + plan_verdict.components(plan, reading.found, reading.gates, point)
    )


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  if len(_PLAN.value) != len(_RUNS.value):
    raise app.UsageError(
        f"one --runs per --plan, in order: got {len(_PLAN.value)} plans and "
        f"{len(_RUNS.value)} run directories"
    )
  readings = []
  for plan_path, runs in zip(_PLAN.value, _RUNS.value):
    plan = registration.load_plan_or_exit(
        plan_path, "launch.verdict", REPO_ROOT
    )
    readings.append(plan_verdict.read(plan, plan_path, runs, REPO_ROOT))
    _print_plan(readings[-1])
    print()
  if len(readings) > 1:
    print("# Across the plans\n")
    try:
      print(plan_verdict.across_plans(readings))
    except ValueError as e:
      raise SystemExit(f"launch.verdict: {e}") from e


if __name__ == "__main__":
  app.run(main)
