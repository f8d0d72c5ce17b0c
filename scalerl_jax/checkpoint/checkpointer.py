"""Checkpoints of everything a run needs to resume, with orbax.

A checkpoint is a step directory `<directory>/<step>/` of orbax items saved
together: `state` (jax.Arrays, restored into the shardings of an abstract
tree), `extra` (JSON) and `host_state` (numpy, written by the primary, so it
must be the same on every process). A step is complete once renamed into
place with its integrity manifest; `latest_step` and `restore` verify the
files before any array is read. Opening a `Checkpointer` moves nothing.

Design: docs/design/checkpoints.md.
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple, Optional

from absl import logging
from etils import epath
import jax
from jax.experimental import multihost_utils
import orbax.checkpoint as ocp

from scalerl_jax import workdir as workdir_lib
from scalerl_jax.checkpoint import integrity
from scalerl_jax.checkpoint import layout

_STATE, _EXTRA, _LAYOUT, _ARRAYS = (
    "state",
    "extra",
    "host_layout",
    "host_arrays",
)


class DamagedCheckpointError(ValueError):
  """A checkpoint's files differ from what was saved; nothing was loaded."""


class CheckpointWriteError(RuntimeError):
  """A save failed (e.g. disk full); earlier checkpoints are intact."""


class Restored(NamedTuple):
  """What `Checkpointer.restore` returns."""

  state: Any  # jax.Arrays in the abstract tree's structure and shardings.
  extra: dict[str, Any]  # The JSON dict given to `save`.
  host_state: Any  # The numpy pytree given to `save`, or None if none was.


