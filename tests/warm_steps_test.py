"""The warm start's phases (scalerl_jax/warm_steps.py): the chain phase run
on until its loss meets the target, the rows and learning rates each step
takes, and its config (issue 58, item 3)."""

import numpy as np
import optax
import pytest

from configs import parity
from configs import warm_start_reliability
from configs import warm_start_reliability_v2
from configs import warm_start_reliability_v3
from scalerl_jax import config as config_lib
from scalerl_jax import warm_start
from scalerl_jax import warm_steps

_BATCH = 2


def _schedule(i):
  return 1000.0 + i  # A rate that names its step.


# "planned" rates on _schedule, as warm_steps.rates builds them on the
# warmup-cosine schedule: the chain held at the planned phase's end.
_PLANNED = warm_steps.Rates(
    chain=lambda i: _schedule(min(i, 100)), mixed=lambda j: _schedule(100 + j)
)


def _recording_step(taken):
  """A supervised step whose loss is its rows' value: (row, rate) of each
  call into `taken`; the rate None where the optimizer schedules its own."""

  def step(params, opt_state, tokens, mask):
    del mask
    inject = opt_state[1]
    rate = getattr(inject, "hyperparams", {}).get("learning_rate")
    taken.append((int(tokens[0, 0]), None if rate is None else float(rate)))
    return params, opt_state, np.float32(tokens[0, 1])

  return step


def _rows(losses):
  """Rows whose first token is the step's row index, second its loss."""
  tokens = np.zeros((len(losses) * _BATCH, 2), np.float32)
  tokens[:, 0] = np.repeat(np.arange(len(losses)), _BATCH)
  tokens[:, 1] = np.repeat(losses, _BATCH)
  return tokens


def _opt_state(injected):
  adamw = (
      optax.inject_hyperparams(optax.adamw)(0.0)
      if injected
      else optax.adamw(_schedule)
  )
  return optax.chain(optax.clip_by_global_norm(1.0), adamw).init(
      {"w": np.zeros(1, np.float32)}
  )


def _run(plan, losses, rate=_PLANNED):
  taken = []
  tokens = _rows(losses)
  _, info = warm_steps.run(
      _recording_step(taken),
      {},
      _opt_state(plan.injected),
      tokens,
      tokens,
      _BATCH,
      plan,
      rate,
  )
  return taken, info


def test_the_chain_phase_runs_on_until_its_last_50_losses_meet_the_target():
  # Planned: 100 chain steps, then 20 mixed; drawn: 400 chain rows. The
  # chain loss drops at chain step 200.
  plan = warm_steps.Phases(
      steps=120, chain_first=100, chain_cap=400, target=0.01
  )
  losses = np.concatenate([np.ones(200), np.zeros(200), np.full(20, 0.5)])
  taken, info = _run(plan, losses)
  # Checked at 100 (mean 1), 150 (1), 200 (1), 250 (0 < 0.01): 250 chain steps.
  assert info == {"chain_steps": 250, "chain_loss": 0.0}
  rows = [r for r, _ in taken]
  assert rows == list(range(250)) + list(range(400, 420))
  rates = [lr for _, lr in taken]
  # Planned steps on the schedule, the extension held at step 100's rate,
  # the mixed phase on from step 100 as planned.
  assert rates[:100] == [_schedule(i) for i in range(100)]
  assert rates[100:250] == [_schedule(100)] * 150
  assert rates[250:] == [_schedule(100 + j) for j in range(20)]


def test_a_chain_phase_that_reaches_its_cap_goes_on_to_the_mixed_steps():
  plan = warm_steps.Phases(
      steps=120, chain_first=100, chain_cap=180, target=0.01
  )
  losses = np.concatenate([np.ones(180), np.full(20, 0.5)])
  taken, info = _run(plan, losses)
  # Extended by 50, then by the 30 left under the cap.
  assert info == {"chain_steps": 180, "chain_loss": 1.0}
  assert [r for r, _ in taken] == list(range(180)) + list(range(180, 200))


def test_without_a_target_the_steps_are_the_planned_ones():
  plan = warm_steps.Phases(
      steps=120, chain_first=100, chain_cap=100, target=0.0
  )
  losses = np.concatenate([np.ones(100), np.full(20, 0.5)])
  taken, info = _run(plan, losses)
  assert [r for r, _ in taken] == list(range(120))
  # The optimizer schedules its own rate: none is set.
  assert {lr for _, lr in taken} == {None}
  assert info == {"chain_steps": 100, "chain_loss": 1.0}
  assert plan.drawn == 120


def test_the_target_is_in_the_fingerprint_only_when_set_and_needs_a_chain_phase():
  config = parity.get_config()
  config.trainer.warm_start_steps = 3000
  config.trainer.warm_start_chain_first_steps = 2250
  plain = warm_start.fingerprint(config, 512)
  config.trainer.warm_start_chain_max_steps = 6750
  assert warm_start.fingerprint(config, 512) == plain
  config.trainer.warm_start_chain_loss_target = 0.01
  assert warm_start.fingerprint(config, 512) != plain
  config_lib.validate(config)
  assert warm_steps.phases(config.trainer) == warm_steps.Phases(
      3000, 2250, 6750, 0.01
  )
  config.trainer.warm_start_chain_max_steps = 2000
  with pytest.raises(config_lib.ConfigError, match="is below"):
    config_lib.validate(config)
  config.trainer.warm_start_chain_first_steps = 0
  with pytest.raises(config_lib.ConfigError, match="chain_first_steps=0"):
    config_lib.validate(config)


