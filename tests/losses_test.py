"""Losses and aggregations pinned by hand-worked numbers,
gradients and properties.

Shapes: B completions, T tokens, P prompt groups, V vocabulary.

The hand batch (2 prompts x 2 completions, lengths 3, 1, 2, 1; T = 3; config
defaults eps_clip 0.2, eps_low 0.2, eps_high 0.28, gspo eps 3e-4 / 4e-4,
cispo_eps_max 4):

  completion  prompt  A     rho = pi_train / pi_gen    log pi_train
  c0          0       +1    1.0   5.0   1.1            -1.0  -2.0  -0.5
  c1          0       -1    0.5   pad   pad            -1.5
  c2          1       +0.5  1.25  0.9   pad            -1.0  -0.5
  c3          1       -0.5  2.0   pad   pad            -2.0

rho = 5.0 is above the CISPO cap and the upper clips; rho = 0.5 is below the
lower clip; rho = 1.25 lies between the GRPO (1.2) and DAPO (1.28) upper
clips; rho = 2.0 with A < 0 is left unclipped by PPO's pessimistic min.
Padding carries rho = 100 so that any leak through the mask shows. Tokens:
prompt 0 has 4, prompt 1 has 3, the batch 7.

Aggregations of a per-token objective J (loss = -aggregate):
  token  = sum J / 7
  sample = (mean J_c0 + mean J_c1 + mean J_c2 + mean J_c3) / 4
  prompt = ((sum J_c0 + sum J_c1) / 4 + (sum J_c2 + sum J_c3) / 3) / 2
"""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import scalerl
from scalerl_jax import config as config_lib
from scalerl_jax.rl import losses

LOSSES = ("grpo", "dapo", "gspo", "gspo_token", "cispo")

_LENGTHS = (3, 1, 2, 1)
_MASK_BxS = np.array([[i < n for i in range(3)] for n in _LENGTHS])
_RATIO_BxS = np.array(
    [
        [1.0, 5.0, 1.1],
        [0.5, 100.0, 100.0],
        [1.25, 0.9, 100.0],
        [2.0, 100.0, 100.0],
    ]
)
_LOGP_BxS = np.array(
    [
        [-1.0, -2.0, -0.5],
        [-1.5, -7.0, -7.0],
        [-1.0, -0.5, -7.0],
        [-2.0, -7.0, -7.0],
    ],
    np.float32,
)
_GEN_LOGP_BxS = (_LOGP_BxS - np.log(_RATIO_BxS)).astype(np.float32)
_ADV_B = np.array([1.0, -1.0, 0.5, -0.5], np.float32)
_GROUP_B = np.array([0, 0, 1, 1], np.int32)