class Checkpointer:
  """Saves and restores a run's state, extra JSON and host arrays by step."""

  def __init__(
      self,
      directory: str,
      max_to_keep: Optional[int] = 3,
      save_interval_steps: int = 1,
      async_save: bool = True,
  ):
    """Opens (creating if needed) `directory`, a local path or an epath URL.

    `max_to_keep` None keeps all. `save` writes only multiples of
    `save_interval_steps`, unless forced or JAX reports a preemption. With
    `async_save` it writes in the background once the arrays are off the
    devices (`wait` blocks until done).
    """
    self.directory = str(directory)
    self._root = epath.Path(directory)
    self._async_save = async_save
    self._sealing: Optional[int] = None  # The step of the save in flight.
    self._intact: set[int] = set()  # Steps this object has verified.
    # Unlike orbax's default, no unconditional first save: only multiples of the
    # interval, forced saves and JAX's preemption sync point.
    policy = ocp.checkpoint_managers.AnySavePolicy(
        [
            ocp.checkpoint_managers.FixedIntervalPolicy(save_interval_steps),
            ocp.checkpoint_managers.PreemptionCheckpointingPolicy(),
        ]
    )
    # Always orbax's async checkpointer: only it runs the post-finalization
    # callback that seals each step (`save` waits when async_save is False).
    options = ocp.CheckpointManagerOptions(
        max_to_keep=max_to_keep,
        save_decision_policy=policy,
        create=True,
        enable_async_checkpointing=True,
        async_options=ocp.AsyncOptions(post_finalization_callback=self._seal),
    )
    self._manager = ocp.CheckpointManager(
        directory,
        options=options,
        item_handlers={
            _STATE: ocp.StandardCheckpointHandler(),
            _EXTRA: ocp.JsonCheckpointHandler(),
            _LAYOUT: ocp.JsonCheckpointHandler(),
            _ARRAYS: ocp.StandardCheckpointHandler(),
        },
    )

  def save(
      self,
      step: int,
      state: Any,
      extra: Optional[dict[str, Any]] = None,
      host_state: Any = None,
      force: bool = False,
  ) -> bool:
    """Saves checkpoint `step`, in the background unless `async_save=False`.

    Damaged or unfinished checkpoints of `step` or later are first moved aside
    to `<step>.damaged`. `host_state` is a pytree (str-keyed dicts, lists,
    tuples, None) of numpy arrays of any shape, zero-size included. Returns
    whether a save started: not when the interval skips `step` (unless `force`)
    or an intact checkpoint of `step` exists. Raises TypeError naming the key
    of `extra` or `host_state` that cannot be stored.
    """
    extra = {} if extra is None else extra
    layout.check_json(extra)
    host_layout, arrays = (
        (None, {}) if host_state is None else layout.encode_host(host_state)
    )
    self._set_aside_damaged(step)
    if not force and not self._manager.should_save(step):
      return False
    if step in self._manager.all_steps():
      logging.info(
          "Checkpoint of step %d already exists in %s; not saving again.",
          step,
          self.directory,
      )
      return False
    items = {
        _STATE: ocp.args.StandardSave(state),
        _EXTRA: ocp.args.JsonSave(extra),
        _LAYOUT: ocp.args.JsonSave(
            {"layout": host_layout, "num_arrays": len(arrays)}
        ),
    }
    if arrays:
      items[_ARRAYS] = ocp.args.StandardSave(arrays)
    # orbax would wait for the previous save here too; waiting first means
    # `_seal` of that save cannot read the step set for this one.
    self.wait()
    self._sealing = step
    # What was verified belonged to an earlier save of this step number.
    self._intact.discard(step)
    try:
      started = self._manager.save(
          step, args=ocp.args.Composite(**items), force=True
      )
    except Exception as e:  # orbax and tensorstore raise OSError, ValueError...
      raise self._write_failed(step, e) from e
    if started and not self._async_save:
      self.wait()
    return started

  def _seal(self) -> None:
    """Writes the manifest of the save in flight (orbax's callback).

    orbax calls it on the primary once all have written, before the rename.
    """
    final = self._root / str(self._sealing)
    tmp = final.parent / (final.name + ocp.path.atomicity_types.TMP_DIR_SUFFIX)
    # On object stores orbax writes into the final directory and commits with
    # a marker file instead of renaming.
    integrity.write_manifest(tmp if tmp.exists() else final)

  def _damage(self, step: int) -> Optional[str]:
    """Why checkpoint `step` cannot be restored; None when it verifies."""
    if step in self._intact:
      return None
    damage = integrity.find_damage(self._root / str(step))
    if damage is None:
      self._intact.add(step)
    return damage

  def _set_aside_damaged(self, step: int) -> None:
    """Moves damaged checkpoints of `step` or later out of orbax's sight.

    orbax saves no step up to the newest step directory: without this, a run
    that fell back past them would not checkpoint until it passed them.
    """
    later = [s for s in self._manager.all_steps() if s >= step]
    if not later:
      return
    self.wait()  # This run's own save in flight is not damage.
    damaged = [s for s in later if self._damage(s) is not None]
    if not damaged:
      return
    if jax.process_index() == 0:
      for s in damaged:
        aside, n = self._root / f"{s}.damaged", 1
        while aside.exists():
          n += 1
          aside = self._root / f"{s}.damaged-{n}"
        (self._root / str(s)).rename(aside)
        logging.warning(
            "Moved damaged checkpoint %s aside to %s before saving step %d; "
            "delete it once inspected.",
            self._root / str(s),
            aside,
            step,
        )
    if jax.process_count() > 1:
      multihost_utils.sync_global_devices(f"checkpoint_set_aside_{step}")
    self._manager.reload()

  def all_steps(self) -> list[int]:
    """Steps sealed by a manifest, ascending: complete, not verified intact."""
    return sorted(
        s
        for s in self._manager.all_steps()
        if (self._root / str(s) / integrity.MANIFEST).exists()
    )

  def latest_step(self) -> Optional[int]:
    """The newest checkpoint whose files verify, or None if there is none.

    Waits for this object's save in flight. Newer damaged checkpoints are
    skipped with a warning; DamagedCheckpointError when none is intact.
    """
    self.wait()
    skipped = []
    for step in sorted(self._manager.all_steps(), reverse=True):
      damage = self._damage(step)
      if damage is None:
        for bad, why in skipped:
          logging.warning(
              "Checkpoint %s is damaged and skipped: %s. The newest intact one is "
              "step %d; a run resumed from it moves the damaged one aside when it "
              "saves.",
              self._root / str(bad),
              why,
              step,
          )
        return step
      skipped.append((step, damage))
    if skipped:
      listed = "; ".join(f"step {bad}: {why}" for bad, why in skipped)
      raise DamagedCheckpointError(
          f"{self.directory}: no checkpoint can be restored, nothing was loaded. {listed}. "
          f"Restore these step directories from a backup, or move them out of "
          f"{self.directory} to start the run afresh."
      )
    return None

  def step_to_restore(
      self, step: Optional[int] = None, require: bool = False
  ) -> Optional[int]:
    """`step`, checked to be a complete checkpoint, or the latest intact one.

    ValueError lists `all_steps()` when `step` is not one of them;
    FileNotFoundError when `require` and there is no checkpoint.
    """
    if step is None:
      step = self.latest_step()
    elif step not in self.all_steps():
      raise ValueError(
          f"{self.directory}: no checkpoint at step {step}; "
          f"available: {self.all_steps()}"
      )
    if require and step is None:
      raise FileNotFoundError(f"{self.directory}: no checkpoint to read")
    return step

  def restore(
      self, step: Optional[int], abstract_state: Any, partial: bool = False
  ) -> Restored:
    """Verifies checkpoint `step` (None: `latest_step()`) and restores it.

    `abstract_state` is a pytree of `jax.ShapeDtypeStruct`s (or jax.Arrays)
    with `.sharding`: each process reads only its shards, cast to the dtype
    asked. With `partial` it names a part of the state by nested dict keys
    (e.g. {"train": {"params": ...}}); only that part is read, and `host_state`
    is None. Raises FileNotFoundError (no such complete checkpoint),
    DamagedCheckpointError (it does not verify; for None: none does) or
    ValueError (the stored state does not fit; each bad key is named).
    """
    if step is None:
      step = self.latest_step()
      if step is None:
        raise FileNotFoundError(
            f"{self.directory}: holds no complete checkpoint"
        )
    elif step not in self._manager.all_steps():
      raise FileNotFoundError(
          f"{self.directory}: no checkpoint of step {step}; "
          f"complete checkpoints: {self.all_steps()}"
      )
    self._check_intact(step)
    abstract = layout.abstract_tree(abstract_state)
    stored = self._manager.item_metadata(step)[_STATE]
    layout.check_fits(
        getattr(stored, "tree", stored),
        abstract,
        partial,
        f"{self.directory}, step {step}",
    )
    meta = self._manager.restore(
        step,
        args=ocp.args.Composite(
            **{_EXTRA: ocp.args.JsonRestore(), _LAYOUT: ocp.args.JsonRestore()}
        ),
    )
    if partial:
      part = ocp.PyTreeCheckpointer().restore(
          self._root / str(step) / _STATE,
          args=ocp.args.PyTreeRestore(
              abstract,
              ocp.checkpoint_utils.construct_restore_args(abstract),
              partial_restore=True,
          ),
      )
      return Restored(part, meta[_EXTRA], None)
    host_layout, has_arrays = (
        meta[_LAYOUT]["layout"],
        meta[_LAYOUT]["num_arrays"] > 0,
    )
    items = {_STATE: ocp.args.StandardRestore(abstract)}
    if has_arrays:
      items[_ARRAYS] = ocp.args.StandardRestore()
    restored = self._manager.restore(step, args=ocp.args.Composite(**items))
    host_state = None
    if host_layout is not None:
      host_state = layout.decode_host(
          host_layout, dict(restored[_ARRAYS]) if has_arrays else {}
      )
    return Restored(restored[_STATE], meta[_EXTRA], host_state)

  def _check_intact(self, step: int) -> None:
    """Raises DamagedCheckpointError naming the faults of checkpoint `step`."""
    damage = self._damage(step)
    if damage is None:
      return
    intact = [
        s
        for s in self._manager.all_steps()
        if s != step and self._damage(s) is None
    ]
    raise DamagedCheckpointError(
        f"{self._root / str(step)} cannot be restored, nothing was loaded from it: {damage}. "
        f"Intact checkpoints: {sorted(intact)}. Restore one of those, or move this "
        f"directory out of {self.directory} so that a restart resumes from the newest one."
    )

  def wait(self) -> None:
    """Blocks on the pending save; raises CheckpointWriteError if it failed."""
    try:
      self._manager.wait_until_finished()
    except Exception as e:  # orbax and tensorstore raise OSError, ValueError...
      raise self._write_failed(self._sealing, e) from e

  def _write_failed(
      self, step: Optional[int], error: Exception
  ) -> CheckpointWriteError:
    """The error of a failed save, naming its cause and what is left intact."""
    return CheckpointWriteError(
        f"{self.directory}: writing the checkpoint of step {step} failed: "
        f"{type(error).__name__}: {error}. Its partial files are ignored and the complete "
        f"checkpoints ({self.all_steps()}) are untouched. Free disk space or make the directory "
        "writable, then restart: the run resumes from the newest of them."
    )

  def close(self) -> None:
    """Frees orbax's resources after `wait`, even when `wait` raises."""
    try:
      self.wait()
    finally:
      self._manager.close()

  def __enter__(self) -> "Checkpointer":
    return self

  def __exit__(self, *exc) -> None:
    self.close()


def for_workdir(
    workdir: str, max_to_keep: Optional[int] = None
) -> Checkpointer:
  """The checkpointer of a run's workdir (`<workdir>/checkpoints`)."""
  return Checkpointer(
      os.path.join(workdir, workdir_lib.CHECKPOINTS_DIR),
      max_to_keep=max_to_keep,
  )
