"""Reading a run's policy back from its checkpoints: evaluate or export it.

Both read the config the run recorded in its workdir and restore only the
policy parameters (an orbax partial restore), so nothing about the rest of
the state has to be given again. Design: docs/design/checkpoints.md.
"""

from __future__ import annotations

import os
import shutil
from typing import Any, Optional

from absl import logging
import jax
import numpy as np

from scalerl_jax import evaluation
from scalerl_jax import sharding
from scalerl_jax import workdir as workdir_lib
from scalerl_jax.checkpoint import checkpointer as checkpoint_lib
from scalerl_jax.experiment import Experiment
from scalerl_jax.models import hf_io
from scalerl_jax.multihost import runtime


def _policy(
    workdir: str,
    step: Optional[int],
    require_checkpoint: bool,
    process_id: Optional[int],
    defaults: Optional[workdir_lib.BaseConfig],
) -> tuple[Experiment, Any, int]:
  """(experiment, params, step) of checkpoint `step` (None: the latest).

  Without a checkpoint: the base policy at step 0, unless `require_checkpoint`
  (FileNotFoundError). `process_id` replaces the recorded one; `defaults`
  fills in fields the record predates (`workdir.load_config`).
  """
  config = workdir_lib.load_config(workdir, process_id, defaults)
  # Before orbax touches a device.
  runtime.maybe_initialize_distributed(config.mesh)
  checkpointer = checkpoint_lib.for_workdir(workdir)
  try:
    step = checkpointer.step_to_restore(step, require=require_checkpoint)
    exp = Experiment.build(config, workdir, base_params=step is None)
    if step is None:
      return exp, exp.params, 0
    abstract = sharding.abstract(exp.params, exp.param_shardings)
    part = checkpointer.restore(
        step, {"train": {"params": abstract}}, partial=True
    )
    return exp, part.state["train"]["params"], step
  finally:
    checkpointer.close()


def evaluate_checkpoint(
    workdir: str,
    step: Optional[int] = None,
    num_prompts: Optional[int] = None,
    samples: Optional[int] = None,
    repeats: int = 1,
    process_id: Optional[int] = None,
    defaults: Optional[workdir_lib.BaseConfig] = None,
) -> dict[str, Any]:
  """Validation mean@k / pass@k of checkpoint `step` (default: the latest).

  Without any checkpoint the base policy is evaluated. `num_prompts` and
  `samples` (k) default to `trainer.eval_num_prompts` and `eval_samples`.
  Repeat 0 uses the trainer's validation key, so it reproduces the run's
  numbers; repeat r > 0 folds r into it. Returns "step" and repeat 0's
  `evaluation.evaluate` metrics; with `repeats` > 1 also every repeat's
  metrics ("repeats") and each metric's std across them ("<metric>_std",
  ddof=1): the sampling noise of one evaluation. `process_id` replaces the
  recorded `mesh.process_id`; `defaults` fills in fields the record predates.
  """
  if repeats < 1:
    raise ValueError(f"repeats must be >= 1, got {repeats}")
  exp, params, step = _policy(
      workdir,
      step,
      require_checkpoint=False,
      process_id=process_id,
      defaults=defaults,
  )
  pool = exp.reward_pool()
  base_key = evaluation.validation_key(exp.config)
  runs = []
  try:
    batches = exp.eval_batches(num_prompts, samples)
    params = exp.to_generator(params)
    for r in range(repeats):
      key = base_key if r == 0 else jax.random.fold_in(base_key, r)
      runs.append(
          evaluation.evaluate(
              exp.sampler,
              params,
              batches,
              exp.tok,
              pool,
              key,
              version=step,
          )
      )
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


def export_checkpoint(
    workdir: str,
    out: str,
    step: Optional[int] = None,
    process_id: Optional[int] = None,
    defaults: Optional[workdir_lib.BaseConfig] = None,
) -> list[str]:
  """Writes the policy of checkpoint `step` (default: the latest) to `out`.

  Returns the files written (safetensors, config.json, tokenizer); raises
  FileNotFoundError when the workdir holds no checkpoint.
  """
  exp, params, _ = _policy(
      workdir,
      step,
      require_checkpoint=True,
      process_id=process_id,
      defaults=defaults,
  )
  files = hf_io.save_checkpoint(params, exp.model_cfg, out)
  tok_path = exp.tok.path
  if jax.process_index() == 0 and tok_path and os.path.isfile(tok_path):
    name = "tokenizer.json" if tok_path.endswith(".json") else "tokenizer.model"
    shutil.copyfile(tok_path, os.path.join(out, name))
    files.append(name)
  return files + ["config.json"]
