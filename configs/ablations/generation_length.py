"""Generation length (PAPER.md §1, §5): 14,336 (ScaleRL) vs 32,768 new tokens.

The longer budget raised A from 0.610 to 0.645 but learned more slowly
(C_mid 11,272 vs 2,542 GPU-hours). Other variants scale their own budget by
32,768 / 14,336. The long point grows the context (model.max_seq_len) when the
budget needs it and scales the thinking budgets of the interruption with the
budget, keeping the answer budget. Run, then fit:

  python -m launch.sweep --sweep=configs/ablations/generation_length.py \
      --workdir=/tmp/sweeps/generation_length --parallel=2
  python -m launch.fit --workdirs=/tmp/sweeps/generation_length \
      --fit_fraction=0.5

`generation_length.py:variant=<name>` picks the model size
of configs/scalerl.py.
"""

from configs import scalerl

_LONG_FACTOR = 32_768 / 14_336


def get_config(arg=None):
  """The ScaleRL base config; `arg` as for configs/scalerl.py."""
  return scalerl.get_config(arg)


def _point(config, new_tokens):
  """Overrides giving `new_tokens` of generation budget."""
  s = config.sampling
  point = {"name": f"len{new_tokens}", "sampling.max_new_tokens": new_tokens}
  if s.max_prompt_len + new_tokens > config.model.max_seq_len:
    point["model.max_seq_len"] = s.max_prompt_len + new_tokens
  scale = new_tokens / s.max_new_tokens
  if s.interruption.enabled and scale != 1:
    point["sampling.interruption.thinking_budget_min"] = round(
        s.interruption.thinking_budget_min * scale
    )
    point["sampling.interruption.thinking_budget_max"] = round(
        s.interruption.thinking_budget_max * scale
    )
  return point


def get_sweep(arg=None):
  """The base budget and the long one."""
  config = get_config(arg)
  base = config.sampling.max_new_tokens
  return [_point(config, base), _point(config, round(base * _LONG_FACTOR))]
