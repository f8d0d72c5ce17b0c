"""Tests of scalerl_jax/warm_start.py: which settings share
a cached base policy."""

import jax
import numpy as np
import pytest

from scalerl_jax import config as config_lib
from scalerl_jax import experiment
from scalerl_jax import warm_start
from tests import helpers


def _config(seed, warm_start_seed):
  config = helpers.tiny_config(vocab_size=384)
  config.seed, config.trainer.warm_start_seed = seed, warm_start_seed
  return config


def test_base_seed_follows_seed_unless_fixed():
  assert warm_start.base_seed(_config(3, -1)) == 3
  assert warm_start.base_seed(_config(3, 0)) == 0


def test_fixed_base_seed_shares_one_cached_base_across_seeds():
  fp = lambda seed, base: warm_start.fingerprint(
      _config(seed, base), vocab_size=384
  )
  assert fp(1, 0) == fp(2, 0) == fp(0, -1) == fp(0, 0)
  assert fp(1, -1) != fp(2, -1)
  assert fp(1, -1) == fp(0, 1)


def test_pool_size_changes_the_base_only_where_the_warm_start_draws_from_it():
  """The default task warm-starts on its RL pool's worked solutions; the
  parity and search tasks on their own `warm` split."""
  for source, shared in (
      ("builtin", False),
      ("builtin_parity", True),
      ("builtin_search", True),
  ):
    small, large = _config(0, -1), _config(0, -1)
    small.data.source = large.data.source = source
    small.data.builtin_num_train, large.data.builtin_num_train = 320, 2_000
    same = warm_start.fingerprint(small, 384) == warm_start.fingerprint(
        large, 384
    )
    assert same == shared, source


def test_fixed_base_seed_gives_seeds_the_same_initial_policy(tmp_path):
  """Without a warm start the base is the initialisation:
  the same for seeds 0 and 1."""
  params = []
  for seed in (0, 1):
    config = _config(seed, 0)
    config.trainer.warm_start_steps = 0
    exp = experiment.Experiment.build(config, str(tmp_path))
    params.append(jax.tree.leaves(jax.device_get(exp.params)))
  for a, b in zip(*params):
    np.testing.assert_array_equal(a, b)
  config = _config(1, -1)
  config.trainer.warm_start_steps = 0
  other = jax.tree.leaves(
      jax.device_get(experiment.Experiment.build(config, str(tmp_path)).params)
  )
  assert any(not np.array_equal(a, b) for a, b in zip(params[0], other))


def test_base_seed_below_minus_one_is_refused():
  with pytest.raises(
      config_lib.ConfigError, match=r"trainer.warm_start_seed: .*-1"
  ):
    config_lib.validate(_config(0, -2))


def _precision(config, compute_dtype, fp32_lm_head, float32_base):
  config.model.compute_dtype = compute_dtype
  config.model.fp32_lm_head = fp32_lm_head
  config.trainer.warm_start_float32 = float32_base
  return config


def test_a_float32_base_is_shared_by_points_that_differ_in_precision():
  fp = lambda *precision: warm_start.fingerprint(
      _precision(_config(0, 0), *precision), vocab_size=384
  )
  reference = fp("float32", True, False)
  assert fp("float32", True, True) == reference
  assert fp("bfloat16", True, True) == reference
  assert fp("bfloat16", False, True) == reference
  assert fp("bfloat16", True, False) != reference
  assert fp("bfloat16", False, False) != fp("bfloat16", True, False)


def test_a_float32_base_trains_as_the_float32_run_does(tmp_path):
  """The warm start of a bfloat16 run with `trainer.warm_start_float32` gives
  the float32 run's parameters to the bit; without it, others."""

  def base(name, *precision):
    config = _precision(_config(0, 0), *precision)
    config.trainer.warm_start_steps = 3
    exp = experiment.Experiment.build(config, str(tmp_path / name))
    return jax.tree.leaves(jax.device_get(exp.params))

  reference = base("float32", "float32", True, False)
  shared = base("shared", "bfloat16", False, True)
  own = base("own", "bfloat16", False, False)
  for a, b in zip(reference, shared):
    np.testing.assert_array_equal(a, b)
  assert any(not np.array_equal(a, b) for a, b in zip(reference, own))