# Hand-worked losses (-aggregate of J), the table of the closing note.
#
# grpo, clip [0.8, 1.2]: J = min(rho A, clip(rho) A)
#   c0 [1, min(5, 1.2) = 1.2, 1.1]    sum 3.3   mean 1.1
#   c1 [min(-0.5, -0.8) = -0.8]       sum -0.8  mean -0.8
#   c2 [min(.625, .6) = .6, .45]      sum 1.05  mean 0.525
#   c3 [min(-1.0, -0.6) = -1.0]       sum -1.0  mean -1.0
#   token  -(3.3 - 0.8 + 1.05 - 1.0) / 7              = -2.55 / 7 = -0.3642857
#   sample -(1.1 - 0.8 + 0.525 - 1.0) / 4             = 0.175 / 4 = 0.0437500
#   prompt -((3.3 - 0.8) / 4 + (1.05 - 1.0) / 3) / 2
#          = -(0.625 + 0.0166667) / 2                 = -0.3208333
#
# dapo, clip [0.8, 1.28]: as grpo but rho = 1.25 is no longer clipped.
#   c0 [1, 1.28, 1.1]  sum 3.38  mean 1.1266667
#   c1 [-0.8]; c2 [0.625, 0.45] sum 1.075 mean 0.5375; c3 [-1.0]
#   token  -(3.38 - 0.8 + 1.075 - 1.0) / 7       = -2.655 / 7 = -0.3792857
#   sample -(1.1266667 - 0.8 + 0.5375 - 1.0) / 4 = 0.1358333 / 4 = 0.0339583
#   prompt -((3.38 - 0.8) / 4 + (1.075 - 1.0) / 3) / 2
#          = -(0.645 + 0.025) / 2                = -0.335
#
# gspo and gspo_token, clip [0.9997, 1.0004] on s = exp(mean log rho):
#   s0 = 5.5^(1/3) = 1.7651742 -> min(1.765, 1.0004) = 1.0004 on 3 tokens
#   s1 = 0.5                   -> min(-0.5, -0.9997) = -0.9997 on 1 token
#   s2 = sqrt(1.125) = 1.06066 -> min(0.53033, 0.5002) = 0.5002 on 2 tokens
#   s3 = 2.0                   -> min(-1.0, -0.5002) = -1.0 on 1 token
#   token  -(3 * 1.0004 - 0.9997 + 2 * 0.5002 - 1.0) / 7
#          = -2.0019 / 7                         = -0.2859857
#   sample -(1.0004 - 0.9997 + 0.5002 - 1.0) / 4 = 0.4991 / 4 = 0.1247750
#   prompt -((3.0012 - 0.9997) / 4 + (1.0004 - 1.0) / 3) / 2
#          = -(0.500375 + 0.0001333) / 2         = -0.2502542
#
# cispo, eps_max 4: J = min(rho, 4) A log pi
#   c0 [1 * -1, 4 * -2, 1.1 * -0.5] = [-1, -8, -0.55]
#                                     sum -9.55  mean -3.1833333
#   c1 [0.5 * -1 * -1.5 = 0.75]       sum 0.75
#   c2 [1.25 * 0.5 * -1, 0.9 * 0.5 * -0.5] = [-.625, -.225]
#                                     sum -0.85  mean -0.425
#   c3 [2 * -0.5 * -2 = 2.0]          sum 2.0
#   token  -(-9.55 + 0.75 - 0.85 + 2.0) / 7       = 7.65 / 7 = 1.0928571
#   sample -(-3.1833333 + 0.75 - 0.425 + 2.0) / 4 = 0.8583333 / 4 = 0.2145833
#   prompt -((-9.55 + 0.75) / 4 + (-0.85 + 2.0) / 3) / 2
#          = -(-2.2 + 0.3833333) / 2              = 0.9083333
EXPECTED_LOSS = {
    "grpo": {"token": -0.3642857, "sample": 0.0437500, "prompt": -0.3208333},
    "dapo": {"token": -0.3792857, "sample": 0.0339583, "prompt": -0.3350000},
    "gspo": {"token": -0.2859857, "sample": 0.1247750, "prompt": -0.2502542},
    "gspo_token": {
        "token": -0.2859857,
        "sample": 0.1247750,
        "prompt": -0.2502542,
    },
    "cispo": {"token": 1.0928571, "sample": 0.2145833, "prompt": 0.9083333},
}

# Metrics over the 7 tokens. Token ratios sum to 1 + 5 + 1.1 + 0.5 + 1.25 + 0.9
# + 2 = 11.75, mean 1.6785714; GSPO counts s_i once per token:
# (3 * 1.7651742 + 0.5 + 2 * 1.0606602 + 2) / 7 = 1.4166918, max s3 = 2.
#   grpo: clipped high c0 rho 5, c2 rho 1.25 (A > 0) = 2/7;
#         low c1 rho 0.5 = 1/7.
#   dapo: high only rho 5 = 1/7; low 1/7.
#   gspo: high c0 (3 tokens) + c2 (2 tokens) = 5/7; low c1 = 1/7.
#   cispo: nothing clipped; rho 5 > 4 capped = 1/7.
EXPECTED_METRICS = {
    "grpo": dict(
        clip_frac_low=1 / 7,
        clip_frac_high=2 / 7,
        ratio_mean=11.75 / 7,
        ratio_max=5.0,
        capped_frac=0.0,
    ),
    "dapo": dict(
        clip_frac_low=1 / 7,
        clip_frac_high=1 / 7,
        ratio_mean=11.75 / 7,
        ratio_max=5.0,
        capped_frac=0.0,
    ),
    "gspo": dict(
        clip_frac_low=1 / 7,
        clip_frac_high=5 / 7,
        ratio_mean=1.4166918,
        ratio_max=2.0,
        capped_frac=0.0,
    ),
    "gspo_token": dict(
        clip_frac_low=1 / 7,
        clip_frac_high=5 / 7,
        ratio_mean=1.4166918,
        ratio_max=2.0,
        capped_frac=0.0,
    ),
    "cispo": dict(
        clip_frac_low=0.0,
        clip_frac_high=0.0,
        ratio_mean=11.75 / 7,
        ratio_max=5.0,
        capped_frac=1 / 7,
    ),
}


