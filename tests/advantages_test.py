"""Group-relative advantages: hand-worked normalisations and
zero-variance groups.

Shapes: P prompts, G completions per prompt, B = P * G, T tokens.
"""

import functools
import itertools

import jax
import numpy as np
import pytest

from configs import scalerl
from scalerl_jax import config as config_lib
from scalerl_jax.rl import advantages

# Three prompts x four completions; rewards in {0, 1}.
#   prompt 0: [1, 0, 0, 0]  mean 0.25  centred [0.75, -0.25, -0.25, -0.25]
#             std sqrt(0.25 * 0.75) = 0.4330127,
#             sum of squares 0.5625 + 3 * 0.0625 = 0.75
#   prompt 1: [1, 1, 0, 0]  mean 0.5   centred [0.5, 0.5, -0.5, -0.5]   std 0.5,
#             sum of squares 4 * 0.25 = 1
#   prompt 2: [1, 1, 1, 1]  zero variance: advantage 0 under every norm
#   batch std of the centred advantages (their mean is 0, sum of squares 1.75):
#     filter off, all 12 completions: sqrt(1.75 / 12) = sqrt(7 / 48) = 0.3818813
#     filter on, the 8 of prompts 0 and 1:
#       sqrt(1.75 / 8) = sqrt(7 / 32) = 0.4677072
_REWARDS_PxG = np.array([[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1]], np.float32)


# prompt: centred / own std, whatever the filter
#   0.75 / 0.4330127 = 1.7320508, -0.25 / 0.4330127 = -0.5773503;
#   +-0.5 / 0.5 = +-1
_PROMPT_NORM_PxG = [
    [1.7320508, -0.5773503, -0.5773503, -0.5773503],
    [1.0, 1.0, -1.0, -1.0],
    [0.0, 0.0, 0.0, 0.0],
]


