"""The completion record: one type from the sampler's harvest to the batch.

`Completions` holds finished sequences, one row each. The sampler harvests
them ([F, ...] rows, sampling/slots.py); a prompt's group keeps its G rows as
harvested (`rl/buffer.Group`); the train batch stacks the groups' rows
(`rl/batch.collate`) and reads `rl/batch.BATCH_FIELDS` of them as
`<field>_BxS`. Host numpy arrays once harvested.

Shape letters: the package key (scalerl_jax/__init__.py), and W metadata ints
per sequence.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import flax.struct
import jax
import numpy as np


@flax.struct.dataclass
class Completions:
  """Finished sequences, one row each (shapes below for F rows)."""

  tokens: jax.Array  # [F, S] int32
  # [F, S] float32 log pi_gen at the sampling temperature (use in losses).
  gen_logp: jax.Array
  # [F, S] float32 log-prob under the top-k/top-p distribution.
  logp_sampling: jax.Array
  # [F, S] int32 policy version per generated token; -1 elsewhere.
  version: jax.Array
  mask: jax.Array  # [F, S] bool generated tokens.
  prompt_len: jax.Array  # [F] int32
  seq_len: jax.Array  # [F] int32 prompt + completion tokens (with injected).
  truncated: jax.Array  # [F] bool hit the length limit without an EOS token.
  interrupted: jax.Array  # [F] bool the thinking-budget phrase was injected.
  thinking_budget: jax.Array  # [F] int32 drawn budget (0: interruptions off).
  meta: jax.Array  # [F, W] int32 as passed to `start`.
  slot: jax.Array  # [F] int32 the slot it ran in (now free).

  @property
  def completion_len(self) -> jax.Array:
    """[F] int32: completion tokens (sampled + injected) of each row."""
    return completion_lengths(self.prompt_len, self.seq_len)


def completion_lengths(prompt_len: jax.Array, seq_len: jax.Array) -> jax.Array:
  """int32 completion tokens (sampled + injected) of rows with these lengths.

  The rule for a finished row (`Completions.completion_len`) and for a slot
  still decoding (the decode loop's interruption and length limit).

  Args:
    prompt_len: int32 prompt tokens of each row.
    seq_len: int32 prompt + completion tokens of each row, same shape.

  Returns:
    int32 `seq_len - prompt_len`, host or device as the inputs are.
  """
  return (seq_len - prompt_len).astype(np.int32)


_FIELDS = dataclasses.fields(Completions)


def to_arrays(rows: Completions, prefix: str = "") -> dict[str, np.ndarray]:
  """The record's fields (host arrays), each named `prefix` + field."""
  return {prefix + f.name: np.asarray(getattr(rows, f.name)) for f in _FIELDS}


def from_arrays(arrays: dict[str, np.ndarray], prefix: str = "") -> Completions:
  """Inverse of `to_arrays`; other entries of `arrays` are not read."""
  return Completions(
      **{f.name: np.asarray(arrays[prefix + f.name]) for f in _FIELDS}
  )


def stack(rows: Sequence[Completions], axis_fn=np.stack):
  """One record of all `rows` (np.stack: rows of one; np.concatenate: many)."""
  return jax.tree.map(lambda *x: axis_fn(x), *rows)
