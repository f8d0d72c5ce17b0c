#!/bin/bash
# Where a real run spends its time, on one GPU, in one call of under 10
# minutes (issue 37): the decode kernel and the FP32 head checked on the GPU,
# the head's algorithms timed against float64, the qwen3_0.6b train step
# (MFU, memory against the planner, its parts), and the sampler against its
# HBM floor, its log-probs against the trainer's, and transformers.
#
#   OUT=/tmp/gpu_speed bash benchmarks/gpu_speed.sh
#   OUT=/tmp/gpu_speed STAGES="head train mismatch" bash benchmarks/gpu_speed.sh
#
# Stages beyond the default list: sampler_graphs, sampler_check, m8,
# remat_dots, remat_dots_m8, learn. The next GPU session's first call (docs/gpu.md), the
# GPU tests first, 570 s of stage limits:
#
#   STAGES="tests learn train remat_dots m8 remat_dots_m8" PARTS= TESTS_S=45 \
#     LEARN_S=260 TRAIN_S=70 VARIANT_S=65 bash benchmarks/gpu_speed.sh
#
# The machine needs the wheels the image lacks first (benchmarks/gpu_wheels.sh).
#
# Run from the checkout's root on a machine with one NVIDIA GPU and a CUDA
# JAX. Each stage runs in its own process under its own time limit (the
# *_S variables), in the order of STAGES, so a slow stage cannot take the
# rest down with it. Writes to $OUT: log (everything), lm_head.json,
# train_step.jsonl, sampler.json, mismatch.json, hf.json, and for `learn`
# learn_metrics.jsonl, learn_config.json, learn_summary.{md,json} (its
# workdir, $LEARN_DIR, stays outside $OUT).
set -u
OUT=${OUT:-/tmp/gpu_speed}
source benchmarks/gpu_env.sh
STAGES=${STAGES:-"tests head train sampler mismatch hf no_remat highest"}
# The recipe's qwen3_0.6b at gpu_rl_step.sh's shape: 8 x 16 completions of
# 256 + 1,024 tokens, 16 microbatches, cuDNN attention. The variables below
# shrink it for a dry run on CPU (docs/gpu.md).
SHAPE=${SHAPE:-"qwen3_0.6b:model.attention=cudnn;trainer.microbatches=16"}
SEQ_LEN=${SEQ_LEN:-1280}
SAMPLER=(python3 -m benchmarks.sampler_gpu --shape="${SAMPLER_SHAPE:-qwen3_0.6b}"
  --prompt_len="${PROMPT_LEN:-256}")
HEAD=(${HEAD_ARGS:-})
LEARN_DIR=${LEARN_DIR:-/tmp/gpu_learn}
TRAIN=(python3 -m benchmarks.train_step_gpu --prompts_per_step=8
  --seq_len="$SEQ_LEN" --matmul_n="${MATMUL_N:-8192}"
  --json="$OUT/train_step.jsonl")

stage() { echo; echo "=== $1 ($(date -u +%H:%M:%S))"; }