def _params(loss, aggregation="token", **rl_overrides):
  config = scalerl.get_config()
  config.rl.loss = loss
  config.rl.aggregation = aggregation
  config.rl.update(rl_overrides)
  return losses.LossParams.from_config(config.rl)


def _hand_loss(params, logp_BxS=_LOGP_BxS, mask_BxS=_MASK_BxS, **kwargs):
  return losses.compute_loss(
      params,
      jnp.asarray(logp_BxS),
      _GEN_LOGP_BxS,
      _ADV_B,
      mask_BxS,
      _GROUP_B,
      2,
      **kwargs,
  )


def test_the_config_accepts_exactly_the_registered_losses_and_aggregations():
  assert losses.LOSSES.names() == tuple(sorted(LOSSES))
  for field, names in (
      ("loss", losses.LOSSES.names()),
      ("aggregation", losses.AGGREGATIONS.names()),
  ):
    for name in names:
      config = scalerl.get_config()
      config.rl[field] = name
      config_lib.validate(config)
    config.rl[field] = "ppo"
    with pytest.raises(
        config_lib.ConfigError, match=f"rl.{field}: 'ppo' is not one of"
    ):
      config_lib.validate(config)


def test_params_read_each_loss_hyperparameters_from_config():
  assert _params("grpo").hparams == (("eps_clip", 0.2),)
  assert _params("dapo", eps_high=0.3).hparams == (
      ("eps_low", 0.2),
      ("eps_high", 0.3),
  )
  assert _params("gspo_token").hparams == (
      ("gspo_eps_low", 3e-4),
      ("gspo_eps_high", 4e-4),
  )
  assert _params("cispo", cispo_eps_max=8.0, tis_cap=2.0) == losses.LossParams(
      "cispo", "token", (("cispo_eps_max", 8.0),), 2.0
  )


def test_unknown_names_and_duplicate_registration_raise():
  with pytest.raises(ValueError, match="rl.loss: 'ppo'"):
    losses.LOSSES.get("ppo")
  with pytest.raises(ValueError, match="already registered"):
    losses.LOSSES.register("cispo")(losses.cispo)
  with pytest.raises(ValueError, match="rl.aggregation: 'seq'"):
    losses.aggregate(
        jnp.ones((1, 1)), jnp.ones((1, 1)), jnp.zeros(1, jnp.int32), 1, "seq"
    )


@pytest.mark.parametrize("aggregation", losses.AGGREGATIONS.names())
@pytest.mark.parametrize("loss", LOSSES)
def test_hand_worked_loss(loss, aggregation):
  # Numbers worked out in the EXPECTED_LOSS comment above.
  value, metrics = _hand_loss(_params(loss, aggregation))
  np.testing.assert_allclose(
      value, EXPECTED_LOSS[loss][aggregation], rtol=2e-6, atol=1e-7
  )
  assert set(metrics) == set(EXPECTED_METRICS[loss])
  for name, expected in EXPECTED_METRICS[loss].items():
    np.testing.assert_allclose(
        metrics[name], expected, rtol=2e-6, atol=1e-7, err_msg=name
    )


