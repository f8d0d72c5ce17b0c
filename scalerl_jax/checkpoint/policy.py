"""Reading a run's checkpoints back: evaluate one, export one.

Both read the run's config from its workdir (`workdir.load_config`) and restore only
the policy parameters from the checkpoint (an orbax partial restore): the
optimizer state, sampler slots, buffer and data position are not read, so
nothing about them (e.g. the slot count that `data.prompts_per_step` sets)
has to be given again. `evaluate_checkpoint` on the last checkpoint
reproduces the run's last validation numbers; `export_checkpoint` writes the
very parameters the run trained.
"""

from __future__ import annotations

import os
import shutil
from typing import Any, Optional

from absl import logging
import jax
import numpy as np

from scalerl_jax.checkpoint import checkpointer as checkpoint_lib
from scalerl_jax import evaluation
from scalerl_jax import sharding
from scalerl_jax import workdir as workdir_lib
from scalerl_jax.experiment import Experiment
from scalerl_jax.models import hf_io

def _policy(workdir: str, step: Optional[int], require_checkpoint: bool,
            process_id: Optional[int]) -> tuple[Experiment, Any, int]:
  """(experiment, params, step) of the checkpoint at `step` (None: the latest).

  Without any checkpoint the base policy is returned at step 0, unless
  `require_checkpoint`. `process_id` replaces the recorded one (`workdir.load_config`).
  """
  config = workdir_lib.load_config(workdir, process_id)
  sharding.maybe_initialize_distributed(config.mesh)  # Before orbax touches a device.
  checkpointer = checkpoint_lib.for_workdir(workdir)
  try:
    step = checkpointer.step_to_restore(step, require=require_checkpoint)
    exp = Experiment.build(config, workdir, base_params=step is None)
    if step is None:
      return exp, exp.params, 0
    abstract = sharding.abstract(exp.params, exp.param_shardings)
    part = checkpointer.restore(step, {"train": {"params": abstract}}, partial=True)
    return exp, part.state["train"]["params"], step
  finally:
    checkpointer.close()


def evaluate_checkpoint(workdir: str, step: Optional[int] = None,
                        num_prompts: Optional[int] = None,
                        samples: Optional[int] = None, repeats: int = 1,
                        process_id: Optional[int] = None) -> dict[str, Any]:
  """Validation mean@k / pass@k of the checkpoint at `step` (default: latest).

  Without any checkpoint in `workdir` the base policy is evaluated.

  Args:
    workdir: the run's workdir (with its config.json).
    step: checkpoint step; None for the latest.
    num_prompts: validation prompts; default `trainer.eval_num_prompts`.
    samples: k of mean@k; default `trainer.eval_samples`.
    repeats: evaluations of the same parameters; the first uses the trainer's
      validation key (so it reproduces the run's numbers), repeat r > 0 the key
      folded with r. With repeats > 1 the result also holds every repeat's
      metrics ("repeats") and each metric's standard deviation across them
      ("<metric>_std", ddof=1): the sampling noise of one evaluation.
    process_id: this process's index in a multi-controller job; None keeps
      the recorded `mesh.process_id` (`workdir.load_config`).

  Returns:
    "step" and the `evaluation.evaluate` metrics (of the first repeat).
  """
  if repeats < 1:
    raise ValueError(f"repeats must be >= 1, got {repeats}")
  exp, params, step = _policy(workdir, step, require_checkpoint=False, process_id=process_id)
  pool = exp.reward_pool()
  base_key = evaluation.validation_key(exp.config)
  runs = []
  try:
    batches = exp.eval_batches(num_prompts, samples)
    for r in range(repeats):
      key = base_key if r == 0 else jax.random.fold_in(base_key, r)
      runs.append(evaluation.evaluate(exp.sampler, params, batches, exp.tok, pool, key,
                                      version=step))
      if repeats > 1:
        logging.info("Evaluation %d/%d: %s", r + 1, repeats, runs[-1])
  finally:
    pool.close()
  result = {"step": step, **runs[0]}
  if repeats > 1:
    result["repeats"] = runs
    for name in runs[0]:
      result[f"{name}_std"] = float(np.std([run[name] for run in runs], ddof=1))
  return result


def export_checkpoint(workdir: str, out: str, step: Optional[int] = None,
                      process_id: Optional[int] = None) -> list[str]:
  """Writes the policy of the checkpoint at `step` (default: latest) to `out`.

  Args:
    workdir: the run's workdir (with its config.json).
    out: output directory.
    step: checkpoint step; None for the latest.
    process_id: as in `evaluate_checkpoint`.

  Returns:
    The files written (safetensors, config.json, tokenizer).
  """
  exp, params, _ = _policy(workdir, step, require_checkpoint=True, process_id=process_id)
  files = hf_io.save_checkpoint(params, exp.model_cfg, out)
  tok_path = exp.tok.path
  if jax.process_index() == 0 and tok_path and os.path.isfile(tok_path):
    name = "tokenizer.json" if tok_path.endswith(".json") else "tokenizer.model"
    shutil.copyfile(tok_path, os.path.join(out, name))
    files.append(name)
  return files + ["config.json"]
