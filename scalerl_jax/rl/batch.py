"""The train step's batch: which completion fields it reads, how the
buffer's groups become one host batch, its abstract shapes, its shardings,
and its placement on the mesh.

The batch is prompt-major: `tokens_BxS`, `mask_BxS` (1.0 on sampled
tokens) and `gen_logp_BxS`, the completion record's `BATCH_FIELDS`
(sampling/completions.py), with `rewards_PxG`; B = P x G. The step itself:
rl/train_step.py. Shape letters: the package key (scalerl_jax/__init__.py).
"""

from __future__ import annotations

from typing import Sequence

import jax
from jax.sharding import NamedSharding
import numpy as np

from scalerl_jax import sharding
from scalerl_jax.rl import buffer as buffer_lib
from scalerl_jax.sampling import completions as completions_lib

# The fields of the completion record (`sampling/completions.py`) that the
# step reads, each [B, S]; the batch names each `<field>_BxS`.
BATCH_FIELDS = ("tokens", "mask", "gen_logp")
_BATCH_DTYPES = {"tokens": np.int32, "mask": np.float32, "gen_logp": np.float32}


def batch_of(
    rows: dict[str, np.ndarray], rewards_PxG: np.ndarray
) -> dict[str, np.ndarray]:
  """The step's batch: `rows` ({field: [B, S]} of `BATCH_FIELDS`), rewards."""
  batch = {
      f"{name}_BxS": np.asarray(rows[name]).astype(_BATCH_DTYPES[name])
      for name in BATCH_FIELDS
  }
  batch["rewards_PxG"] = np.asarray(rewards_PxG, np.float32)
  return batch


def collate(
    groups: Sequence[buffer_lib.Group], length_multiple: int = 32
) -> dict[str, np.ndarray]:
  """Stacks P groups into the step's prompt-major host batch (`batch_of`).

  Trailing padding that no row uses is cut, to a multiple of
  `length_multiple` (so the train step compiles for a few lengths only).
  """
  rows = completions_lib.stack([g.completions for g in groups], np.concatenate)
  full = rows.tokens.shape[1]
  used = int(rows.seq_len.max())
  s = min(full, -(-used // length_multiple) * length_multiple)
  return batch_of(
      {name: getattr(rows, name)[:, :s] for name in BATCH_FIELDS},
      np.stack([g.rewards_G for g in groups]),
  )


def place_batch(
    host_batch: dict[str, np.ndarray],
    batch_shardings: dict[str, NamedSharding],
    divisor: int,
) -> dict[str, jax.Array]:
  """The host batch (the same on every process) in its shardings.

  Raises:
    ValueError: its rows do not divide over the `divisor`-way batch axes.
  """
  rows = host_batch["tokens_BxS"].shape[0]
  if rows % divisor:
    raise ValueError(
        f"data.prompts_per_step x data.generations_per_prompt = {rows} completions do not "
        f"divide over the {divisor}-way batch sharding of the mesh"
    )
  return {
      k: sharding.place_global(v, batch_shardings[k])
      for k, v in host_batch.items()
  }


def batch_shapes(p: int, g: int, s: int) -> dict[str, jax.ShapeDtypeStruct]:
  """The abstract batch of P prompts x G completions of S positions."""
  batch = {
      f"{name}_BxS": jax.ShapeDtypeStruct((p * g, s), _BATCH_DTYPES[name])
      for name in BATCH_FIELDS
  }
  batch["rewards_PxG"] = jax.ShapeDtypeStruct((p, g), np.float32)
  return batch


def shardings(
    mesh: jax.sharding.Mesh, rules: sharding.Rules
) -> dict[str, NamedSharding]:
  """Each batch array's sharding: rows over the mesh's batch axes, rewards
  replicated."""
  out = {
      f"{name}_BxS": sharding.batch_sharding(mesh, rules, 2)
      for name in BATCH_FIELDS
  }
  out["rewards_PxG"] = sharding.named_sharding(mesh, rules, (None, None))
  return out
