"""Reading a run's checkpoints back: evaluate one, export one.

Both rebuild the run exactly as the trainer does (same config, same workdir,
restored from the chosen checkpoint), so `evaluate_checkpoint` on the last
checkpoint reproduces the run's last validation numbers and
`export_checkpoint` writes the very parameters the run trained.
"""

from __future__ import annotations

import os
import shutil
from typing import Optional

import jax
import ml_collections

from scalerl_jax import trainer as trainer_lib
from scalerl_jax.models import hf_io


def evaluate_checkpoint(config: ml_collections.ConfigDict, workdir: str,
                        step: Optional[int] = None, num_prompts: Optional[int] = None,
                        samples: Optional[int] = None) -> dict[str, float]:
  """Validation mean@k / pass@k of the checkpoint at `step` (default: latest).

  Without any checkpoint in `workdir` the base policy is evaluated.
  """
  trainer = trainer_lib.Trainer(config, workdir, restore_step=step)
  try:
    if num_prompts or samples:
      trainer.val_batches = trainer.exp.eval_batches(num_prompts, samples)
    return {"step": trainer.step, **trainer.evaluate()}
  finally:
    trainer.close()


def export_checkpoint(config: ml_collections.ConfigDict, workdir: str, out: str,
                      step: Optional[int] = None) -> list[str]:
  """Writes the policy of the checkpoint at `step` (default: latest) to `out`.

  Returns:
    The files written (safetensors, config.json, tokenizer).
  """
  trainer = trainer_lib.Trainer(config, workdir, restore_step=step, require_checkpoint=True)
  try:
    files = hf_io.save_checkpoint(trainer.state.params, trainer.exp.model_cfg, out)
    tok_path = trainer.exp.tok.path
    if jax.process_index() == 0 and tok_path and os.path.isfile(tok_path):
      name = "tokenizer.json" if tok_path.endswith(".json") else "tokenizer.model"
      shutil.copyfile(tok_path, os.path.join(out, name))
      files.append(name)
    return files + ["config.json"]
  finally:
    trainer.close()
