"""Builds an experiment's pieces from its config: the one place that wires them.

`Experiment.build` validates the config, joins the multi-host runtime if
asked, and makes the mesh, tokenizer, policy (imported from `model.hf_path`
or warm-started), sampler, reward pool and prompt sources. The trainer,
`launch/evaluate.py` and `launch/export.py` all start here, so they see the
same model and data.
"""

from __future__ import annotations

import dataclasses
import functools
import logging as pylogging
import math
import os
from typing import Any, Optional

from absl import logging
import jax
import ml_collections

from scalerl_jax import config as config_lib
from scalerl_jax import evaluation
from scalerl_jax import sharding
from scalerl_jax import warm_start
from scalerl_jax.data import mixture
from scalerl_jax.data import pipeline as pipeline_lib
from scalerl_jax.data import sources
from scalerl_jax.data import tokenizer as tokenizer_lib
from scalerl_jax.models import decode
from scalerl_jax.models import hf_io
from scalerl_jax.models import model_config
from scalerl_jax.models import transformer
from scalerl_jax.multihost import runtime
from scalerl_jax.rewards.sandbox import isolation
from scalerl_jax.rewards.workers.pool import RewardPool
from scalerl_jax.rewards.workers.shared import SharedRewardPool
from scalerl_jax.sampling.sampler import Sampler


def read_model_config(
    config: ml_collections.ConfigDict,
) -> model_config.ModelConfig:
  """The run's ModelConfig: `config.model`, or `model.hf_path`'s network.

  With `hf_path` the network's shape comes from the checkpoint's config.json
  and is written back into `config.model`; the run's choices (every
  `model_config.run_time_fields()`) come from `config.model`.
  """
  if not config.model.hf_path:
    return model_config.ModelConfig.from_config(config.model)
  cfg = hf_io.read_config(
      config.model.hf_path,
      **{name: config.model[name] for name in model_config.run_time_fields()},
  )
  with config.unlocked():
    config.model.update(dataclasses.asdict(cfg))
  return cfg


def _validate_and_join(config: ml_collections.ConfigDict) -> None:
  """Validates `config`, joins the multi-host runtime, validates it again."""
  config_lib.validate(config)
  runtime.maybe_initialize_distributed(config.mesh)
  config_lib.validate(config, num_devices=jax.device_count())


def _meshes(
    config: ml_collections.ConfigDict,
) -> tuple[jax.sharding.Mesh, jax.sharding.Mesh]:
  """(trainer's mesh, generator's mesh); one mesh when colocated."""
  trainer_devices, generator_devices = sharding.role_devices(config.mesh)
  mesh = sharding.make_mesh(config.mesh, trainer_devices)
  generator_mesh = (
      sharding.make_mesh(config.mesh, generator_devices)
      if generator_devices is not trainer_devices
      else mesh
  )
  return mesh, generator_mesh


def _checked_model_config(
    config: ml_collections.ConfigDict,
) -> model_config.ModelConfig:
  """`read_model_config`, validating again what `model.hf_path` wrote."""
  model_cfg = read_model_config(config)
  if config.model.hf_path:
    config_lib.validate(config, num_devices=jax.device_count())
  return model_cfg


def _policy(config, workdir, model_cfg, mesh, rules, tok, base_params):
  """(model, its parameters' shardings, its base parameters) on `mesh`."""
  model = transformer.Transformer(model_cfg)
  shardings = sharding.param_shardings(model, mesh, rules)
  if config.model.hf_path and base_params:
    _, params = hf_io.load_checkpoint(
        config.model.hf_path, shardings=shardings, cfg=model_cfg
    )
  else:
    params, _ = sharding.init_model_params(
        model, jax.random.key(warm_start.base_seed(config)), mesh, rules
    )
    if base_params:
      params = warm_start.warm_start(
          config, workdir, model, params, shardings, tok
      )
  return model, shardings, params


def _transfer_cast(config, model_cfg, shardings) -> Any:
  """The jitted cast mesh.transfer_dtype='bfloat16' sends; else None."""
  transfer_cast = None
  if config.mesh.get("transfer_dtype", "float32") == "bfloat16":
    transfer_cast = jax.jit(
        functools.partial(decode.cast_for_prepare, model_cfg),
        out_shardings=shardings,
    )
  return transfer_cast


