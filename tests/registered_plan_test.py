"""Tests of scaling/registered_plan.py: claims decided on paired replicates,
worked by hand, and a claim's identity."""

import dataclasses

import pytest
from scipy import stats

from scalerl_jax.scaling import registered_plan as plan_lib


def _claim(name="loss", relation="higher", threshold=0.0, **kw):
  return plan_lib.PlannedClaim(
      name=name,
      first="base",
      relation=relation,
      second="other",
      statistic="A_fit",
      paper="p",
      effect=0.02,
      sd=0.02,
      sd_source="s",
      mechanism=("k", "mean"),
      mechanism_threshold=threshold,
      **kw,
  )


def _plan(*claims, **kw):
  fields = dict(
      name="t",
      points=("base", "other"),
      claims=claims,
      bases=(1, 2),
      spare_bases=(),
      rl_seeds=(0, 1),
      steps=10,
      step_overrides={},
      base_gate={"levels": (2,)},
  )
  return plan_lib.Plan(**{**fields, **kw})


REPS = ((1, 0), (1, 1), (2, 0), (2, 1))


def test_decide_counts_pinned_pairs_only():
  claim = _claim()
  plan = _plan(claim, min_pinned=2)
  stat = {
      (1, 0): (0.85, 0.82),
      (1, 1): (0.84, None),  # Unpinned: left out, never replaced.
      (2, 0): (0.80, 0.79),
  }
  mech = {r: (0.001, 0.0) for r in stat}
  ends = {r: (0.80, 0.79) for r in stat}
  r = plan_lib.decide(plan, claim, stat, mech, ends, REPS)
  assert r.replicates == ((1, 0), (2, 0))
  assert r.unpinned == ((1, 1),) and r.missing == ((2, 1),)
  assert r.differences == pytest.approx((0.03, 0.01))
  assert r.p == pytest.approx(stats.ttest_1samp([0.03, 0.01], 0).pvalue)
  assert r.end_point.mean == pytest.approx(0.01)
  assert r.mechanism == pytest.approx((0.001, 0.0))


def test_too_few_pinned_pairs_stay_inconclusive():
  claim = _claim()
  plan = _plan(claim, min_pinned=4)
  stat = {r: (0.9, 0.7) for r in REPS[:3]}
  stat[REPS[3]] = (None, 0.7)
  r = plan_lib.decide(plan, claim, stat, {}, {}, REPS)
  verdict, p = plan_lib.verdicts(plan, [r], ["loss"])["loss"]
  assert verdict.startswith("inconclusive (fits pinned on 3 of 4 pairs")
  assert p is None


def test_holm_across_the_family_and_exploratory_claims_alone():
  a, b, c = _claim("a"), _claim("b"), _claim("c", confirmatory=False)
  plan = _plan(a, b, c, min_pinned=2)
  # a's differences are tight (p ~ 1e-5), b's spread around 0.02.
  d_strong = (0.031, 0.029, 0.030, 0.032)
  d_weak = (0.05, -0.01, 0.04, 0.0)
  results = []
  for claim, d in ((a, d_strong), (b, d_weak), (c, d_weak)):
    stat = {rep: (0.8 + x, 0.8) for rep, x in zip(REPS, d)}
    results.append(plan_lib.decide(plan, claim, stat, {}, {}, REPS))
  p = {r.claim.name: r.p for r in results}
  out = plan_lib.verdicts(plan, results, ["a", "b"])
  # Two in the family: the smaller p doubles, the larger stays (monotone).
  assert out["a"][1] == pytest.approx(2 * p["a"])
  assert out["b"][1] == pytest.approx(max(p["b"], 2 * p["a"]))
  assert out["a"][0] == "agrees" and out["b"][0] == "inconclusive"
  # c is decided alone, at its raw p.
  assert out["c"][1] == pytest.approx(p["c"])


def _results(plan, diffs):
  return [
      plan_lib.decide(
          plan,
          claim,
          {rep: (0.8 + x, 0.8) for rep, x in zip(REPS, d)},
          {},
          {},
          REPS,
      )
      for claim, d in zip(plan.claims, diffs)
  ]


