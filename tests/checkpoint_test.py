"""Tests of scalerl_jax.checkpoint.checkpointer: round trips, retention,
resume safety, errors."""

import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scalerl_jax import optim
from scalerl_jax import sharding
from scalerl_jax.checkpoint import checkpointer
from scalerl_jax.models.model_config import ModelConfig
from scalerl_jax.models.transformer import Transformer
from tests.helpers import tiny_config


def _abstract(tree):
  return jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
      tree,
  )


def _assert_trees_equal(got, want):
  assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    if jax.dtypes.issubdtype(b.dtype, jax.dtypes.prng_key):
      assert a.dtype == b.dtype
      a, b = jax.random.key_data(a), jax.random.key_data(b)
    assert a.dtype == b.dtype and a.shape == b.shape
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def _abstract_params(config, mesh, rules):
  """Abstract, sharded parameters of the config's model,
  without allocating them."""
  model = Transformer(ModelConfig.from_config(config.model))
  shardings = sharding.param_shardings(model, mesh, rules)
  boxed = jax.eval_shape(
      lambda: model.init(jax.random.key(0), np.zeros((1, 1), np.int32))[
          "params"
      ]
  )
  return jax.tree.map(
      lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
      nn.unbox(boxed),
      shardings,
  )


@pytest.fixture(scope="module")
def model_state():
  """A sharded {params, opt_state, rng, step} of a tiny
  model on a 1-device mesh."""
  config = tiny_config()
  mesh = sharding.make_mesh(config.mesh)
  rules = sharding.logical_rules(config.mesh)
  # Random values placed into the model's shardings
  # (cheaper than compiling its init).
  rng = np.random.default_rng(0)
  params = jax.tree.map(
      lambda a: jax.device_put(
          rng.standard_normal(a.shape).astype(a.dtype), a.sharding
      ),
      _abstract_params(config, mesh, rules),
  )
  opt = optim.make_optimizer(config.optim)
  # Non-trivial optimizer moments, so a mix-up of mu and nu would show.
  opt_state = jax.jit(
      lambda p: jax.tree.map(
          lambda x: x + 1 if jnp.issubdtype(x.dtype, jnp.floating) else x,
          opt.init(p),
      )
  )(params)
  state = {
      "params": params,
      "opt_state": opt_state,
      "rng": jax.random.key(7),
      "step": jnp.int32(5),
  }
  return config, mesh, rules, state


def test_sharded_state_round_trip(tmp_path, model_state):
  _, mesh, _, state = model_state
  with checkpointer.Checkpointer(str(tmp_path), max_to_keep=2) as ckpt:
    assert ckpt.save(5, state, extra={"note": "x"})
    ckpt.wait()
    restored = ckpt.restore(5, _abstract(state))
  _assert_trees_equal(restored.state, state)
  for got, want in zip(jax.tree.leaves(restored.state), jax.tree.leaves(state)):
    assert got.sharding == want.sharding
  kernel = restored.state["params"]["layers"]["mlp"]["up"]["kernel"]
  assert kernel.sharding.mesh.shape == mesh.shape
  assert restored.extra == {"note": "x"} and restored.host_state is None


def test_plain_pytree_round_trip_with_array_template(tmp_path):
  state = {
      "w": jnp.arange(6.0).reshape(2, 3),
      "nested": [jnp.ones(2, jnp.int32), (jnp.zeros(()),)],
  }
  with checkpointer.Checkpointer(str(tmp_path), async_save=False) as ckpt:
    ckpt.save(1, state)
    restored = ckpt.restore(None, jax.tree.map(jnp.zeros_like, state))
  _assert_trees_equal(restored.state, state)
  assert restored.extra == {}


@pytest.mark.parametrize("impl", ["threefry2x32", "rbg"])
def test_typed_prng_key_round_trip(tmp_path, impl):
  key = jax.random.split(jax.random.key(42, impl=impl), 3)[1]
  with checkpointer.Checkpointer(str(tmp_path)) as ckpt:
    ckpt.save(1, {"rng": key})
    ckpt.wait()
    restored = ckpt.restore(1, _abstract({"rng": key})).state["rng"]
  assert jax.random.key_impl(restored) == jax.random.key_impl(key)
  np.testing.assert_array_equal(
      jax.random.uniform(restored, (4,)), jax.random.uniform(key, (4,))
  )