def _sampler(config, generator_mesh, rules, tok) -> Sampler:
  """The sampler of `config` on the generator's mesh, with `tok`'s ids."""
  phrase = tok.encode(config.sampling.interruption.phrase)
  return Sampler.from_config(
      config,
      generator_mesh,
      rules,
      eos_ids=tok.stop_ids,
      pad_id=tok.pad_id,
      think_close_id=tok.end_think_id,
      phrase_ids=phrase,
  )


def _log_policy(config, model_cfg, mesh, generator_mesh) -> None:
  """Logs the policy's family and size, and both roles' meshes."""
  logging.info(
      "Policy: %s, %.2fM parameters; mesh %s; generator's mesh %s (%s)",
      model_cfg.family,
      model_cfg.num_params() / 1e6,
      dict(mesh.shape),
      dict(generator_mesh.shape),
      sharding.layout_of(config.mesh),
  )


@dataclasses.dataclass
class Experiment:
  """Everything built from one config."""

  config: ml_collections.ConfigDict
  workdir: str
  mesh: jax.sharding.Mesh
  rules: sharding.Rules
  tok: tokenizer_lib.Tokenizer
  model_cfg: model_config.ModelConfig
  model: transformer.Transformer
  params: Any  # Base policy parameters, sharded.
  param_shardings: Any
  sampler: Sampler  # On `sampler.mesh`: the generator's devices.
  # The parameters' shardings on the generator's mesh; None when colocated.
  generator_param_shardings: Any = None
  # mesh.transfer_dtype='bfloat16': `decode.cast_for_prepare`, jitted on the
  # trainer's devices in the parameters' shardings; None: sent as they are.
  transfer_cast: Any = None

  @property
  def num_devices(self) -> int:
    """Devices the run holds: the trainer's and the generator's."""
    return len(
        set(self.mesh.devices.flat) | set(self.sampler.mesh.devices.flat)
    )

  def to_generator(self, params: Any) -> Any:
    """The trainer's `params` on the generator's devices, in its shardings:
    moved by JAX (`jax.device_put`) under mesh.layout='disaggregated', cast
    first on the trainer's devices where mesh.transfer_dtype asks (the
    sampler's regroup makes the same values of them); `params` themselves
    when colocated."""
    if self.generator_param_shardings is None:
      return params
    if self.transfer_cast is not None:
      params = self.transfer_cast(params)
    return jax.device_put(params, self.generator_param_shardings)

  def transfer_bytes(self, params: Any) -> int:
    """Bytes the generator's devices receive when `params` move there (every
    shard of every copy, in the dtype sent); 0 when colocated."""
    if self.generator_param_shardings is None:
      return 0
    sent = jax.eval_shape(self.transfer_cast or (lambda p: p), params)
    return sum(
        math.prod(s.shard_shape(x.shape)) * x.dtype.itemsize * len(s.device_set)
        for x, s in zip(
            jax.tree.leaves(sent),
            jax.tree.leaves(self.generator_param_shardings),
            strict=True,
        )
    )

  def budgeted_samplers(self, state: Any, slot_bytes: int):
    """The samplers of generation and of validation, for a run holding the
    train state `state` and `slot_bytes` of rollout slots per chip.

    On TPU each is compiled within the HBM the run leaves it: generation
    beside what the generator's devices hold (colocated, the train state;
    disaggregated, the parameters moved there, in the dtype sent),
    validation beside that and the rollout slots. Elsewhere both are
    `self.sampler`.
    """
    held = state
    if self.generator_param_shardings is not None:
      held = sharding.abstract(
          jax.eval_shape(self.transfer_cast or (lambda p: p), state.params),
          self.generator_param_shardings,
      )
    generation = sharding.hbm_budget(
        self.sampler.mesh, sharding.per_device_bytes(held)
    )
    if generation is None:
      return self.sampler, self.sampler
    validation = generation - slot_bytes
    logging.info(
        "sampler: generation compiled within %.2f GB per chip, validation "
        "within %.2f GB",
        generation / 1e9,
        validation / 1e9,
    )
    return (
        self.sampler.with_hbm_budget(generation),
        self.sampler.with_hbm_budget(validation),
    )

  def train_step_budget(self, slot_bytes: int) -> Optional[int]:
    """HBM per chip the train step may take beside the rollout slots' bytes
    (none when the slots are on the generator's own devices), where the
    devices report their capacity; else None."""
    if self.generator_param_shardings is not None:
      slot_bytes = 0
    budget = sharding.hbm_budget(self.mesh, slot_bytes)
    if budget is not None:
      logging.info(
          "train step: compiled within %.2f GB per chip (%.2f GB of rollout "
          "slots beside it)",
          budget / 1e9,
          slot_bytes / 1e9,
      )
    return budget

  @classmethod
  def build(
      cls,
      config: ml_collections.ConfigDict,
      workdir: str,
      base_params: bool = True,
  ) -> "Experiment":
    """Validates `config` and builds the mesh, tokenizer, model and sampler.

    `config.model` is overwritten from `model.hf_path`'s config.json when
    set. `workdir` caches the tokenizer and base policy. `base_params=False`
    (parameters restored from a checkpoint anyway) returns freshly
    initialised params instead of importing or warm-starting them.
    """
    _validate_and_join(config)
    os.makedirs(workdir, exist_ok=True)
    mesh, generator_mesh = _meshes(config)
    rules = sharding.logical_rules(config.mesh)
    model_cfg = _checked_model_config(config)
    # Checks model.vocab_size too.
    tok = tokenizer_lib.get_tokenizer(config, workdir)
    model, shardings, params = _policy(
        config, workdir, model_cfg, mesh, rules, tok, base_params
    )
    transfer_cast = _transfer_cast(config, model_cfg, shardings)
    sampler = _sampler(config, generator_mesh, rules, tok)
    _log_policy(config, model_cfg, mesh, generator_mesh)
    return cls(
        config,
        workdir,
        mesh,
        rules,
        tok,
        model_cfg,
        model,
        params,
        shardings,
        sampler,
        None
        if generator_mesh is mesh
        else sharding.param_shardings(model, generator_mesh, rules),
        transfer_cast,
    )

  def reward_pool(self) -> RewardPool | SharedRewardPool:
    """A reward pool for `config.rewards`; close it (or use it in `with`).

    Across processes each verifies a share and all get every score.
    """
    # Stops here, before any step, if code would run without bubblewrap.
    isolation.check(
        self.config.rewards.code_isolation,
        isolation.config_scores_code(self.config),
    )
    pool = RewardPool(self.config.rewards)
    return pool if jax.process_count() == 1 else SharedRewardPool(pool)

  def prompts(self, split: str) -> list[dict]:
    """Prompt records of `split` ('train' or 'val') of `config.data.source`."""
    return sources.load_prompts(self.config, split)

  def eval_batches(
      self, num_prompts: Optional[int] = None, samples: Optional[int] = None
  ) -> list[pipeline_lib.PromptBatch]:
    """Val batches: each domain's first `num_prompts` prompts, `samples` each.

    Both default to the `trainer.eval_*` fields.
    """
    t = self.config.trainer
    num_prompts = num_prompts or t.eval_num_prompts
    samples = samples or t.eval_samples
    # num_prompts per domain.
    records = mixture.head_per_domain(self.prompts("val"), num_prompts)
    return pipeline_lib.eval_batches(
        self.config,
        records,
        self.tok,
        evaluation.prompts_per_batch(self.config, samples),
        samples,
    )


class _LibraryInfoFilter(pylogging.Filter):
  """Drops orbax's INFO lines (several per checkpoint); keeps its warnings."""

  def filter(self, record: pylogging.LogRecord) -> bool:
    return (
        record.levelno >= pylogging.WARNING or "/orbax/" not in record.pathname
    )


def configure_logging() -> None:
  """INFO logging for our progress messages, without orbax's chatter."""
  logging.set_verbosity(logging.INFO)
  logging.get_absl_handler().addFilter(_LibraryInfoFilter())