def test_holm_across_plans_runs_once_over_every_family():
  d_strong = (0.031, 0.029, 0.030, 0.032)
  d_mid = (0.03, 0.006, 0.02, 0.022)  # p 0.030
  d_weak = (0.05, -0.01, 0.04, 0.0)
  one = _plan(_claim("a"), _claim("b"), name="one", min_pinned=2)
  two = _plan(
      _claim("a"), _claim("x", confirmatory=False), name="two", min_pinned=2
  )
  r1 = _results(one, (d_strong, d_weak))
  r2 = _results(two, (d_mid, d_weak))
  p = {("one", "a"): r1[0].p, ("one", "b"): r1[1].p, ("two", "a"): r2[0].p}
  assert p["one", "a"] < p["two", "a"] < 0.05 < 2 * p["two", "a"]
  assert p["one", "b"] > 0.05
  out = plan_lib.holm_across([(one, r1, ["a", "b"]), (two, r2, ["a"])])
  # Three in the family, by hand: 3 p1, max(3 p1, 2 p2), max(.., p3).
  assert out["one", "a"][1] == pytest.approx(3 * p["one", "a"])
  assert out["two", "a"][1] == pytest.approx(
      max(3 * p["one", "a"], 2 * p["two", "a"])
  )
  assert out["one", "b"][1] == pytest.approx(
      max(out["two", "a"][1], p["one", "b"])
  )
  # Only family claims come back; the exploratory one is its plan's alone.
  assert set(out) == {("one", "a"), ("one", "b"), ("two", "a")}
  # Stricter than each plan's own family: alone, two's "a" keeps its raw
  # p and agrees; beside one's claims it doubles past the level.
  assert plan_lib.verdicts(two, r2, ["a"])["a"] == ("agrees", p["two", "a"])
  assert out["two", "a"][0] == "inconclusive"
  assert out["one", "a"][0] == "agrees"


def test_holm_across_plans_needs_one_level_and_each_plan_once():
  one = _plan(_claim("a"), name="one", min_pinned=2)
  r = _results(one, ((0.03, 0.01, 0.02, 0.025),))
  with pytest.raises(ValueError, match=r"one level; got \[0.05, 0.1\]"):
    plan_lib.holm_across(
        [
            (one, r, ["a"]),
            (dataclasses.replace(one, name="b", alpha=0.1), r, ["a"]),
        ]
    )
  with pytest.raises(ValueError, match="each plan once"):
    plan_lib.holm_across([(one, r, ["a"]), (one, r, ["a"])])


def test_a_lower_first_point_disagrees():
  claim = _claim()
  plan = _plan(claim, min_pinned=2)
  stat = {rep: (0.7 + x, 0.8) for rep, x in zip(REPS, (0, 0.001, -0.001, 0))}
  r = plan_lib.decide(plan, claim, stat, {}, {}, REPS)
  assert plan_lib.verdicts(plan, [r], ["loss"])["loss"][0] == "disagrees"


def test_same_claims_by_tost_and_an_idle_mechanism():
  claim = _claim("same", relation="same", threshold=1.0)
  plan = _plan(claim, min_pinned=2)
  stat = {
      rep: (0.8 + x, 0.8) for rep, x in zip(REPS, (0.001, -0.002, 0.0, 0.001))
  }
  acted = {rep: (7.4, 3.4) for rep in REPS}
  r = plan_lib.decide(plan, claim, stat, acted, {}, REPS)
  assert plan_lib.verdicts(plan, [r], ["same"])["same"][0] == "agrees"
  idle = {rep: (7.4, 7.0) for rep in REPS}
  r = plan_lib.decide(plan, claim, stat, idle, {}, REPS)
  assert plan_lib.verdicts(plan, [r], ["same"])["same"][0] == "mechanism idle"
  # Wholly outside the margin: disagrees.
  far = {
      rep: (0.85 + x, 0.8) for rep, x in zip(REPS, (0.001, -0.002, 0.0, 0.001))
  }
  r = plan_lib.decide(plan, claim, far, acted, {}, REPS)
  assert plan_lib.verdicts(plan, [r], ["same"])["same"][0] == "disagrees"


def test_identity_changes_with_the_claim_the_family_and_the_test():
  a, b = _claim("a"), _claim("b")
  plan = _plan(a, b)
  base = plan.claim_identity(a)
  assert plan.claim_identity(a) == base
  assert (
      _plan(dataclasses.replace(a, effect=0.03), b).claim_identity(
          dataclasses.replace(a, effect=0.03)
      )
      != base
  )
  assert _plan(a).claim_identity(a) != base  # The family changed.
  assert _plan(a, b, alpha=0.01).claim_identity(a) != base
  assert _plan(a, b, steps=20).claim_identity(a) != base
  # An exploratory claim's identity ignores the family.
  c = _claim("c", confirmatory=False)
  assert _plan(a, c).claim_identity(c) == _plan(a, b, c).claim_identity(c)


def test_bad_claims_are_refused():
  with pytest.raises(ValueError, match="relation in"):
    _claim(relation="lower")
