"""Registered plan parity_v4: the loss and GSPO again, on the budget whose
ceiling is below 1 (issue 58).

Committed before any of its runs starts; `launch.verdict` labels any claim
that changed after one of its runs started as exploratory. Its own Holm
family, beside parity_v1's, parity_v2's and parity_v3's:

  python -m launch.plan_sweep --plan=configs/plans/parity_v4.py \\
      --workdir=/tmp/plans/parity_v4 --parallel=2
  python -m launch.verdict --plan=configs/plans/parity_v4.py \\
      --runs=/tmp/plans/parity_v4

Why. parity_v1 and parity_v3 both found DAPO's fitted A above CISPO's
(-0.014 and -0.018, Holm p 0.0016 and 0.031), against the paper. Written
beside parity_v3's verdict: at the 41-token budget the curves saturate (fitted
A 0.94-1.00, 9 of its 30 fits at the grid's A = 1, 10 of 30 unpinned, GSPO's
claim inconclusive twice on fits at A = 1), so a difference of 0.02 in A is a
difference in how the last 2-5% is approached, not an asymptote the recipe
sets. This plan asks the same two questions where the ceiling is not 1 and
not the fit grid's edge: the 25-token budget (configs/parity.SHORT), where
chains fit on levels 1-2 only, and the best a policy can do without computing
parity in one pass is the chain there and a guess on levels 3-4, 0.69 on 150
validation prompts (docs/parity_task.md). parity_v1's `short` runs (150 steps,
from 0.42-0.45 at step 0) pinned on 7 of 10, with fitted A 0.54-0.78 and end
points 0.50-0.66: below the ceiling, and below 1 by far.

What it says, decided before its results: a verdict here is the loss's at a
budget that binds, on new bases. If CISPO - DAPO is negative beyond the test,
the disagreement of parity_v1 and parity_v3 holds where A is not at a ceiling
of 1; if positive, it is specific to the saturated budget; if inconclusive,
it is reported as such, beside both. None of the three replaces another's
verdict: each plan is its own family and all are reported.

The recipe is parity_v3's, points and pool included (configs/plans/
parity_v3.py: the third mend's warm start, parity_v1's gate, RL recipe, 150
steps and validation schedule, a pool twice the prompts a run draws), with
every point at the 25-token budget (`parity.budget(parity.SHORT)`, the
generator still running ahead 4 budgets a step). The warm start's targets are
cut at 41 tokens whatever a point's budget (trainer.warm_start_max_new_tokens),
so the bases are the third mend's and the gate, teacher-forced on whole
chains, is the one its 14 seeds passed. Bases are new seeds, none tried by a
plan or mend before. The gate and the spare rule stay, so a failure is
counted, not hidden.

The claims are parity_v3's (configs/plans/parity_v3.CLAIMS) with this
budget's sd: confirmatory, Holm over the two, CISPO > DAPO and GSPO (at the
ScaleRL appendix's clip) > DAPO in fitted A, each sized at 0.02; exploratory,
from the same runs, both in B at a shared A.

Power (significance.replicates_for_power, 80%, two-sided). No pair of losses
has run at this budget; the paired sd of fitted A is registered as 0.012, the
larger of two measured: parity_v1's `short` runs, the difference between the
two RL seeds of a base, root mean square over the 3 bases where both pinned
(-0.009, -0.019, -0.003): 0.0121, which is the sd of a paired difference
between two arms on one base and seed if the arms' seed noise is independent;
and parity_v3's loss pairs, 0.0119 on 6 pinned pairs. At 0.02 it needs 6
pinned pairs at alpha 0.05 and 7 at Holm's first step (alpha / 2).
parity_v1's short runs pinned on 7 of 10, so a pair (both pinned) on about
half: 12 replicates are registered, 6 bases x 2 RL seeds.

Cost: 3 points a replicate, 36 runs; parity_v1's short runs took 300-650 s
of device time at 150 steps, two at once: about 5 core-hours, plus 6 warm
starts at about half a core-hour each (the mend's seeds took 2,250-6,750
chain steps): about 8 core-hours in all.
"""

import dataclasses

from configs import parity
from configs import warm_start_reliability_v3 as mend
from configs.plans import parity_v3
from scalerl_jax.scaling import registered_plan as plan_lib

NAME = "parity_v4"
# New warm-start seeds: none was tried by any plan or mend before.
BASES = (401, 402, 403, 404, 405, 406)
SPARE_BASES = (407, 408, 409, 410, 411, 412)
STEPS = parity_v3.STEPS
BUDGET = parity.SHORT
SD_A = 0.012
SD_A_SOURCE = (
    "parity_v1's short runs, RL seed 0 - seed 1 of fitted A on the 3 bases "
    "where both pinned, root mean square 0.0121; parity_v3's loss pairs, "
    "sd 0.0119 on 6 pinned pairs"
)


def get_config(arg=None):
  """The third mend's warm start and parity_v1's gate on base `arg`, then
  parity_v3's RL recipe and pool (the points set the budget)."""
  base = plan_lib.parse_base(
      arg, f"configs/plans/{NAME}.py", BASES, SPARE_BASES
  )
  c = mend.get_config(str(base))
  c.trainer.num_steps = STEPS
  c.data.builtin_num_train = (
      parity_v3.POOL_PER_DRAW * STEPS * c.data.prompts_per_step
  )
  return c


def get_sweep(arg=None):
  """parity_v3's three losses, each at the 25-token budget."""
  return [
      {**point, **parity.budget(BUDGET)} for point in parity_v3.get_sweep(arg)
  ]


CLAIMS = tuple(
    dataclasses.replace(c, sd=SD_A, sd_source=SD_A_SOURCE)
    if c.statistic == "A_fit"
    else c
    for c in parity_v3.CLAIMS
)

# parity_v3's test, thresholds and compute, on this plan's bases and claims.
PLAN = dataclasses.replace(
    parity_v3.PLAN,
    name=NAME,
    points=tuple(p["name"] for p in get_sweep()),
    claims=CLAIMS,
    bases=BASES,
    spare_bases=SPARE_BASES,
)

NEEDED = PLAN.replicates_needed()
REGISTERED_REPLICATES = len(BASES) * len(PLAN.rl_seeds)
