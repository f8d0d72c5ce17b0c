"""Model shapes the benchmarks take: a config variant,
optionally with model fields changed.

`tiny_cpu:embed_dim=256;mlp_dim=768` is configs/scalerl.py's tiny_cpu with a
wider residual stream and MLP; `tiny_cpu:family=qwen3;qk_norm=True` adds
Qwen3's per-head q/k norms; a dotted name sets any field:
`qwen3_0.6b:trainer.microbatches=8`.
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
      # A bare name is a model field; a dotted one any field of the config.
      *path, leaf = name.split(".") if "." in name else ("model", name)
      node = config
      for part in path:
        node = node[part]
      node[leaf] = _parse(value, node[leaf])
  return config
