#!/bin/bash
# Two real RL steps of qwen3_0.6b on one GPU with cuDNN attention, the
# allocator's measured peak against the planner's, and every program compiled
# by the GPU compiler beside the planner's per-program estimate.
#
#   OUT=/tmp/gpu_check bash benchmarks/gpu_rl_step.sh
#
# Run from the checkout's root on a machine with one NVIDIA GPU and a CUDA
# JAX. The shape is the recipe's (qwen3_0.6b, CISPO, PipelineRL-8, FP32 LM
# head, bfloat16 KV cache, float32 master weights) cut to fit one chip: 8
# prompts x 16 completions of 256 + 1,024 tokens, 16 microbatches, no
# interruptions (their budgets exceed 1,024 tokens). Random weights (no
# checkpoint) and the built-in task: the rewards are all 0, so the update is
# skipped (no signal) after the full forward and backward. The memory and the
# programs are the run's; the learning is not measured here.
#
# Writes to $OUT: log (everything), metrics.jsonl and config.json of the run,
# compile.json (launch.compile --topology=local) and plan.txt (launch.plan).
set -u
OUT=${OUT:-/tmp/gpu_check}
# The compile stage reuses the run's compiled programs where they are equal.
source benchmarks/gpu_env.sh
CONFIG=configs/scalerl.py:variant=qwen3_0.6b
SHAPE=(
  --config.model.attention=cudnn
  --config.data.prompts_per_step=8
  --config.sampling.max_prompt_len=256
  --config.sampling.max_new_tokens=1024
  --config.sampling.interruption.enabled=False
  --config.trainer.microbatches=16
)
RUN=(
  --config.trainer.num_steps=2
  --config.trainer.eval_num_prompts=16
  --config.trainer.eval_samples=4
)
TRAIN_S=${TRAIN_S:-300}
COMPILE_S=${COMPILE_S:-150}

stage() { echo; echo "=== $1 ($(date -u +%H:%M:%S))"; }
{
  stage "machine"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import jax, flax, optax, orbax.checkpoint as o; \
print('jax', jax.__version__, 'flax', flax.__version__, 'optax', \
optax.__version__, 'devices', jax.devices())"

  stage "cuDNN attention against plain (tests/attention_test.py)"
  JAX_PLATFORMS=cuda timeout 120 python3 -m pytest -q -p no:cacheprovider \
    tests/attention_test.py -k cudnn

  stage "planner (launch.plan)"
  python3 -m launch.plan --config=$CONFIG "${SHAPE[@]}" --num_devices=1 \
    --platform=gpu --accelerators=h100,h200 | tee "$OUT/plan.txt"

  stage "two RL steps (launch.train)"
  rm -rf /tmp/gpu_run
  timeout "$TRAIN_S" python3 -m launch.train --config=$CONFIG "${SHAPE[@]}" \
    "${RUN[@]}" --workdir=/tmp/gpu_run
  echo "launch.train exit status $?"
  cp /tmp/gpu_run/metrics.jsonl /tmp/gpu_run/config.json "$OUT/" 2>/dev/null
  python3 - <<'EOF'
import json
for line in open("/tmp/gpu_run/metrics.jsonl"):
  row = json.loads(line)
  keep = {k: v for k, v in row.items() if k.startswith(("memory/", "time/"))}
  print(row.get("step"), json.dumps(keep))
EOF

  stage "every program compiled for this GPU (launch.compile --topology=local)"
  timeout "$COMPILE_S" python3 -m launch.compile --config=$CONFIG \
    "${SHAPE[@]}" --topology=local --json="$OUT/compile.json"
  echo "launch.compile exit status $?"
  stage "done"
} 2>&1 | tee "$OUT/log"