@pytest.mark.parametrize(
    "norm,zero_variance_filter,expected",
    [
        ("prompt", True, _PROMPT_NORM_PxG),
        ("prompt", False, _PROMPT_NORM_PxG),
        # batch, filter on: centred / 0.4677072
        #   0.75 / .. = 1.6035675, -0.25 / .. = -0.5345225,
        #   +-0.5 / .. = +-1.0690450
        (
            "batch",
            True,
            [
                [1.6035675, -0.5345225, -0.5345225, -0.5345225],
                [1.0690450, 1.0690450, -1.0690450, -1.0690450],
                [0.0, 0.0, 0.0, 0.0],
            ],
        ),
        # batch, filter off: centred / 0.3818813
        #   0.75 / .. = 1.9639610, -0.25 / .. = -0.6546537,
        #   +-0.5 / .. = +-1.3093073
        (
            "batch",
            False,
            [
                [1.9639610, -0.6546537, -0.6546537, -0.6546537],
                [1.3093073, 1.3093073, -1.3093073, -1.3093073],
                [0.0, 0.0, 0.0, 0.0],
            ],
        ),
        (
            "none",
            True,
            [
                [0.75, -0.25, -0.25, -0.25],
                [0.5, 0.5, -0.5, -0.5],
                [0.0, 0.0, 0.0, 0.0],
            ],
        ),
    ],
)
def test_hand_worked_normalisation(norm, zero_variance_filter, expected):
  fn = functools.partial(
      advantages.group_advantages,
      norm=norm,
      zero_variance_filter=zero_variance_filter,
  )
  for adv_PxG, zero_var_P in (fn(_REWARDS_PxG), jax.jit(fn)(_REWARDS_PxG)):
    np.testing.assert_allclose(adv_PxG, expected, rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(zero_var_P, [False, False, True])


@pytest.mark.parametrize("constant", [0.0, 1.0])
def test_filtered_groups_do_not_change_the_kept_advantages(constant):
  # With the filter on, appending zero-variance groups (dropped from the loss)
  # leaves the other groups' advantages as they were; with it off, their
  # zeros join the batch and raise every kept advantage (std shrinks).
  rewards_PxG = np.concatenate(
      [_REWARDS_PxG[:2], np.full((5, 4), constant, np.float32)]
  )
  kept_PxG, _ = advantages.group_advantages(
      _REWARDS_PxG[:2], "batch", zero_variance_filter=True
  )
  on_PxG, _ = advantages.group_advantages(
      rewards_PxG, "batch", zero_variance_filter=True
  )
  np.testing.assert_allclose(on_PxG[:2], kept_PxG, rtol=1e-6)
  off_PxG, _ = advantages.group_advantages(
      rewards_PxG, "batch", zero_variance_filter=False
  )
  # 7 groups of 4 instead of 2: the std falls by sqrt(2 / 7), the advantages
  # grow by sqrt(7 / 2) = 1.8708287.
  np.testing.assert_allclose(
      off_PxG[:2], 1.8708287 * np.asarray(kept_PxG), rtol=1e-6
  )


def test_norms_are_the_config_choices():
  for norm in advantages.NORMS.names():
    config = scalerl.get_config()
    config.rl.adv_norm = norm
    config_lib.validate(config)
  config.rl.adv_norm = "group"
  with pytest.raises(
      config_lib.ConfigError, match="rl.adv_norm: 'group' is not one of"
  ):
    config_lib.validate(config)
  with pytest.raises(ValueError, match="rl.adv_norm: 'group'"):
    advantages.group_advantages(
        _REWARDS_PxG, "group", zero_variance_filter=True
    )


@pytest.mark.parametrize("norm", advantages.NORMS.names())
@pytest.mark.parametrize("zero_variance_filter", [True, False])
@pytest.mark.parametrize("low,high", [(0.0, 1.0), (-1.0, 1.0)])
def test_every_reward_pattern_is_finite_and_zero_variance_is_flagged(
    norm, zero_variance_filter, low, high
):
  # All 16 patterns of G = 4 binary rewards in one batch, then each alone (so
  # the batch std of an all-equal batch is 0 too).
  patterns_PxG = np.array(
      list(itertools.product((low, high), repeat=4)), np.float32
  )
  for rewards_PxG in [patterns_PxG] + [row[None] for row in patterns_PxG]:
    adv_PxG, zero_var_P = advantages.group_advantages(
        rewards_PxG, norm, zero_variance_filter=zero_variance_filter
    )
    assert np.all(np.isfinite(adv_PxG))
    expected_zero_var_P = np.all(rewards_PxG == rewards_PxG[:, :1], axis=1)
    np.testing.assert_array_equal(zero_var_P, expected_zero_var_P)
    np.testing.assert_array_equal(np.asarray(adv_PxG)[expected_zero_var_P], 0.0)
    assert np.all(np.asarray(adv_PxG)[~expected_zero_var_P] != 0.0)
    np.testing.assert_allclose(np.sum(adv_PxG, axis=1), 0.0, atol=1e-6)


@pytest.mark.parametrize("zero_variance_filter", [True, False])
@pytest.mark.parametrize(
    "norm,scale", [("prompt", 1.0), ("batch", 1.0), ("none", 2.0)]
)
def test_plus_minus_one_rewards_are_an_affine_image_of_zero_one(
    norm, scale, zero_variance_filter
):
  # r' = 2 r - 1 doubles centred rewards and stds, so normalised advantages
  # are unchanged and unnormalised ones double.
  adv01_PxG, zero01_P = advantages.group_advantages(
      _REWARDS_PxG, norm, zero_variance_filter=zero_variance_filter
  )
  adv_pm_PxG, zero_pm_P = advantages.group_advantages(
      2 * _REWARDS_PxG - 1, norm, zero_variance_filter=zero_variance_filter
  )
  np.testing.assert_allclose(
      adv_pm_PxG, scale * np.asarray(adv01_PxG), rtol=1e-6
  )
  np.testing.assert_array_equal(zero01_P, zero_pm_P)


def test_non_binary_equal_rewards_give_exact_zero():
  # mean([0.1] * 3) is not exactly 0.1 in float; the flag still forces 0.
  adv_PxG, zero_var_P = advantages.group_advantages(
      np.full((1, 3), 0.1, np.float32), "none", zero_variance_filter=False
  )
  np.testing.assert_array_equal(adv_PxG, 0.0)
  assert bool(zero_var_P[0])


def test_group_ids_and_drop_groups_follow_the_prompt_major_layout():
  np.testing.assert_array_equal(advantages.group_ids(3, 2), [0, 0, 1, 1, 2, 2])
  mask_BxS = np.array(
      [[1, 1], [1, 0], [1, 1], [1, 1], [1, 0], [0, 0]], np.float32
  )
  dropped_BxS = advantages.drop_groups(mask_BxS, np.array([False, True, False]))
  np.testing.assert_array_equal(
      dropped_BxS, [[1, 1], [1, 0], [0, 0], [0, 0], [1, 0], [0, 0]]
  )
  assert dropped_BxS.dtype == mask_BxS.dtype
  with pytest.raises(ValueError, match="not a multiple"):
    advantages.drop_groups(mask_BxS, np.array([False] * 4))