def test_extra_json_round_trip_and_error(tmp_path):
  extra = {
      "data": {"grain": {"next_index": 17}, "fingerprint": "abc"},
      "curriculum": {
          "retired": ["p1", "p2"],
          "rate": 0.5,
          "ok": True,
          "none": None,
      },
      "meter": {"flops": 12345678901234567890, "device_seconds": 1.5},
      "pair": (1, 2),
  }
  state = {"x": jnp.ones(2)}
  with checkpointer.Checkpointer(str(tmp_path)) as ckpt:
    ckpt.save(3, state, extra=extra)
    ckpt.wait()
    got = ckpt.restore(3, _abstract(state)).extra
    with pytest.raises(
        TypeError, match=r"extra\['data'\]\['pos'\]: int64 is not JSON"
    ):
      ckpt.save(4, state, extra={"data": {"pos": np.int64(3)}})
  assert got == {**extra, "pair": [1, 2]}  # JSON has no tuples.


def test_host_state_round_trip_without_known_shapes(tmp_path):
  tokens = [
      np.arange(5, dtype=np.int32),
      np.zeros(0, np.int32),
      np.arange(3, dtype=np.int64),
  ]
  host = {
      "tokens": tokens,
      "versions": np.zeros((2, 0), np.int16),
      "flags": {"done": np.array([True, False])},
      "empty": [],
      "nothing": None,
      "pair": (np.float32(1.5), np.ones((2, 2), np.float32)),
  }
  state = {"x": jnp.ones(2)}
  with checkpointer.Checkpointer(str(tmp_path)) as ckpt:
    ckpt.save(1, state, host_state=host)
    # Edited after save returns: the checkpoint keeps the old values.
    tokens[0][:] = -1
    ckpt.save(
        2, state, host_state={"all_empty": [np.zeros((0, 3), np.float32)]}
    )
    ckpt.wait()
    got1 = ckpt.restore(1, _abstract(state)).host_state
    got2 = ckpt.restore(2, _abstract(state)).host_state
  tokens[0][:] = np.arange(5)
  assert (
      set(got1) == set(host) and got1["empty"] == [] and got1["nothing"] is None
  )
  assert isinstance(got1["pair"], tuple)
  for a, b in zip(jax.tree.leaves(got1), jax.tree.leaves(host)):
    assert isinstance(a, np.ndarray) and a.dtype == np.asarray(b).dtype
    np.testing.assert_array_equal(a, b)
  assert (
      got2["all_empty"][0].shape == (0, 3)
      and got2["all_empty"][0].dtype == np.float32
  )


def test_host_state_rejects_object_arrays(tmp_path):
  with checkpointer.Checkpointer(str(tmp_path)) as ckpt:
    with pytest.raises(
        TypeError, match=r"host_state\['ids'\]: dtype <U2 cannot"
    ):
      ckpt.save(
          1, {"x": jnp.ones(1)}, host_state={"ids": np.array(["ab", "c"])}
      )


def test_max_to_keep_interval_and_latest_step(tmp_path):
  state = {"x": jnp.ones(2)}
  with checkpointer.Checkpointer(
      str(tmp_path), max_to_keep=2, save_interval_steps=2
  ) as ckpt:
    assert ckpt.latest_step() is None
    saved = [ckpt.save(step, {"x": state["x"] * step}) for step in range(1, 7)]
    assert saved == [False, True, False, True, False, True]
    assert ckpt.save(7, state, force=True)
    assert not ckpt.save(7, state, force=True)  # Already saved: not an error.
    ckpt.wait()
    assert ckpt.all_steps() == [6, 7] and ckpt.latest_step() == 7
  assert sorted(os.listdir(tmp_path)) == ["6", "7"]
  with checkpointer.Checkpointer(str(tmp_path)) as reopened:
    assert reopened.latest_step() == 7
    np.testing.assert_array_equal(
        reopened.restore(6, _abstract(state)).state["x"], [6.0, 6.0]
    )


