"""Tests for scalerl_jax/registry.py: the one registry type of every kind."""

import importlib
import json
import os
import pkgutil
import subprocess
import sys

import pytest

import scalerl_jax
from scalerl_jax import registry
from scalerl_jax.config import fields
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


def _registries_of_fields() -> dict[str, registry.Registry]:
  """Config field -> the registry whose names it takes: every `Registry` in
  a module of the package (all imported here) whose field has a rule."""
  found = {}
  for module in pkgutil.walk_packages(scalerl_jax.__path__, "scalerl_jax."):
    for value in vars(importlib.import_module(module.name)).values():
      if isinstance(value, registry.Registry) and value.field in fields.RULES:
        found[value.field] = value
  return found


# launch.sweep's imports and its validation of a point, in a fresh
# interpreter: whatever it refuses as "not one of" a field's names.
_SWEEP_REFUSES = """
import json, sys
from launch import sweep as launch_sweep
refused = []
for field, names in json.loads(sys.argv[1]).items():
  for name in names:
    point = launch_sweep.sweep.Point("p", "tiny_cpu", {field: name})
    try:
      launch_sweep.sweep.build_config(point, launch_sweep.scalerl.get_config)
    except ValueError as e:  # Other fields' relations to it may fail.
      if f"{field}: {name!r} is not one of" in str(e):
        refused.append(str(e))
print(json.dumps(refused))
"""


def test_every_registry_field_takes_all_its_names_whatever_was_imported():
  # Registries are filled where their package is assembled, so a validation
  # that imported none of the modules that register (launch.sweep's and
  # launch.cluster's) takes every name; `plain` attention was refused so.
  registries = _registries_of_fields()
  assert sorted(registries) == [
      "buffer.schedule",
      "data.source",
      "model.attention",
      "rl.adv_norm",
      "rl.aggregation",
      "rl.loss",
  ]
  assert "plain" in registries["model.attention"].names()
  names = {field: reg.names() for field, reg in registries.items()}
  done = subprocess.run(
      [sys.executable, "-c", _SWEEP_REFUSES, json.dumps(names)],
      capture_output=True,
      text=True,
      timeout=300,
      check=True,
      cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
  )
  assert json.loads(done.stdout) == []
