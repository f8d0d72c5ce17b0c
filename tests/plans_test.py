"""Tests of the registered plans' designs (configs/plans/): what each plan's
docstring says its runs do, checked on the configs its sweep builds."""

import pytest

from configs import scalerl
from configs import warm_start_reliability_v3
from configs.plans import parity_v1
from configs.plans import parity_v2
from configs.plans import parity_v3
from configs.plans import parity_v4
from scalerl_jax import evaluation
from scalerl_jax import warm_start
from scalerl_jax.jobs import sweep as sweep_lib


def _configs(module, base):
  points = sweep_lib.load_sweep(
      f"{module.__file__}:base={base}", scalerl.get_config
  )
  return {p.name: sweep_lib.build_config(p, scalerl.get_config) for p in points}


@pytest.fixture(scope="module")
def v2():
  return _configs(parity_v2, parity_v2.BASES[0])


def test_v2_reuses_v1s_bases_in_v1s_order():
  assert parity_v2.BASES + parity_v2.SPARE_BASES == (
      parity_v1.BASES + parity_v1.SPARE_BASES
  )
  # The pool is not part of the warm start, so v1's cached bases serve v2.
  for base in (101, 104):
    a = parity_v1.get_config(f"base={base}")
    b = parity_v2.get_config(f"base={base}")
    assert a.data.builtin_num_train != b.data.builtin_num_train
    assert warm_start.fingerprint(a, 512) == warm_start.fingerprint(b, 512)


def test_v2_points_differ_from_the_baseline_in_their_one_choice(v2):
  base = v2["scalerl"]
  changed = {
      name: {
          k
          for k, v in sweep_lib.workdir_lib.config_leaves(c).items()
          if sweep_lib.workdir_lib.config_leaves(base).get(k) != v
      }
      for name, c in v2.items()
  }
  assert changed["dapo"] == {"rl.loss"}
  assert changed["gspo"] == {"rl.loss", "rl.gspo_eps_low", "rl.gspo_eps_high"}
  assert changed["token_avg"] == {"rl.aggregation"}
  assert changed["npr_off"] == {"curriculum.no_positive_resampling"}
  assert changed["zvf_off"] == {"rl.zero_variance_filter"}
  assert base.data.builtin_num_train == parity_v2.POOL


def test_the_half_batch_sees_the_baselines_samples_and_validates_with_it(v2):
  small, base = v2["batch8"], v2["scalerl"]
  factor = base.data.prompts_per_step // small.data.prompts_per_step
  assert factor == 2
  assert (
      small.trainer.num_steps * small.data.prompts_per_step
      == base.trainer.num_steps * base.data.prompts_per_step
  )
  assert parity_v2.PLAN.steps_of("batch8") == small.trainer.num_steps
  assert parity_v2.PLAN.steps_of("scalerl") == base.trainer.num_steps

  def samples_at_validation(t, per_step):
    return [
        s * per_step
        for s in range(1, t.num_steps + 1)
        if evaluation.is_eval_step(t, s)
    ]

  assert samples_at_validation(
      small.trainer, small.data.prompts_per_step
  ) == samples_at_validation(base.trainer, base.data.prompts_per_step)


def test_v2_registers_the_replicates_its_power_needs():
  assert set(parity_v2.NEEDED) == {
      "gspo",
      "batch",
      "aggregation_b",
      "npr_same_a",
      "zvf_same_a",
  }
  assert max(parity_v2.NEEDED.values()) <= parity_v2.REGISTERED_REPLICATES
  # Its points are the sweep's, in the sweep's order.
  assert parity_v2.PLAN.points[0] == "batch8"
  assert set(parity_v2.PLAN.points) == {
      p for c in parity_v2.PLAN.claims for p in (c.first, c.second)
  }


def test_replicates_needed_is_what_parity_v1_computed_for_itself():
  # parity_v1 computes its NEEDED in the plan file (it predates the method
  # and is frozen): the method must agree with it.
  assert parity_v1.PLAN.replicates_needed() == parity_v1.NEEDED


def test_a_plan_takes_only_its_registered_bases():
  with pytest.raises(ValueError, match=r"parity_v2\.py takes 'base="):
    parity_v2.get_config(None)
  with pytest.raises(ValueError, match=r"base 7 is not registered: \(101"):
    parity_v2.get_config("base=7")
  assert parity_v2.get_config("base=110").trainer.warm_start_seed == 110


