"""experiment.read_model_config: a checkpoint's network, the run's choices."""

import json

from configs import scalerl
from scalerl_jax import experiment
from scalerl_jax.models import hf_config
from scalerl_jax.models import model_config


def test_a_checkpoint_gives_the_shape_and_the_config_every_run_time_choice(
    tmp_path,
):
  config = scalerl.get_config("variant=tiny_cpu")
  shape = model_config.ModelConfig.from_config(config.model)
  (tmp_path / "config.json").write_text(
      json.dumps(hf_config.hf_config_dict(shape))
  )
  # Every run-time field away from its default (and from the checkpoint's
  # dtype), so a field that is not passed on shows.
  choices = {
      "param_dtype": "bfloat16",
      "compute_dtype": "bfloat16",
      "fp32_lm_head": False,
      "lm_head_algorithm": "highest",
      "remat": True,
      "remat_policy": "save_dots",
      "attention": "blockwise",
      "scan_unroll": 1,
  }
  assert set(choices) == set(model_config.run_time_fields())
  with config.unlocked():
    config.model.hf_path = str(tmp_path)
    config.model.embed_dim = 7  # Overwritten by the checkpoint's.
    config.model.update(choices)
  cfg = experiment.read_model_config(config)
  for name, value in choices.items():
    assert getattr(cfg, name) == value, name
  assert cfg.embed_dim == shape.embed_dim == config.model.embed_dim
  assert cfg.num_layers == shape.num_layers
