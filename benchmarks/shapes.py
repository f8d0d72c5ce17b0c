"""Model shapes the benchmarks take: a config variant,
optionally with model fields changed.

`tiny_cpu:embed_dim=256;mlp_dim=768` is configs/scalerl.py's tiny_cpu with a
wider residual stream and MLP; `tiny_cpu:family=qwen3;qk_norm=True` adds
Qwen3's per-head q/k norms.
"""

import ml_collections

from configs import scalerl


def _parse(value: str, like):
  """`value` as the type of the field's current value
  `like` ('False' is False)."""
  if isinstance(like, bool):
    if value not in ("True", "False"):
      raise ValueError(f"expected True or False, got {value!r}")
    return value == "True"
  return type(like)(value)


def shape_config(
    shape: str, prompts_per_step: int = 0
) -> ml_collections.ConfigDict:
  """The config of `variant[:field=value;...]`, model fields
  (and P if > 0) as given."""
  variant, _, fields = shape.partition(":")
  config = scalerl.get_config(variant)
  with config.unlocked():
    if prompts_per_step:
      config.data.prompts_per_step = prompts_per_step
    for item in filter(None, fields.split(";")):
      name, value = item.split("=")
      config.model[name] = _parse(value, config.model[name])
  return config
