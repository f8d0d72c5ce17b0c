"""Small configs for tests, made from the real `configs/scalerl.py`."""

from configs import scalerl


def tiny_config(**model_overrides):
  """The tiny_cpu config with a smaller model (2 layers, width 64)."""
  config = scalerl.get_config("variant=tiny_cpu")
  model = dict(vocab_size=128, embed_dim=64, num_layers=2, num_heads=4, num_kv_heads=2,
               head_dim=16, mlp_dim=128, max_seq_len=256)
  model.update(model_overrides)
  with config.unlocked():
    config.model.update(model)
  return config
