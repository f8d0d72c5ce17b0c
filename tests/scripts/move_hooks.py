"""Test-only hooks on the weights' move to the generator, for the scripts of
tests/free_running_test.py and tests/disaggregated_faults_test.py.

`split_move` moves the leaves one at a time and calls back halfway through
the move (to delay it, fail it, or mark the moment and wait there for a
kill). `WeightRecord` tells which version each decode call's weights are,
from their contents: every tree the sampler regroups is matched, leaf by
leaf, against the trainer's parameters of each version the run moved.
"""

import hashlib

import jax
import numpy as np

from scalerl_jax import experiment
from scalerl_jax.rl import slot_runner
from scalerl_jax.rl import weight_sync
from scalerl_jax.sampling import sampler as sampler_lib


def split_move(at_half):
  """Patches `Experiment.to_generator` to put the leaves one at a time,
  calling `at_half(version, n)` once half are put: the version moving and
  the move's number in this process (from 1)."""
  to_generator, get = experiment.Experiment.to_generator, (
      weight_sync.WeightSync.get
  )
  moving = {"version": None, "n": 0}

  def get_noting_version(self, params, version, keep=False):
    moving["version"] = version
    return get(self, params, version, keep)

  def split(self, params):
    if self.generator_param_shardings is None:
      return to_generator(self, params)
    if self.transfer_cast is not None:
      params = self.transfer_cast(params)
    leaves, treedef = jax.tree.flatten(params)
    shardings = jax.tree.leaves(self.generator_param_shardings)
    half = len(leaves) // 2
    moving["n"] += 1
    put = [jax.device_put(x, s) for x, s in zip(leaves[:half], shardings)]
    at_half(moving["version"], moving["n"])
    put += [
        jax.device_put(x, s)
        for x, s in zip(leaves[half:], shardings[half:], strict=True)
    ]
    return jax.tree.unflatten(treedef, put)

  weight_sync.WeightSync.get = get_noting_version
  experiment.Experiment.to_generator = split


def _digests(tree):
  return [
      hashlib.sha256(np.asarray(x).tobytes()).hexdigest()
      for x in jax.tree.leaves(tree)
  ]


class WeightRecord:
  """Patches `WeightSync.get`, `Sampler.prepare` and `SlotRunner.dispatch`
  to record which version's weights each decode call decoded with.

  `prepares`: for each tree the sampler regrouped, the versions whose
  parameters equal it in every leaf (empty: a mix of versions, or weights
  the trainer never had). `dispatches`: for each decode call, the version
  its tokens are tagged with and the versions its regrouped weights are.
  """

  def __init__(self):
    self.trainer: dict[int, list[str]] = {}  # Version -> leaf digests.
    self.prepares: list[list[int]] = []
    self.dispatches: list[tuple[int, list[int]]] = []
    self._of: dict[int, list[int]] = {}  # id(prepared) -> its versions.
    self._kept = []  # The prepared weights, alive: ids stay theirs.
    get = weight_sync.WeightSync.get
    prepare = sampler_lib.Sampler.prepare
    dispatch = slot_runner.SlotRunner.dispatch

    def recorded_get(sync, params, version, keep=False):
      self.trainer[version] = _digests(params)
      return get(sync, params, version, keep)

    def recorded_prepare(sampler, params):
      prepared = prepare(sampler, params)
      if not isinstance(params, sampler_lib.PreparedParams):
        moved = _digests(params)
        versions = sorted(
            v for v, digests in self.trainer.items() if digests == moved
        )
        self.prepares.append(versions)
        self._of[id(prepared)] = versions
        self._kept.append(prepared)
      return prepared

    def recorded_dispatch(runner, params, version, num_steps):
      self.dispatches.append((version, self._of.get(id(params), [])))
      return dispatch(runner, params, version, num_steps)

    weight_sync.WeightSync.get = recorded_get
    sampler_lib.Sampler.prepare = recorded_prepare
    slot_runner.SlotRunner.dispatch = recorded_dispatch