def test_incomplete_checkpoint_is_ignored_then_replaced(tmp_path):
  state = {"x": jnp.arange(3.0)}
  with checkpointer.Checkpointer(str(tmp_path)) as ckpt:
    ckpt.save(10, state, extra={"step": 10})
  # A save killed part-way leaves orbax's temporary directory (current and
  # older, timestamped names), never a directory named by the step alone.
  for name in (
      "20.orbax-checkpoint-tmp",
      "30.orbax-checkpoint-tmp-1700000000000",
  ):
    os.makedirs(tmp_path / name / "state")
    (tmp_path / name / "state" / "manifest.ocdbt").write_bytes(b"partial")
  with checkpointer.Checkpointer(str(tmp_path)) as resumed:
    assert resumed.latest_step() == 10 and resumed.all_steps() == [10]
    restored = resumed.restore(None, _abstract(state))
    assert restored.extra == {"step": 10}
    np.testing.assert_array_equal(restored.state["x"], [0.0, 1.0, 2.0])
    # The resumed run reaches step 20 again; its save replaces the leftover.
    assert resumed.save(20, {"x": state["x"] * 2}, extra={"step": 20})
    resumed.wait()
    assert resumed.latest_step() == 20
    np.testing.assert_array_equal(
        resumed.restore(20, _abstract(state)).state["x"], [0.0, 2.0, 4.0]
    )
  assert sorted(os.listdir(tmp_path)) == [
      "10",
      "20",
      "30.orbax-checkpoint-tmp-1700000000000",
  ]


def test_restore_without_checkpoint(tmp_path):
  state = {"x": jnp.ones(2)}
  with checkpointer.Checkpointer(str(tmp_path / "none")) as ckpt:
    with pytest.raises(FileNotFoundError, match="holds no complete checkpoint"):
      ckpt.restore(None, _abstract(state))
    ckpt.save(2, state)
    ckpt.wait()
    with pytest.raises(
        FileNotFoundError,
        match=r"no checkpoint of step 3; complete checkpoints: \[2\]",
    ):
      ckpt.restore(3, _abstract(state))
    with pytest.raises(ValueError, match="leaf 'x' has no sharding"):
      ckpt.restore(2, {"x": jax.ShapeDtypeStruct((2,), jnp.float32)})


def test_restore_into_other_model_names_mismatching_keys(tmp_path, model_state):
  config, mesh, rules, state = model_state
  with checkpointer.Checkpointer(str(tmp_path)) as ckpt:
    ckpt.save(1, {"params": state["params"]})
    ckpt.wait()
    bigger = tiny_config(mlp_dim=256)
    abstract = {"params": _abstract_params(bigger, mesh, rules)}
    with pytest.raises(ValueError) as err:
      ckpt.restore(1, abstract)
    message = str(err.value)
    assert "(3 problems)" in message
    for name in ("gate", "up", "down"):
      assert f"'params/layers/mlp/{name}/kernel'" in message
    assert (
        "is (2, 64, 128) in the checkpoint but (2, 64, 256) in the model"
        in message
    )
    abstract = {
        "params": _abstract_params(config, mesh, rules),
        "rng": _abstract(state["rng"]),
    }
    with pytest.raises(
        ValueError, match="'rng' is missing from the checkpoint"
    ):
      ckpt.restore(1, abstract)


def test_partial_restore_reads_only_the_named_part(tmp_path, model_state):
  _, _, _, state = model_state
  saved = {"train": state, "slots": {"cache": jnp.zeros((64, 3), jnp.float32)}}
  with checkpointer.Checkpointer(str(tmp_path), async_save=False) as ckpt:
    ckpt.save(2, saved, {"step": 2}, host_state={"buffer": np.arange(3)})
  want = {"train": {"params": _abstract(state["params"])}}
  with checkpointer.Checkpointer(str(tmp_path)) as ckpt:
    # The slots are not read, so a run with 256 slots can
    # read these parameters...
    part, extra, host = ckpt.restore(None, want, partial=True)
    _assert_trees_equal(part["train"]["params"], state["params"])
    assert set(part) == {"train"} and set(part["train"]) == {"params"}
    assert extra == {"step": 2} and host is None
    # ...which the whole-state restore refuses, naming the slot array.
    whole = _abstract(saved)
    whole["slots"]["cache"] = jax.ShapeDtypeStruct(
        (256, 3), jnp.float32, sharding=whole["slots"]["cache"].sharding
    )
    with pytest.raises(
        ValueError, match=r"shape of 'slots/cache' is \(64, 3\)"
    ):
      ckpt.restore(None, whole)
    # A part the checkpoint does not hold is named too.
    with pytest.raises(
        ValueError,
        match=r"'train/ema/embedding' is missing from the checkpoint",
    ):
      ckpt.restore(
          None, {"train": {"ema": want["train"]["params"]}}, partial=True
      )