@pytest.mark.parametrize(
    "loss,expected",
    [
        # tis_cap 3: each token's J is scaled by min(1, 3 / rho), i.e. by 0.6 on
        # the rho = 5 token of c0 and by 1 everywhere else.
        # grpo: c0 [1, 1.2 * 0.6 = 0.72, 1.1], c1 [-0.8], c2 [0.6, 0.45],
        #   c3 [-1.0]
        #   token -(2.82 - 0.8 + 1.05 - 1.0) / 7 = -2.07 / 7 = -0.2957143
        ("grpo", -0.2957143),
        # dapo: c0 [1, 1.28 * 0.6 = 0.768, 1.1], c1 [-0.8],
        #       c2 [0.625, 0.45], c3 [-1.0]
        #   token -(2.868 - 0.8 + 1.075 - 1.0) / 7 = -2.143 / 7 = -0.3061429
        ("dapo", -0.3061429),
        # gspo(_token): c0 1.0004 x [1, 0.6, 1] = 2.60104,
        #               c1 -0.9997, c2 1.0004, c3 -1.0
        #   token -(2.60104 - 0.9997 + 1.0004 - 1.0) / 7 = -1.60174 / 7
        #     = -0.2288200
        ("gspo", -0.2288200),
        ("gspo_token", -0.2288200),
        # cispo: c0 [-1, -8 * 0.6 = -4.8, -0.55], c1 [0.75],
        #        c2 [-0.625, -0.225], c3 [2.0]
        #   token -(-6.35 + 0.75 - 0.85 + 2.0) / 7 = 4.45 / 7 = 0.6357143
        ("cispo", 0.6357143),
    ],
)
def test_truncated_importance_sampling_correction(loss, expected):
  value, metrics = _hand_loss(_params(loss, tis_cap=3.0))
  np.testing.assert_allclose(value, expected, rtol=2e-6)
  # The loss's own ratios are unchanged.
  for name in ("ratio_mean", "ratio_max"):
    np.testing.assert_allclose(
        metrics[name], EXPECTED_METRICS[loss][name], rtol=1e-6
    )
  np.testing.assert_allclose(metrics["tis_ratio_mean"], 11.75 / 7, rtol=1e-6)
  np.testing.assert_allclose(metrics["tis_ratio_max"], 5.0, rtol=1e-6)
  # Only rho 5 > 3.
  np.testing.assert_allclose(metrics["tis_capped_frac"], 1 / 7, rtol=1e-6)


def test_tis_clips_against_the_generator_and_truncates_the_weight():
  # DAPO with tis_cap 1.5, token aggregation: d(-sum J / 7) / d log pi is
  #   -min(rho, 1.5) A / 7 where the clip (taken against the generator) lets
  #   the gradient through, 0 where it binds:
  #   c0: rho 1 -> -1/7; rho 5 > 1.28 with A > 0: clipped -> 0 (not -1.5/7,
  #       what a ratio against the trainer's own log-probs gave);
  #       rho 1.1 -> -1.1/7
  #   c1: rho 0.5 < 0.8 with A < 0: clipped -> 0
  #   c2: rho 1.25 -> -0.625/7; rho 0.9 -> -0.45/7
  #   c3: rho 2, A -0.5, unclipped: -min(2, 1.5) * -0.5 / 7 = 0.75/7
  #       (1/7 without TIS)
  grad_BxS = jax.grad(
      lambda lp: _hand_loss(_params("dapo", tis_cap=1.5), lp)[0]
  )(_LOGP_BxS)
  expected = (
      np.array(
          [
              [-1.0, 0.0, -1.1],
              [0.0, 0.0, 0.0],
              [-0.625, -0.45, 0.0],
              [0.75, 0.0, 0.0],
          ]
      )
      / 7
  )
  np.testing.assert_allclose(grad_BxS, expected, rtol=2e-6, atol=1e-9)


@pytest.mark.parametrize(
    "aggregation,expected",
    [
        # Prompt 1 dropped (mask zeroed): only c0, c1 of the CISPO table remain.
        ("token", 2.2),  # -(-9.55 + 0.75) / 4
        ("sample", 1.2166667),  # -(-3.1833333 + 0.75) / 2
        ("prompt", 2.2),  # -((-9.55 + 0.75) / 4) / 1: one remaining prompt
    ],
)
def test_dropped_group_leaves_numerators_and_denominators(
    aggregation, expected
):
  mask_BxS = _MASK_BxS & (_GROUP_B != 1)[:, None]
  value, _ = _hand_loss(_params("cispo", aggregation), mask_BxS=mask_BxS)
  np.testing.assert_allclose(value, expected, rtol=2e-6)