def test_the_planned_rates_hold_the_schedule_where_the_chain_was_to_end():
  plan = warm_steps.Phases(3000, 2250, 6750, 0.01)
  rate = warm_steps.rates(plan, 3e-3)
  planned = warm_steps.schedule(3e-3, 3000)
  # Warmup to step 20, then cosine over 2,980 steps to 3e-4: at step 2,250,
  # 3e-4 + 2.7e-3 * (1 + cos(pi * 2230 / 2980)) / 2 = 3e-4 + 2.7e-3 * 0.14831.
  assert rate.chain(2250) == pytest.approx(7.0045e-4, rel=1e-4)
  assert rate.chain(5000) == rate.chain(2250) == planned(2250)
  assert rate.chain(10) == planned(10) == pytest.approx(1.5e-3)
  assert rate.mixed(0) == planned(2250)
  assert rate.mixed(749) == planned(2999)


def test_the_peak_rate_holds_through_the_chain_then_the_mixed_steps_decay():
  plan = warm_steps.Phases(3000, 2250, 6750, 0.01, "peak")
  assert plan.injected
  rate = warm_steps.rates(plan, 3e-3)
  # Warmup to the peak over 20 steps, then the peak, extension included.
  assert rate.chain(10) == pytest.approx(1.5e-3)
  assert [rate.chain(i) for i in (20, 1000, 2250, 6749)] == pytest.approx(
      [3e-3] * 4
  )
  # The 750 mixed steps: cosine from the peak to a tenth of it,
  # 3e-4 + 2.7e-3 * (1 + cos(pi * j / 750)) / 2.
  assert rate.mixed(0) == pytest.approx(3e-3)
  assert rate.mixed(375) == pytest.approx(1.65e-3)
  assert rate.mixed(750) == pytest.approx(3e-4)


def test_a_held_peak_is_injected_even_without_a_target():
  plan = warm_steps.Phases(120, 100, 100, 0.0, "peak")
  assert plan.injected
  peak = warm_steps.Rates(chain=lambda i: 7.0, mixed=lambda j: 5.0 - j)
  taken, info = _run(plan, np.ones(120), peak)
  assert [r for r, _ in taken] == list(range(120))
  assert [lr for _, lr in taken] == [7.0] * 100 + [5.0 - j for j in range(20)]
  assert info == {"chain_steps": 100, "chain_loss": 1.0}


def test_the_chain_rate_is_in_the_fingerprint_only_off_its_default():
  config = parity.get_config()
  config.trainer.warm_start_steps = 3000
  config.trainer.warm_start_chain_first_steps = 2250
  plain = warm_start.fingerprint(config, 512)
  config.trainer.warm_start_chain_rate = warm_steps.CHAIN_RATES[0]
  assert warm_start.fingerprint(config, 512) == plain
  config.trainer.warm_start_chain_rate = "peak"
  assert warm_start.fingerprint(config, 512) != plain
  config_lib.validate(config)
  assert warm_steps.phases(config.trainer).rate == "peak"
  config.trainer.warm_start_chain_rate = "constant"
  with pytest.raises(config_lib.ConfigError, match="'constant' is not one of"):
    config_lib.validate(config)
  config.trainer.warm_start_chain_rate = "peak"
  config.trainer.warm_start_chain_first_steps = 0
  with pytest.raises(config_lib.ConfigError, match="chain_first_steps=0"):
    config_lib.validate(config)


def test_the_registered_mends_differ_only_in_the_chain_rate():
  first = warm_start_reliability.get_config("104")
  second = warm_start_reliability_v2.get_config("104")
  for config in (first, second):
    config_lib.validate(config)
  assert warm_steps.phases(first.trainer) == warm_steps.Phases(
      3000, 2250, 6750, 0.01, "planned"
  )
  assert warm_steps.phases(second.trainer) == warm_steps.Phases(
      3000, 2250, 6750, 0.01, "peak"
  )
  second.trainer.warm_start_chain_rate = first.trainer.warm_start_chain_rate
  assert second.to_dict() == first.to_dict()
  assert warm_start_reliability_v2.SEEDS[:6] == warm_start_reliability.SEEDS


def test_the_third_mend_is_the_first_with_weight_decay_in_its_fingerprint():
  first = warm_start_reliability.get_config("3")
  third = warm_start_reliability_v3.get_config("3")
  config_lib.validate(third)
  assert third.trainer.warm_start_weight_decay == 0.1
  assert warm_start.fingerprint(third, 512) != warm_start.fingerprint(
      first, 512
  )
  third.trainer.warm_start_weight_decay = 0.0
  assert third.to_dict() == first.to_dict()
  # At 0, as every base before the field: the fingerprint is unchanged.
  assert warm_start.fingerprint(third, 512) == warm_start.fingerprint(
      first, 512
  )
  third.trainer.warm_start_weight_decay = -0.1
  with pytest.raises(config_lib.ConfigError, match="warm_start_weight_decay"):
    config_lib.validate(third)
