"""Tests of scalerl_jax/rl/batch.py: the train step's batch from the
buffer's groups, its abstract shapes, shardings and placement."""

import jax
import numpy as np
import pytest

from scalerl_jax import sharding
from scalerl_jax.rl import batch as batch_lib
from tests import helpers
from tests.buffer_test import _group as buffer_group


def test_collate_is_prompt_major_and_trims_padding():
  groups = [
      buffer_group(0, [[0, 0, 0], [0]], seq=80),
      buffer_group(1, [[0], [0, 0]], seq=80),
  ]
  batch = batch_lib.collate(groups, length_multiple=32)
  # Longest row: prompt 2 + 3 tokens = 5 -> trimmed to 32 of 80 columns.
  assert batch["tokens_BxS"].shape == (4, 32)
  np.testing.assert_array_equal(
      batch["tokens_BxS"][2], groups[1].completions.tokens[0, :32]
  )
  np.testing.assert_array_equal(batch["rewards_PxG"], [[1, 0], [1, 0]])
  assert batch["mask_BxS"].sum() == 3 + 1 + 1 + 2
  # The step's inputs, and only them, in the step's dtypes.
  assert {k: v.dtype for k, v in batch.items()} == {
      "tokens_BxS": np.int32,
      "mask_BxS": np.float32,
      "gen_logp_BxS": np.float32,
      "rewards_PxG": np.float32,
  }
  np.testing.assert_array_equal(batch["gen_logp_BxS"], -batch["mask_BxS"])


def test_place_batch_puts_the_host_batch_in_its_shardings_or_names_the_fault():
  host = {"tokens_BxS": np.arange(8, dtype=np.int32).reshape(4, 2)}
  mesh = jax.make_mesh((1,), ("data",), devices=jax.devices()[:1])
  sh = {
      "tokens_BxS": jax.sharding.NamedSharding(
          mesh, jax.sharding.PartitionSpec("data")
      )
  }
  placed = batch_lib.place_batch(host, sh, 1)
  assert placed["tokens_BxS"].sharding == sh["tokens_BxS"]
  np.testing.assert_array_equal(placed["tokens_BxS"], host["tokens_BxS"])
  with pytest.raises(
      ValueError, match="= 4 completions do not divide over the 3-way"
  ):
    batch_lib.place_batch(host, sh, 3)


def test_the_abstract_batch_is_what_collate_builds():
  """batch_shapes(P, G, S) has collate's arrays, shapes and dtypes, and the
  shardings name each of them."""
  groups = [
      buffer_group(i, [[0, 0], [0], [0, 0, 0]], seq=40, reward=(1.0, 0.0, 1.0))
      for i in range(2)
  ]
  host = batch_lib.collate(groups, length_multiple=8)
  abstract = batch_lib.batch_shapes(2, 3, host["tokens_BxS"].shape[1])
  assert {k: (v.shape, v.dtype) for k, v in abstract.items()} == {
      k: (v.shape, v.dtype) for k, v in host.items()
  }
  config = helpers.tiny_config()
  mesh = sharding.make_mesh(config.mesh)
  rules = sharding.logical_rules(config.mesh)
  assert set(batch_lib.shardings(mesh, rules)) == set(host)
