"""The optimizer factory: exact learning rates, eps,
weight-decay mask, clipping."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from configs import scalerl
from scalerl_jax import optim

# Names as flax linen gives them for the policy transformer.
_PARAMS = {
    "embedding": jnp.ones((2, 2)),
    "layers": {
        "attn_norm": {"scale": jnp.ones((2,))},
        "attn": {
            "q": {"kernel": jnp.ones((2, 2)), "bias": jnp.ones((2,))},
            "q_norm": {"scale": jnp.ones((2,))},
        },
        "mlp": {"up": {"kernel": jnp.ones((2, 2))}},
    },
    "final_norm": {"scale": jnp.ones((2,))},
    "lm_head": jnp.ones((2, 2)),
}
_DECAYED = {
    "embedding": True,
    "layers": {
        "attn_norm": {"scale": False},
        "attn": {
            "q": {"kernel": True, "bias": False},
            "q_norm": {"scale": False},
        },
        "mlp": {"up": {"kernel": True}},
    },
    "final_norm": {"scale": False},
    "lm_head": True,
}


def _optim_config(**overrides):
  # tiny_cpu: 10 warmup steps, eps 1e-15; constant after warmup unless the test
  # names a schedule (tiny_cpu's own default is cosine).
  config = scalerl.get_config()
  # Peak 1e-5, pinned here so the hand-worked numbers below do
  # not follow the preset.
  config.optim.update(
      dict(dict(learning_rate=1e-5, schedule="constant"), **overrides)
  )
  return config.optim


def test_warmup_learning_rates_are_exact():
  # lr(step) = 1e-5 * min(1, (step + 1) / 10): 1e-6, 2e-6, ...,
  # 1e-5 at step 9, then flat.
  schedule = optim.make_schedule(_optim_config())
  expected = [1e-6 * (s + 1) for s in range(10)] + [1e-5] * 3
  np.testing.assert_allclose(
      [schedule(s) for s in range(13)], expected, rtol=1e-6
  )
  # The paper's recipe (8B variant): 5e-7 after 100 linear warmup steps.
  paper = optim.make_schedule(scalerl.get_config("variant=llama3_8b").optim)
  np.testing.assert_allclose(
      [paper(s) for s in (0, 49, 99, 100, 10_000)],
      [5e-9, 2.5e-7, 5e-7, 5e-7, 5e-7],
      rtol=1e-6,
  )


def test_cosine_schedule_after_warmup():
  # warmup 2, then cos from peak to 0.1 * peak over 4 steps:
  #   step 0: 1/2; 1: 1; 2 (t=0): 1;
  #   3 (t=1/4): 0.1 + 0.45 (1 + cos(pi/4)) = 0.8681981; 4 (t=1/2): 0.55;
  #   5 (t=3/4): 0.1 + 0.45 (1 - cos(pi/4)) = 0.2318019; 6, 7: 0.1.
  schedule = optim.make_schedule(
      _optim_config(
          schedule="cosine",
          warmup_steps=2,
          decay_steps=4,
          final_lr_fraction=0.1,
          learning_rate=1.0,
      )
  )
  np.testing.assert_allclose(
      [schedule(s) for s in range(8)],
      [0.5, 1.0, 1.0, 0.8681981, 0.55, 0.2318019, 0.1, 0.1],
      rtol=1e-6,
  )


def test_no_warmup_and_bad_schedules():
  np.testing.assert_allclose(
      optim.make_schedule(_optim_config(warmup_steps=0))(0), 1e-5
  )
  with pytest.raises(ValueError, match="decay_steps"):
    optim.make_schedule(_optim_config(schedule="cosine", decay_steps=0))


def test_optimizer_steps_follow_the_warmup():
  # Gradient 1 on a bias (no decay) with b1 = b2 = 0: m_hat = 1, v_hat = 1 with
  # no bias-correction rounding, so the update of step s is exactly -lr(s).
  tx = optim.make_optimizer(_optim_config(b1=0.0, b2=0.0))
  params = {"bias": jnp.zeros(())}
  state = tx.init(params)
  updates = []
  for _ in range(12):
    update, state = tx.update({"bias": jnp.ones(())}, state, params)
    updates.append(update["bias"])
  np.testing.assert_allclose(
      updates, [-1e-6 * (s + 1) for s in range(10)] + [-1e-5] * 2, rtol=1e-6
  )


@pytest.mark.parametrize(
    "eps,expected",
    [
        # First step: update = -lr(0) * g / (|g| + eps) with
        # lr(0) = 1e-6, g = 1e-15.
        (1e-15, -1e-6 * 0.5),  # The config's eps: g / (g + g) = 1/2.
        # optax's default eps would swamp g.
        (1e-8, -1e-6 * 1e-15 / (1e-15 + 1e-8)),
    ],
)
def test_eps_reaches_the_adam_update(eps, expected):
  tx = optim.make_optimizer(_optim_config(eps=eps))
  params = {"bias": jnp.zeros(())}
  update, _ = tx.update({"bias": jnp.full((), 1e-15)}, tx.init(params), params)
  np.testing.assert_allclose(update["bias"], expected, rtol=1e-5)


def test_weight_decay_mask_spares_norms_and_biases():
  assert optim.weight_decay_mask(_PARAMS) == _DECAYED
  assert optim.decays(("layers", "mlp", "down", "kernel"))
  assert not optim.decays(("layers", "attn", "k_norm", "scale"))
  assert not optim.decays(("layers", "attn", "v", "bias"))
  # Zero gradients leave only decoupled decay:
  # -lr(0) * 0.01 * p = -1e-8 where decayed.
  tx = optim.make_optimizer(_optim_config())
  zeros = jax.tree_util.tree_map(jnp.zeros_like, _PARAMS)
  update, _ = tx.update(zeros, tx.init(_PARAMS), _PARAMS)
  jax.tree_util.tree_map(
      lambda u, decayed: np.testing.assert_allclose(
          u, -1e-8 if decayed else 0.0, rtol=1e-6
      ),
      update,
      _DECAYED,
  )


@pytest.mark.parametrize(
    "clip,expected_nu",
    [
        # Gradient (3, 4) has norm 5. Clipped to norm 1 it is (0.6, 0.8); Adam's
        # second moment after one step is (1 - b2) g^2 = 0.001 * g^2.
        (1.0, [0.001 * 0.36, 0.001 * 0.64]),
        (0.0, [0.001 * 9.0, 0.001 * 16.0]),  # 0 disables clipping.
    ],
)
def test_global_norm_clipping(clip, expected_nu):
  tx = optim.make_optimizer(_optim_config(grad_clip_norm=clip))
  params = {"bias": jnp.zeros((2,))}
  _, state = tx.update({"bias": jnp.array([3.0, 4.0])}, tx.init(params), params)
  np.testing.assert_allclose(
      optax.tree_utils.tree_get(state, "nu")["bias"], expected_nu, rtol=1e-5
  )
