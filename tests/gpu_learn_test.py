"""configs/gpu_learn.py: the CPU default's experiment as an accelerator
runs it, and nothing else changed."""

import pytest

from configs import gpu_learn
from configs import scalerl
from scalerl_jax import config as config_lib


def _flat(config, prefix=""):
  out = {}
  for name, value in config.items():
    if hasattr(value, "items"):
      out.update(_flat(value, f"{prefix}{name}."))
    else:
      out[prefix + name] = value
  return out


def test_it_is_the_default_with_accelerator_numerics_only():
  config = gpu_learn.get_config()
  config_lib.validate(config)
  default, gpu = _flat(scalerl.get_config()), _flat(config)
  changed = {k: gpu[k] for k in default if gpu[k] != default[k]}
  # The recipe, the model's shape, the warm start and the schedules are the
  # default's (docs/default_run.md), which learn on CPU.
  assert changed == {
      "model.compute_dtype": "bfloat16",
      "sampling.kv_cache_dtype": "bfloat16",
      "sampling.weight_layout": "resident",
      "trainer.eval_batch_rows": 800,
      "trainer.checkpoint_every": 60,
      "rewards.num_workers": 8,
  }


def test_it_takes_no_argument():
  with pytest.raises(ValueError, match="takes no argument"):
    gpu_learn.get_config("variant=qwen3_0.6b")
