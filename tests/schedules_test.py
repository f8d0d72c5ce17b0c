"""Off-policy schedules as functions of counts: the hold-back rule,
decode budgets, the registry."""

import pytest

from configs import scalerl
from scalerl_jax import config as config_lib
from scalerl_jax.rl import schedules


def _schedule(name, k, p=4, call=16, per_train_step=40):
  return schedules.SCHEDULES.get(name)(
      max_off_policy=k,
      prompts_per_step=p,
      decode_steps_per_call=call,
      decode_steps_per_train_step=per_train_step,
  )


@pytest.mark.parametrize("k", [1, 4, 8])
def test_pipeline_rl_starts_exactly_what_can_be_trained_within_k_versions(k):
  p = 4
  s = _schedule("pipeline_rl", k, p)
  for backlog in range((k + 3) * p):
    n = s.max_starts(version=7, backlog=backlog)
    # Started behind `backlog` others, group j is trained
    # floor((backlog + j) / p) versions from now, and its tokens come from
    # now or later.
    lags = [(backlog + j) // p for j in range(n)]
    assert all(lag <= k for lag in lags)
    # Held back only when the next group could lag more than k.
    assert (n == 0) == (backlog // p > k)
    if n:
      assert max(lags) == k  # It may run ahead right up to the bound.


def test_pipeline_rl_decodes_its_share_then_only_while_the_trainer_waits():
  s = _schedule("pipeline_rl", k=2, p=4, call=16, per_train_step=40)
  # Its share of a train step: calls of 16, 16, then the remaining 8.
  assert [s.decode_steps(d, ready=9, in_flight=3) for d in (0, 16, 32)] == [
      16,
      16,
      8,
  ]
  # The trainer has its batch.
  assert s.decode_steps(40, ready=4, in_flight=3) == 0
  # The trainer would wait.
  assert s.decode_steps(40, ready=3, in_flight=3) == 16
  # Held back, nothing running.
  assert s.decode_steps(0, ready=9, in_flight=0) == 0
  no_share = _schedule("pipeline_rl", k=2, p=4, per_train_step=0)
  assert no_share.decode_steps(0, ready=3, in_flight=1) == 16
  assert no_share.decode_steps(0, ready=4, in_flight=1) == 0


def test_ppo_off_policy_starts_k_batches_every_k_steps_and_finishes_them():
  s = _schedule("ppo_off_policy", k=3, p=4)
  assert [s.max_starts(v, backlog=0) for v in range(7)] == [
      12,
      0,
      0,
      12,
      0,
      0,
      12,
  ]
  assert s.max_starts(3, backlog=5) == 7  # 5 of the set already started.
  # Every started sequence finishes with the weights of the
  # step that started it.
  assert s.decode_steps(1000, ready=12, in_flight=1) == 16
  assert s.decode_steps(0, ready=0, in_flight=0) == 0


def test_default_slots_come_from_the_schedule():
  config = scalerl.get_config()
  p, g = config.data.prompts_per_step, config.data.generations_per_prompt
  # pipeline_rl: a second batch in flight.
  assert schedules.num_slots(config) == 2 * p * g
  with config.unlocked():
    config.buffer.schedule = "ppo_off_policy"
  assert schedules.num_slots(config) == p * g
  with config.unlocked():
    config.sampling.num_slots = 48
  assert schedules.num_slots(config) == 48


def test_make_binds_the_config():
  config = scalerl.get_config()
  s = schedules.make(config)
  assert isinstance(s, schedules.PipelineRL)
  assert (
      s.max_off_policy,
      s.prompts_per_step,
      s.decode_steps_per_call,
      s.decode_steps_per_train_step,
  ) == (
      config.buffer.max_off_policy,
      config.data.prompts_per_step,
      config.sampling.decode_steps_per_call,
      config.buffer.decode_steps_per_train_step,
  )


def test_a_new_schedule_is_one_registered_class_and_config_accepts_its_name():
  config = scalerl.get_config()
  with config.unlocked():
    config.buffer.schedule = "on_policy"
  with pytest.raises(
      config_lib.ConfigError, match="buffer.schedule: 'on_policy' is not one of"
  ):
    config_lib.validate(config)

  @schedules.SCHEDULES.register("on_policy")
  class OnPolicy(schedules.Schedule):  # pylint: disable=unused-variable
    slot_batches = 1

    def max_starts(self, version, backlog):
      return max(0, self.prompts_per_step - backlog)

    def decode_steps(self, decoded, ready, in_flight):
      return self.decode_steps_per_call if in_flight else 0

  try:
    config_lib.validate(config)
    assert (
        schedules.make(config).max_starts(0, 0) == config.data.prompts_per_step
    )
    with pytest.raises(ValueError, match="'on_policy' is already registered"):
      schedules.SCHEDULES.register("on_policy")(OnPolicy)
  finally:
    schedules.SCHEDULES.unregister("on_policy")


@pytest.mark.parametrize("name", schedules.SCHEDULES.names())
def test_a_bound_below_1_is_refused_by_every_schedule(name):
  kwargs = dict(
      prompts_per_step=4, decode_steps_per_call=8, decode_steps_per_train_step=8
  )
  with pytest.raises(ValueError, match="buffer.max_off_policy: 0 must be >= 1"):
    schedules.SCHEDULES.get(name)(max_off_policy=0, **kwargs)
  assert schedules.SCHEDULES.get(name)(max_off_policy=1, **kwargs)
