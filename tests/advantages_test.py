"""Group-relative advantages: hand-worked normalisations and zero-variance groups.

Shapes: P prompts, G completions per prompt, B = P * G, T tokens.
"""

import itertools

import jax
import numpy as np
import pytest

from configs import scalerl
from scalerl_jax import config as config_lib
from scalerl_jax.rl import advantages

# Three prompts x four completions; rewards in {0, 1}.
#   prompt 0: [1, 0, 0, 0]  mean 0.25  centred [0.75, -0.25, -0.25, -0.25]
#             std sqrt(0.25 * 0.75) = 0.4330127
#   prompt 1: [1, 1, 0, 0]  mean 0.5   centred [0.5, 0.5, -0.5, -0.5]   std 0.5
#   prompt 2: [1, 1, 1, 1]  zero variance: advantage 0 under every norm
#   batch: 7 ones in 12, std sqrt(7/12 * 5/12) = sqrt(35) / 12 = 0.4930066
_REWARDS_PxG = np.array([[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1]], np.float32)


@pytest.mark.parametrize("norm,expected", [
    # prompt: centred / own std
    #   0.75 / 0.4330127 = 1.7320508, -0.25 / 0.4330127 = -0.5773503; +-0.5 / 0.5 = +-1
    ("prompt", [[1.7320508, -0.5773503, -0.5773503, -0.5773503],
                [1.0, 1.0, -1.0, -1.0],
                [0.0, 0.0, 0.0, 0.0]]),
    # batch: centred / 0.4930066
    #   0.75 / 0.4930066 = 1.5212777, -0.25 / .. = -0.5070926, +-0.5 / .. = +-1.0141851
    ("batch", [[1.5212777, -0.5070926, -0.5070926, -0.5070926],
               [1.0141851, 1.0141851, -1.0141851, -1.0141851],
               [0.0, 0.0, 0.0, 0.0]]),
    ("none", [[0.75, -0.25, -0.25, -0.25],
              [0.5, 0.5, -0.5, -0.5],
              [0.0, 0.0, 0.0, 0.0]]),
])
def test_hand_worked_normalisation(norm, expected):
  adv_PxG, zero_var_P = advantages.group_advantages(_REWARDS_PxG, norm)
  np.testing.assert_allclose(adv_PxG, expected, rtol=1e-6, atol=1e-7)
  np.testing.assert_array_equal(zero_var_P, [False, False, True])


def test_norms_match_config_choices():
  assert set(advantages.NORMS) == set(config_lib.SCHEMA["rl.adv_norm"].choices)
  assert scalerl.get_config().rl.adv_norm in advantages.NORMS
  with pytest.raises(ValueError, match="rl.adv_norm: 'group'"):
    advantages.group_advantages(_REWARDS_PxG, "group")


@pytest.mark.parametrize("norm", advantages.NORMS)
@pytest.mark.parametrize("low,high", [(0.0, 1.0), (-1.0, 1.0)])
def test_every_reward_pattern_is_finite_and_zero_variance_is_flagged(norm, low, high):
  # All 16 patterns of G = 4 binary rewards in one batch, then each alone (so
  # the batch std of an all-equal batch is 0 too).
  patterns_PxG = np.array(list(itertools.product((low, high), repeat=4)), np.float32)
  constant_P = np.all(patterns_PxG == patterns_PxG[:, :1], axis=1)
  assert constant_P.sum() == 2
  for rewards_PxG in [patterns_PxG] + [row[None] for row in patterns_PxG]:
    adv_PxG, zero_var_P = advantages.group_advantages(rewards_PxG, norm)
    assert np.all(np.isfinite(adv_PxG))
    expected_zero_var_P = np.all(rewards_PxG == rewards_PxG[:, :1], axis=1)
    np.testing.assert_array_equal(zero_var_P, expected_zero_var_P)
    np.testing.assert_array_equal(np.asarray(adv_PxG)[expected_zero_var_P], 0.0)
    assert np.all(np.asarray(adv_PxG)[~expected_zero_var_P] != 0.0)
    np.testing.assert_allclose(np.sum(adv_PxG, axis=1), 0.0, atol=1e-6)


@pytest.mark.parametrize("norm,scale", [("prompt", 1.0), ("batch", 1.0), ("none", 2.0)])
def test_plus_minus_one_rewards_are_an_affine_image_of_zero_one(norm, scale):
  # r' = 2 r - 1 doubles centred rewards and stds, so normalised advantages
  # are unchanged and unnormalised ones double.
  adv01_PxG, zero01_P = advantages.group_advantages(_REWARDS_PxG, norm)
  adv_pm_PxG, zero_pm_P = advantages.group_advantages(2 * _REWARDS_PxG - 1, norm)
  np.testing.assert_allclose(adv_pm_PxG, scale * np.asarray(adv01_PxG), rtol=1e-6)
  np.testing.assert_array_equal(zero01_P, zero_pm_P)


def test_non_binary_equal_rewards_give_exact_zero():
  # mean([0.1] * 3) is not exactly 0.1 in float; the flag still forces 0.
  adv_PxG, zero_var_P = advantages.group_advantages(np.full((1, 3), 0.1, np.float32), "none")
  np.testing.assert_array_equal(adv_PxG, 0.0)
  assert bool(zero_var_P[0])


def test_group_ids_and_drop_groups_follow_the_prompt_major_layout():
  np.testing.assert_array_equal(advantages.group_ids(3, 2), [0, 0, 1, 1, 2, 2])
  mask_BxT = np.array([[1, 1], [1, 0], [1, 1], [1, 1], [1, 0], [0, 0]], np.float32)
  dropped_BxT = advantages.drop_groups(mask_BxT, np.array([False, True, False]))
  np.testing.assert_array_equal(dropped_BxT, [[1, 1], [1, 0], [0, 0], [0, 0], [1, 0], [0, 0]])
  assert dropped_BxT.dtype == mask_BxT.dtype
  with pytest.raises(ValueError, match="not a multiple"):
    advantages.drop_groups(mask_BxT, np.array([False] * 4))


@pytest.mark.parametrize("norm", advantages.NORMS)
def test_jit_matches_no_jit(norm):
  rewards_PxG = np.random.RandomState(0).randint(0, 2, (6, 4)).astype(np.float32)
  jitted = jax.jit(advantages.group_advantages, static_argnums=1)(rewards_PxG, norm)
  eager = advantages.group_advantages(rewards_PxG, norm)
  np.testing.assert_allclose(jitted[0], eager[0], rtol=1e-6)
  np.testing.assert_array_equal(jitted[1], eager[1])
