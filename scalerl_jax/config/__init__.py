"""Checks of an experiment config that a locked ConfigDict cannot make.

`validate(config)` runs before anything is built or compiled. It checks the
values each field allows (`fields.RULES`: ranges, and choices read from the
registries that give the names meaning) and the relations between fields
(`relations.py`). Every error is a `ConfigError` whose message starts with
the dotted name of the offending field.

Design: docs/design/config.md.
"""

from __future__ import annotations

from typing import Optional
import warnings

import ml_collections

from scalerl_jax.config.errors import ConfigError
from scalerl_jax.config.fields import check_fields
from scalerl_jax.config.relations import check_relations

# ConfigError is the package's, raised by both kinds of check.
__all__ = ["ConfigError", "PrecisionWarning", "validate"]


def validate(
    config: ml_collections.ConfigDict, num_devices: Optional[int] = None
) -> None:
  """Raises ConfigError naming the first bad field of `config`.

  With `num_devices`, the mesh shape is checked against it and sharded
  dimensions for divisibility with `-1` resolved. Warns `PrecisionWarning`
  for bfloat16 parameters.
  """
  check_fields(config)
  check_relations(config, num_devices)
  _warn_bfloat16_master(config)


class PrecisionWarning(UserWarning):
  """A valid config whose numerics will quietly waste the run."""


def _warn_bfloat16_master(config: ml_collections.ConfigDict) -> None:
  """bfloat16 parameters under AdamW lose updates below one ulp.

  See docs/design/precision.md and tests/precision_test.py.
  """
  if config.model.param_dtype != "bfloat16":
    return
  warnings.warn(
      f"model.param_dtype='bfloat16': AdamW updates the bfloat16 weights themselves, and an "
      f"update at optim.learning_rate={config.optim.learning_rate:g} is far below one "
      f"bfloat16 ulp of a typical weight (2^-8 of it), so most entries never change. Keep "
      f"model.param_dtype='float32' (master weights) with model.compute_dtype='bfloat16'.",
      PrecisionWarning,
      stacklevel=3,
  )
