"""A registered plan's verdicts: the confirmatory table, the early-call
scorecard, the bases' gates and the variance components.

  python -m launch.verdict --plan=configs/plans/parity_v1.py \
      --runs=docs/runs/plans/parity_v1

Reads the plan (configs/plans/*.py, PLAN) and its runs below --runs
(`base=B/seed=S/<point>`), and git's history of the plan file: a claim is
confirmatory only if every run it reads started after the commit that
registered it, as it stands (scalerl_jax/jobs/registration.py). Tests,
corrections and thresholds are the plan's
(scalerl_jax/scaling/registered_plan.py).
"""

from absl import app
from absl import flags

from launch import REPO_ROOT
from scalerl_jax.jobs import plan_verdict
from scalerl_jax.jobs import registration

_PLAN = flags.DEFINE_string("plan", None, "Plan file.", required=True)
_RUNS = flags.DEFINE_string(
    "runs", None, "Directory of base=B/seed=S/<point> runs.", required=True
)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  plan = registration.load_plan_or_exit(
      _PLAN.value, "launch.verdict", REPO_ROOT
  )
  found = plan_verdict.load_runs(plan, _RUNS.value)
  gates = plan_verdict.load_gates(plan, _RUNS.value, found)
  print(f"# Plan {plan.name}: {len(found)} finished runs\n")
  table, final = plan_verdict.verdict_table(
      plan, _PLAN.value, found, gates, REPO_ROOT
  )
  print(table + "\n")
  print(plan_verdict.short_runs(plan, found) + "\n")
  print("## Called early, then checked\n")
  print(plan_verdict.scorecard(plan, found, gates, final) + "\n")
  print("## Bases\n")
  print(plan_verdict.gate_table(gates) + "\n")
  print("## Variance components\n")
  for point in plan.points:
    print("- " + plan_verdict.components(plan, found, gates, point))


if __name__ == "__main__":
  app.run(main)