@pytest.mark.parametrize("aggregation", losses.AGGREGATIONS.names())
@pytest.mark.parametrize("loss", LOSSES)
def test_everything_masked_gives_zero_loss_and_gradient(loss, aggregation):
  mask_BxS = np.zeros_like(_MASK_BxS)
  value, grad_BxS = jax.value_and_grad(
      lambda lp: _hand_loss(_params(loss, aggregation), lp, mask_BxS)[0]
  )(_LOGP_BxS)
  assert value == 0.0
  np.testing.assert_array_equal(grad_BxS, 0.0)


def test_padding_log_probs_never_leak():
  logp_BxS = np.where(_MASK_BxS, _LOGP_BxS, -np.inf).astype(np.float32)
  for loss in LOSSES:
    value, grad_BxS = jax.value_and_grad(
        lambda lp, loss=loss: _hand_loss(_params(loss), lp)[0]
    )(logp_BxS)
    np.testing.assert_allclose(value, EXPECTED_LOSS[loss]["token"], rtol=2e-6)
    assert np.all(np.isfinite(grad_BxS)), loss


@pytest.mark.parametrize(
    "loss,expected_grad",
    [
        # d(-sum J / 7) / d log pi = -rho A / 7 on unclipped tokens
        # (d rho = rho d log pi), exactly 0 where the clip binds in the
        # direction of the advantage.
        (
            "grpo",
            [
                [-1.0 / 7, 0.0, -1.1 / 7],  # rho 5 > 1.2, A > 0: clipped
                [0.0, 0.0, 0.0],  # rho 0.5 < 0.8, A < 0: clipped
                [0.0, -0.45 / 7, 0.0],  # rho 1.25 > 1.2, A > 0: clipped
                # rho 2, A < 0: not clipped (-2 * -0.5 / 7)
                [1.0 / 7, 0.0, 0.0],
            ],
        ),
        (
            "dapo",
            [
                [-1.0 / 7, 0.0, -1.1 / 7],
                [0.0, 0.0, 0.0],
                [-0.625 / 7, -0.45 / 7, 0.0],  # rho 1.25 < 1.28: not clipped
                [1.0 / 7, 0.0, 0.0],
            ],
        ),
        # GSPO: sequences c0, c1, c2 are clipped whole; c3 (s = 2, A < 0) is
        # not:
        # d(-J3 / 7) / d log pi = -s A / 7 = 1 / 7.
        ("gspo", [[0.0] * 3, [0.0] * 3, [0.0] * 3, [1.0 / 7, 0.0, 0.0]]),
        ("gspo_token", [[0.0] * 3, [0.0] * 3, [0.0] * 3, [1.0 / 7, 0.0, 0.0]]),
    ],
)
def test_ppo_clip_gradient(loss, expected_grad):
  grad_BxS = jax.grad(lambda lp: _hand_loss(_params(loss), lp)[0])(_LOGP_BxS)
  np.testing.assert_allclose(grad_BxS, expected_grad, rtol=2e-6, atol=1e-9)


def _random_batch(
    seed, num_prompts=3, generations=3, length=6, max_log_ratio=2.0
):
  """Random lengths in [1, T], advantages, log-probs and ratios up to e^2."""
  rng = np.random.RandomState(seed)
  batch = num_prompts * generations
  lengths_B = rng.randint(1, length + 1, batch)
  mask_BxS = np.arange(length)[None, :] < lengths_B[:, None]
  logp_BxS = -rng.exponential(1.0, (batch, length)).astype(np.float32)
  log_ratio_BxS = rng.uniform(-max_log_ratio, max_log_ratio, (batch, length))
  gen_logp_BxS = (logp_BxS - log_ratio_BxS).astype(np.float32)
  adv_B = rng.normal(size=batch).astype(np.float32)
  group_B = np.repeat(np.arange(num_prompts, dtype=np.int32), generations)
  return logp_BxS, gen_logp_BxS, adv_B, mask_BxS, group_B


def _reference_denominator_BxS(mask_BxS, group_B, aggregation):
  """N of each token: the factor 1 / N it gets in each
  aggregation (numpy loops)."""
  denom_BxS = np.zeros(mask_BxS.shape)
  lengths = mask_BxS.sum(axis=1)
  for b in range(mask_BxS.shape[0]):
    if aggregation == "token":
      denom_BxS[b] = mask_BxS.sum()
    elif aggregation == "sample":
      denom_BxS[b] = lengths[b] * np.count_nonzero(lengths)
    else:
      group_tokens = {
          g: lengths[group_B == g].sum() for g in set(group_B.tolist())
      }
      live_groups = sum(1 for n in group_tokens.values() if n > 0)
      denom_BxS[b] = group_tokens[group_B[b]] * live_groups
  return denom_BxS


