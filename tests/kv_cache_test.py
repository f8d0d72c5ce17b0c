"""Tests of scalerl_jax/models/kv_cache.py: row writes, worked by hand."""

import jax.numpy as jnp
import numpy as np

from scalerl_jax.models import kv_cache


def test_write_rows_moves_a_late_start_back_and_keeps_rows_asked_to():
  # Two rows of 5 positions (axis 1 of [B, S]); each writes 2 values.
  cache = jnp.arange(10.0).reshape(2, 5)
  update = jnp.array([[-1.0, -2.0], [-3.0, -4.0]])
  start = jnp.array([1, 4])  # Row 1's start is moved back to 3.
  out = kv_cache.write_rows(cache, update, start, axis=1)
  np.testing.assert_array_equal(out, [[0, -1, -2, 3, 4], [5, 6, 7, -3, -4]])
  kept = kv_cache.write_rows(
      cache, update, start, axis=1, keep_B=jnp.array([False, True])
  )
  np.testing.assert_array_equal(kept, [[0, -1, -2, 3, 4], [5, 6, 7, 8, 9]])
