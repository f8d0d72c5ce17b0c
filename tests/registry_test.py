"""Tests for scalerl_jax/registry.py: the one registry type of every kind."""

import pytest

from scalerl_jax import registry
from scalerl_jax.data import sources
from scalerl_jax.jobs import cluster
from scalerl_jax.metrics import monitors
from scalerl_jax.models import attention
from scalerl_jax.rewards import registry as verifiers
from scalerl_jax.rl import advantages
from scalerl_jax.rl import losses
from scalerl_jax.rl import schedules


def test_register_as_decorator_or_call_returns_the_entry():
  reg = registry.Registry("test.field")

  @reg.register("b")
  def b():
    return "b"

  assert reg.register("a", len) is len
  assert reg.get("b") is b
  assert reg.get("a") is len
  assert "a" in reg and "c" not in reg


def test_a_duplicate_or_reserved_name_raises_naming_the_field():
  reg = registry.Registry("test.field", reserved=("auto",))
  reg.register("a", 1)
  with pytest.raises(
      ValueError, match=r"^test\.field: 'a' is already registered$"
  ):
    reg.register("a", 2)
  assert reg.get("a") == 1  # The first entry stays.
  with pytest.raises(ValueError, match=r"^test\.field: 'auto' is reserved$"):
    reg.register("auto", 3)


def test_an_unknown_name_raises_naming_the_field_and_every_choice():
  reg = registry.Registry("test.field", reserved=("auto",))
  reg.register("b", 1)
  reg.register("a", 2)
  with pytest.raises(ValueError) as e:
    reg.get("c")
  assert str(e.value) == "test.field: 'c' is not one of ('auto', 'a', 'b')"


def test_names_are_reserved_first_then_sorted_or_in_registration_order():
  by_name = registry.Registry("f", reserved=("auto",))
  in_order = registry.Registry("f", sort=False)
  for name in ("z", "a", "m"):
    by_name.register(name, name)
    in_order.register(name, name)
  assert by_name.names() == ("auto", "a", "m", "z")
  assert in_order.names() == ("z", "a", "m")
  assert [n for n, _ in by_name.items()] == ["z", "a", "m"]
  by_name.unregister("a")
  assert by_name.names() == ("auto", "m", "z")


@pytest.mark.parametrize(
    "reg, field",
    [
        (losses.LOSSES, "rl.loss"),
        (losses.AGGREGATIONS, "rl.aggregation"),
        (advantages.NORMS, "rl.adv_norm"),
        (schedules.SCHEDULES, "buffer.schedule"),
        (attention.IMPLS, "model.attention"),
        (verifiers.VERIFIERS, "verifier"),
        (monitors.CHECKS, "monitor"),
        (sources.SOURCES, "data.source"),
        (cluster.TARGETS, "--target"),
    ],
)
def test_every_kind_is_a_registry_of_its_field(reg, field):
  assert isinstance(reg, registry.Registry)
  assert reg.field == field
  assert reg.names()