def test_v3_bases_are_the_third_mends_on_seeds_never_tried():
  for base in parity_v3.BASES + parity_v3.SPARE_BASES[:1]:
    c = parity_v3.get_config(f"base={base}")
    assert warm_start.fingerprint(c, 512) == warm_start.fingerprint(
        warm_start_reliability_v3.get_config(str(base)), 512
    )
  tried = set(warm_start_reliability_v3.SEEDS) | set(
      parity_v2.BASES + parity_v2.SPARE_BASES
  )
  assert not tried & set(parity_v3.BASES + parity_v3.SPARE_BASES)


def test_v3_is_parity_v1s_recipe_but_for_the_warm_start_and_the_pool():
  v1 = sweep_lib.workdir_lib.config_leaves(parity_v1.get_config("base=101"))
  v3 = sweep_lib.workdir_lib.config_leaves(parity_v3.get_config("base=301"))
  changed = {k for k in v1.keys() | v3.keys() if v1.get(k) != v3.get(k)}
  assert changed == {
      "trainer.warm_start_seed",
      "data.builtin_val_seed",
      "data.builtin_num_train",
      "trainer.warm_start_chain_loss_target",
      "trainer.warm_start_chain_max_steps",
      "trainer.warm_start_weight_decay",
  }
  c = parity_v3.get_config("base=301")
  # Twice the prompts the run draws (16 a step for 150 steps).
  assert c.data.builtin_num_train == 4_800
  assert (c.trainer.warm_start_seed, c.data.builtin_val_seed) == (301, 301)
  assert c.trainer.num_steps == parity_v1.STEPS


def test_v3_points_differ_only_in_the_loss_and_power_is_registered():
  v3 = _configs(parity_v3, parity_v3.BASES[0])
  base = sweep_lib.workdir_lib.config_leaves(v3["scalerl"])
  changed = {
      name: {
          k
          for k, v in sweep_lib.workdir_lib.config_leaves(c).items()
          if base.get(k) != v
      }
      for name, c in v3.items()
  }
  assert changed == {
      "scalerl": set(),
      "dapo": {"rl.loss"},
      "gspo": {"rl.loss", "rl.gspo_eps_low", "rl.gspo_eps_high"},
  }
  assert set(parity_v3.NEEDED) == {"loss", "gspo"}
  assert max(parity_v3.NEEDED.values()) <= parity_v3.REGISTERED_REPLICATES


def test_v4_bases_are_the_third_mends_on_seeds_never_tried():
  v4 = _configs(parity_v4, parity_v4.BASES[0])
  mended = warm_start.fingerprint(
      warm_start_reliability_v3.get_config(str(parity_v4.BASES[0])), 512
  )
  # The budget is a point's; the warm start's targets are cut at 41 tokens
  # whatever it is, so every point of a replicate shares the mend's base.
  assert {warm_start.fingerprint(c, 512) for c in v4.values()} == {mended}
  tried = set(warm_start_reliability_v3.SEEDS) | set(
      parity_v2.BASES
      + parity_v2.SPARE_BASES
      + parity_v3.BASES
      + parity_v3.SPARE_BASES
  )
  assert not tried & set(parity_v4.BASES + parity_v4.SPARE_BASES)


def test_v4_is_v3_at_the_short_budget():
  v3 = _configs(parity_v3, parity_v3.BASES[0])
  v4 = _configs(parity_v4, parity_v4.BASES[0])
  assert set(v4) == set(v3) == set(parity_v4.PLAN.points)
  for name, c in v4.items():
    a = sweep_lib.workdir_lib.config_leaves(v3[name])
    b = sweep_lib.workdir_lib.config_leaves(c)
    changed = {k for k in a.keys() | b.keys() if a.get(k) != b.get(k)}
    assert changed == {
        "trainer.warm_start_seed",
        "data.builtin_val_seed",
        "sampling.max_new_tokens",
        "buffer.decode_steps_per_train_step",
    }
    assert c.sampling.max_new_tokens == 25
    assert c.trainer.warm_start_max_new_tokens == 41
    assert c.data.builtin_val_seed == parity_v4.BASES[0]


def test_v4_registers_v3s_claims_with_its_sd_and_the_replicates_they_need():
  assert [c.name for c in parity_v4.CLAIMS] == [
      c.name for c in parity_v3.CLAIMS
  ]
  for c4, c3 in zip(parity_v4.CLAIMS, parity_v3.CLAIMS):
    assert c4.sd == (parity_v4.SD_A if c3.statistic == "A_fit" else c3.sd)
  # 6 pinned pairs uncorrected at 0.02 and sd 0.012 (7 at Holm's alpha / 2).
  assert parity_v4.NEEDED == {"loss": 6, "gspo": 6}
  assert parity_v4.REGISTERED_REPLICATES == 12