@pytest.mark.parametrize("aggregation", losses.AGGREGATIONS.names())
def test_cispo_gradient_is_capped_weight_times_reinforce(aggregation):
  # Through a softmax policy: log pi = log_softmax(logits)[token], so
  # d loss / d logits = -sg(min(rho, 4)) A / N * (onehot(token) - softmax).
  num_prompts, generations, length, vocab = 3, 2, 5, 7
  _, gen_logp_BxS, adv_B, mask_BxS, group_B = _random_batch(
      1, num_prompts, generations, length
  )
  mask_BxS[group_B == 2] = False  # A dropped group must not count in any N.
  rng = np.random.RandomState(2)
  logits_BxTxV = rng.normal(
      size=(num_prompts * generations, length, vocab)
  ).astype(np.float32)
  tokens_BxS = rng.randint(0, vocab, (num_prompts * generations, length))
  params = _params("cispo", aggregation)

  def loss_fn(logits):
    logp_BxS = jnp.take_along_axis(
        jax.nn.log_softmax(logits), jnp.asarray(tokens_BxS)[..., None], axis=-1
    )[..., 0]
    return losses.compute_loss(
        params, logp_BxS, gen_logp_BxS, adv_B, mask_BxS, group_B, num_prompts
    )[0]

  logp_BxS = np.take_along_axis(
      jax.nn.log_softmax(logits_BxTxV), tokens_BxS[..., None], axis=-1
  )[..., 0]
  weight_BxS = np.minimum(np.exp(logp_BxS - gen_logp_BxS), 4.0)
  assert np.any(weight_BxS[mask_BxS] == 4.0) and np.any(
      weight_BxS[mask_BxS] < 1.0
  )
  coef_BxS = np.where(mask_BxS, -weight_BxS * adv_B[:, None], 0.0) / np.maximum(
      _reference_denominator_BxS(mask_BxS, group_B, aggregation), 1
  )
  onehot_BxTxV = np.eye(vocab)[tokens_BxS]
  expected_BxTxV = coef_BxS[..., None] * (
      onehot_BxTxV - jax.nn.softmax(logits_BxTxV)
  )
  np.testing.assert_allclose(
      jax.grad(loss_fn)(logits_BxTxV), expected_BxTxV, rtol=1e-5, atol=1e-7
  )


@pytest.mark.parametrize("aggregation", losses.AGGREGATIONS.names())
@pytest.mark.parametrize("loss", LOSSES)
def test_on_policy_gradient_is_reinforce(loss, aggregation):
  # With rho = 1 nothing is clipped or capped, so every loss's gradient must be
  # REINFORCE's, d(-aggregate(A log pi)) / d log pi = -A / N per token.
  params = _params(loss, aggregation)
  for seed in range(4):
    logp_BxS, _, adv_B, mask_BxS, group_B = _random_batch(seed)
    grad_BxS = jax.grad(
        lambda lp: losses.compute_loss(
            params, lp, logp_BxS, adv_B, mask_BxS, group_B, 3
        )[0]
    )(logp_BxS)
    expected_BxS = np.where(
        mask_BxS, -adv_B[:, None], 0.0
    ) / _reference_denominator_BxS(mask_BxS, group_B, aggregation)
    np.testing.assert_allclose(
        grad_BxS, expected_BxS, rtol=1e-5, atol=1e-7, err_msg=f"seed {seed}"
    )


@pytest.mark.parametrize("loss", LOSSES)
def test_jit_gives_the_hand_worked_values(loss):
  @jax.jit
  def every_aggregation(logp_BxS):
    # One compilation per loss covers all three aggregations.
    return {
        aggregation: _hand_loss(_params(loss, aggregation), logp_BxS)[0]
        for aggregation in losses.AGGREGATIONS.names()
    }

  chex.assert_trees_all_close(
      every_aggregation(_LOGP_BxS), EXPECTED_LOSS[loss], rtol=2e-6, atol=1e-7
  )
