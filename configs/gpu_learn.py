"""The default experiment on one GPU: warm start and RL on the built-in task.

For issue 37's "Learning on the accelerator": the CPU default's recipe, base
policy and schedule (configs/scalerl.py, tiny_cpu: warm start, 60 RL steps of
16 x 16 completions, validation mean@16 on 200 prompts every 10 steps), with
what an accelerator run differs in: bfloat16 compute over float32 master
weights (the bf16_3x FP32 head, cuDNN attention, the Triton decode kernel
follow from it on a GPU), a bfloat16 KV cache, the sampler's weights
resident, validation in batches of 800 completions, and verifiers spread
over the GPU host's cores. The model's shape is tiny_cpu's, whose learning
rates and warm start are the tuned ones (docs/default_run.md).

  python -m launch.train --config=configs/gpu_learn.py --workdir=/tmp/gpu_learn

On CPU it runs too (bfloat16 there is slower than the default's float32).
benchmarks/gpu_speed.sh's `learn` stage runs it under a time limit and
summarises each step (benchmarks/learn_summary.py); docs/gpu.md has the
result.
"""

from configs import scalerl


def get_config(arg=None):
  """configs/scalerl.py's tiny_cpu config as an accelerator runs it."""
  if arg:
    raise ValueError(f"configs/gpu_learn.py takes no argument; got {arg!r}")
  c = scalerl.get_config("tiny_cpu")
  c.model.compute_dtype = "bfloat16"
  c.sampling.kv_cache_dtype = "bfloat16"
  c.sampling.weight_layout = "resident"
  # 200 prompts x 16 samples in 4 batches instead of 13.
  c.trainer.eval_batch_rows = 800
  # A checkpoint at the end only: the ones on the way would be host time in
  # the steps after them.
  c.trainer.checkpoint_every = c.trainer.num_steps
  c.rewards.num_workers = 8
  return c