run_stage() {
  case $1 in
    tests)
      stage "the Triton decode kernel and the FP32 head, on the GPU"
      JAX_PLATFORMS=cuda timeout "${TESTS_S:-60}" python3 -m pytest -q \
        -p no:cacheprovider tests/decode_attention_test.py \
        tests/lm_head_test.py -k "gpu or head" ;;
    head)
      stage "LM head algorithms (benchmarks/lm_head.py)"
      timeout "${HEAD_S:-60}" python3 -m benchmarks.lm_head "${HEAD[@]}" \
        --json="$OUT/lm_head.json" ;;
    train)
      stage "train step: the recipe's, with its parts"
      timeout "${TRAIN_S:-150}" "${TRAIN[@]}" --shape="$SHAPE" \
        ${PARTS---parts} --label=recipe ;;
    sampler)
      stage "sampler against its HBM floor (benchmarks/sampler_gpu.py)"
      timeout "${SAMPLER_S:-120}" "${SAMPLER[@]}" \
        --runs="${RUNS:-256x512,64x256}" --kernels=pallas --mismatch_run= \
        --json="$OUT/sampler.json" ;;
    mismatch)
      stage "sampler-trainer log-prob mismatch by LM head"
      timeout "${MISMATCH_S:-100}" "${SAMPLER[@]}" --runs= \
        --mismatch_run="${MISMATCH:-64x256}" --heads="${HEADS:-bf16_3x,off}" \
        --json="$OUT/mismatch.json" ;;
    hf)
      stage "transformers generate on the same weights"
      JAX_PLATFORMS=cpu timeout "${HF_S:-60}" "${SAMPLER[@]}" --hf_only \
        --hf_rows="${HF_ROWS:-64}" --hf_new=128 --json="$OUT/hf.json" ;;
    no_remat)
      stage "train step: no remat, the layers as a loop"
      timeout "${VARIANT_S:-75}" "${TRAIN[@]}" \
        --shape="$SHAPE;model.remat=False;model.scan_unroll=1" \
        --label=no_remat_loop ;;
    highest)
      stage "train step: HIGHEST head (the head before)"
      timeout "${VARIANT_S:-75}" "${TRAIN[@]}" \
        --shape="$SHAPE;model.lm_head_algorithm=highest" --label=highest ;;
    sampler_graphs)
      # Not yet run on a GPU: the decode loop's body as CUDA graphs (XLA's
      # command buffers), against the per-kernel launch cost that keeps a
      # 64-row decode step at 3.2 ms where its bytes need 1.6 ms.
      stage "sampler with the decode loop in command buffers"
      XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,WHILE,CONDITIONAL --xla_gpu_graph_min_graph_size=1" \
        timeout "${SAMPLER_S:-120}" "${SAMPLER[@]}" \
        --runs="${RUNS:-256x512,64x256}" --kernels=pallas --mismatch_run= \
        --json="$OUT/sampler_graphs.json" ;;
    sampler_check)
      # Not yet run on a GPU: the decode loop checked every 8 steps (a
      # fixed-trip inner loop, sampling.decode_steps_per_check), against the
      # host waiting for the device at every step's check.
      stage "sampler with the loop checked every ${CHECK_EVERY:-8} steps"
      timeout "${SAMPLER_S:-120}" python3 -m benchmarks.sampler_gpu \
        --shape="${SAMPLER_SHAPE:-qwen3_0.6b}:sampling.decode_steps_per_check=${CHECK_EVERY:-8}" \
        --prompt_len="${PROMPT_LEN:-256}" --runs="${RUNS:-256x512,64x256}" \
        --kernels=pallas --mismatch_run= --json="$OUT/sampler_check.json" ;;
    m8)
      stage "train step: 8 microbatches of 16 rows"
      timeout "${VARIANT_S:-75}" "${TRAIN[@]}" \
        --shape="$SHAPE;trainer.microbatches=8" --label=m8 ;;
    remat_dots)
      stage "train step: remat keeping the projections' outputs"
      timeout "${VARIANT_S:-75}" "${TRAIN[@]}" \
        --shape="$SHAPE;model.remat_policy=save_dots" --label=remat_dots ;;
    remat_dots_m8)
      stage "train step: remat keeping the projections, 8 microbatches"
      timeout "${VARIANT_S:-75}" "${TRAIN[@]}" \
        --shape="$SHAPE;model.remat_policy=save_dots;trainer.microbatches=8" \
        --label=remat_dots_m8 ;;
    learn)
      # Goal 5: a warm start and 60 RL steps on the built-in task, validated
      # every 10; LEARN_ARGS adds --config.* flags (a CPU dry run shrinks it).
      stage "learning on the built-in task (configs/gpu_learn.py)"
      rm -rf "$LEARN_DIR"
      started=$(date +%s.%N)
      timeout -k 10 "${LEARN_S:-300}" python3 -m launch.train \
        --config=configs/gpu_learn.py --workdir="$LEARN_DIR" ${LEARN_ARGS:-}
      echo "launch.train exited with $?"
      cp "$LEARN_DIR/metrics.jsonl" "$OUT/learn_metrics.jsonl"
      cp "$LEARN_DIR/config.json" "$OUT/learn_config.json"
      python3 -m benchmarks.learn_summary --workdir="$LEARN_DIR" \
        --started="$started" --json="$OUT/learn_summary.json" \
        | tee "$OUT/learn_summary.md" ;;
    *) echo "unknown stage $1" ;;
  esac
}

{
  stage "machine"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import jax, flax, optax; print('jax', jax.__version__, 'flax', \
flax.__version__, 'optax', optax.__version__, jax.devices())"
  for name in $STAGES; do run_stage "$name"; done
  stage "done"
} 2>&1 | tee "$OUT/log"
