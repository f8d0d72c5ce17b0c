"""The ScaleRL recipe (PAPER.md §5), one config for every model size.

The default variant runs on a CPU laptop:

  python -m launch.train --config=configs/scalerl.py --workdir=/tmp/scalerl

Other sizes take their shapes from here and their weights from a local
Hugging Face checkpoint:

  python -m launch.train --config=configs/scalerl.py:variant=qwen3_0.6b \
      --config.model.hf_path=/ckpts/Qwen3-0.6B --workdir=/tmp/scalerl_qwen3

Single fields are overridden on the command line, e.g. `--config.rl.loss=dapo`.
The locked config refuses unknown fields and values of another type;
`scalerl_jax.config.validate` checks allowed values, ranges and relations
between fields before anything runs.
"""

import ml_collections

# Variant name -> model shape. `tiny_cpu` (0.85M parameters) runs the default
# experiment on 2 CPU cores (docs/default_run.md); `small_cpu` (~50M) is the CPU
# benchmark size; the rest mirror public checkpoints so that
# `--config.model.hf_path` loads them without surprises.
_MODELS = {
    "tiny_cpu": {},  # The field defaults of _model_config are tiny_cpu's shape.
    "small_cpu": dict(
        family="llama",
        vocab_size=8192,
        embed_dim=640,
        num_layers=8,
        num_heads=10,
        num_kv_heads=5,
        head_dim=64,
        mlp_dim=1792,
        rope_theta=10_000.0,
        tie_embeddings=True,
        max_seq_len=1024,
        param_dtype="float32",
        compute_dtype="float32",
    ),
    "qwen3_0.6b": dict(
        family="qwen3",
        vocab_size=151_936,
        embed_dim=1024,
        num_layers=28,
        num_heads=16,
        num_kv_heads=8,
        head_dim=128,
        mlp_dim=3072,
        rope_theta=1_000_000.0,
        tie_embeddings=True,
        qk_norm=True,
        norm_eps=1e-6,
        max_seq_len=16_384,
        param_dtype="float32",
        compute_dtype="bfloat16",
        remat=True,
    ),
    "qwen2.5_0.5b": dict(
        family="qwen2",
        vocab_size=151_936,
        embed_dim=896,
        num_layers=24,
        num_heads=14,
        num_kv_heads=2,
        head_dim=64,
        mlp_dim=4864,
        rope_theta=1_000_000.0,
        tie_embeddings=True,
        qkv_bias=True,
        norm_eps=1e-6,
        max_seq_len=16_384,
        param_dtype="float32",
        compute_dtype="bfloat16",
        remat=True,
    ),
    "llama3_8b": dict(
        family="llama",
        vocab_size=128_256,
        embed_dim=4096,
        num_layers=32,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        mlp_dim=14_336,
        rope_theta=500_000.0,
        tie_embeddings=False,
        norm_eps=1e-5,
        max_seq_len=16_384,
        param_dtype="float32",
        compute_dtype="bfloat16",
        remat=True,
    ),
}

VARIANTS = tuple(_MODELS)


def _parse_arg(arg):
  """'variant=x' or 'x' -> variant name."""
  if not arg:
    return "tiny_cpu"
  fields = dict(
      kv.split("=", 1) if "=" in kv else ("variant", kv)
      for kv in arg.split(",")
  )
  unknown = set(fields) - {"variant"}
  if unknown:
    raise ValueError(
        f"configs/scalerl.py takes only 'variant=...'; got {sorted(unknown)}"
    )
  variant = fields["variant"]
  if variant not in _MODELS:
    raise ValueError(f"Unknown variant {variant!r}; choose one of {VARIANTS}")
  return variant


def _model_config(variant):
  m = ml_collections.ConfigDict()
  # Hugging Face layout used for export: llama | qwen2 | qwen3.
  m.family = "llama"
  m.vocab_size = 512  # Rows of the embedding table.
  m.embed_dim = 128  # Residual stream width (HF hidden_size).
  m.num_layers = 4  # Decoder blocks.
  m.num_heads = 4  # Query heads.
  # Key/value heads (grouped-query attention); divides num_heads.
  m.num_kv_heads = 2
  m.head_dim = 32  # Width of one attention head.
  m.mlp_dim = 384  # SwiGLU hidden width (HF intermediate_size).
  m.rope_theta = 10_000.0  # Rotary embedding base.
  m.rope_scaling = ml_collections.ConfigDict()
  m.rope_scaling.type = "none"  # none | llama3 (Llama 3.1 frequency scaling).
  m.rope_scaling.factor = 8.0  # llama3: long-wavelength division factor.
  m.rope_scaling.low_freq_factor = 1.0  # llama3: low-frequency boundary.
  m.rope_scaling.high_freq_factor = 4.0  # llama3: high-frequency boundary.
  m.rope_scaling.original_max_position = 8192  # llama3: pre-training context.
  m.norm_eps = 1e-5  # RMSNorm epsilon.
  m.tie_embeddings = True  # LM head reuses the embedding table.
  m.qkv_bias = False  # Biases on q/k/v projections (Qwen2).
  m.qk_norm = False  # Per-head RMSNorm on queries and keys (Qwen3).
  m.max_seq_len = 512  # Longest prompt + completion the model will see.
  # Storage dtype of parameters and of AdamW's moments: float32 | bfloat16. Keep
  # float32 (master weights) and compute in bfloat16: at the recipe's lr 5e-7 an
  # AdamW update is far below one bfloat16 ulp of a weight, so bfloat16
  # parameters barely move (config.validate warns).
  m.param_dtype = "float32"
  m.compute_dtype = "float32"  # Activation/matmul dtype: float32 | bfloat16.
  # PAPER.md §5: final logits in float32 (moved A 0.52 -> 0.61).
  m.fp32_lm_head = True
  # How the FP32 head multiplies: highest (one float32 matmul at
  # Precision.HIGHEST) | bf16_3x (float32 weights split into two bfloat16
  # parts, products on the bfloat16 units, float32 sums) | auto: bf16_3x when
  # compute_dtype is bfloat16, else highest (models/transformer.py).
  m.lm_head_algorithm = "auto"
  # Rematerialise each block in the backward pass (saves memory).
  m.remat = False
  # What a rematerialised block keeps for its backward (models/model_config.py
  # REMAT_POLICIES): full (its input) | save_dots (its projections' outputs).
  m.remat_policy = "full"
  # Training and prefill attention (models/attention.py): plain | blockwise |
  # splash (Pallas, TPU) | cudnn (GPU, bfloat16) | auto: splash on TPU, cudnn
  # on GPU in bfloat16, else plain, or blockwise from LONG_SEQ_LEN positions.
  m.attention = "auto"
  # Layers per iteration of the scan over layers; 0 = one on TPU/GPU with
  # remat (each layer's gradient reduced before the next), else all (faster on
  # CPU; models/transformer.py: scan_layers_unroll).
  m.scan_unroll = 0
  # Local HF checkpoint directory; "" = random init / warm start.
  m.hf_path = ""
  m.update(_MODELS[variant])
  return m


def get_config(arg=None):
  """Returns the locked ScaleRL config for `variant=` (default tiny_cpu)."""
  variant = _parse_arg(arg)
  cpu = variant.endswith("_cpu")
  c = ml_collections.ConfigDict()
  c.variant = variant  # Which preset filled the model shape.
  c.seed = 0  # Seeds init, data order and sampling.

  c.model = _model_config(variant)

  c.mesh = ml_collections.ConfigDict()
  c.mesh.axes = ("data", "fsdp", "tensor")  # Mesh axis names.
  # Size per axis; one -1 takes the remaining devices.
  c.mesh.shape = (1, -1, 1)
  # Logical axis -> mesh axis (or tuple of axes, or None = replicated).
  c.mesh.logical_axis_rules = (
      ("act_batch", ("data", "fsdp")),
      ("act_len", None),
      ("act_embed", None),
      ("act_heads", "tensor"),
      ("act_kv_heads", "tensor"),
      ("act_mlp", "tensor"),
      ("act_vocab", "tensor"),
      ("layers", None),
      ("vocab", "tensor"),
      ("embed", "fsdp"),
      ("mlp", "tensor"),
      ("heads", "tensor"),
      ("kv_heads", "tensor"),
      ("head_dim", None),
      ("norm", None),
  )
  # Call jax.distributed.initialize (multi-host runs).
  c.mesh.distributed = False
  c.mesh.coordinator_address = ""  # host:port of process 0; "" = auto-detect.
  c.mesh.num_processes = 0  # Total processes; 0 = auto-detect.
  c.mesh.process_id = -1  # This process's index; -1 = auto-detect.
  # A process of a multi-host run silent this long (killed, preempted,
  # stalled) stops the others, which exit with status 75 naming it
  # (scalerl_jax/multihost/peers.py; docs/reliability.md).
  c.mesh.peer_timeout_s = 120.0
  # Where the generator runs (sharding.LAYOUTS; docs/design/disaggregated.md):
  # "colocated", on the trainer's devices, generate and train phases taking
  # turns; "disaggregated", on devices of its own in the same JAX runtime
  # (mesh.shape laid over each role's devices), the trainer's weights moved to
  # it by jax.device_put every step. One process only, for now.
  c.mesh.layout = "colocated"
  # disaggregated: the generator's devices, the last of jax.devices(); the
  # trainer takes the rest. 0 = half of them.
  c.mesh.generator_devices = 0
  # disaggregated: the dtype the weights cross to the generator in
  # (rl/weight_sync.TRANSFER_DTYPES). "bfloat16" (needs model.compute_dtype=
  # "bfloat16") casts on the trainer's devices what the sampler's regroup
  # would cast anyway: the same values, about half the bytes; the norm scales
  # and the FP32 head stay float32.
  c.mesh.transfer_dtype = "float32"

  c.optim = ml_collections.ConfigDict()
  # Peak LR (paper: 5e-7 at 8B). A 0.85M policy needs a far larger one to move
  # in 60 steps (docs/default_run.md).
  c.optim.learning_rate = 3e-4 if cpu else 5e-7
  # Linear warmup from 0 (paper: 100).
  c.optim.warmup_steps = 10 if cpu else 100
  # constant | cosine (after warmup). The paper's is constant. The CPU default
  # departs from it: at lr 3e-4 a constant rate left the plateau swinging by
  # 0.03-0.05 between evaluations, the decay settles it (docs/default_run.md).
  c.optim.schedule = "cosine" if cpu else "constant"
  # cosine: steps from the end of warmup to the floor (CPU: trainer.num_steps -
  # optim.warmup_steps, so the floor is reached at the last step).
  c.optim.decay_steps = 50 if cpu else 0
  # cosine: floor as a fraction of the peak.
  c.optim.final_lr_fraction = 0.1 if cpu else 0.0
  c.optim.b1 = 0.9  # Adam first-moment decay.
  c.optim.b2 = 0.999  # Adam second-moment decay.
  c.optim.eps = 1e-15  # Adam epsilon; tiny to avoid underflowing updates (§5).
  c.optim.weight_decay = 0.01  # AdamW decay; masked off norms and biases.
  c.optim.grad_clip_norm = 1.0  # Global-norm clip; 0 disables.

  c.rl = ml_collections.ConfigDict()
  c.rl.loss = "cispo"  # grpo | dapo | gspo | gspo_token | cispo (§3).
  c.rl.aggregation = "prompt"  # sample | prompt | token (§4).
  # prompt | batch | none: std used to scale advantages.
  c.rl.adv_norm = "batch"
  c.rl.eps_clip = 0.2  # grpo: symmetric PPO clip.
  c.rl.eps_low = 0.2  # dapo: lower clip.
  c.rl.eps_high = 0.28  # dapo: upper clip (clip-higher).
  c.rl.gspo_eps_low = 3e-4  # gspo: lower clip of the sequence ratio.
  c.rl.gspo_eps_high = 4e-4  # gspo: upper clip of the sequence ratio.
  # cispo: cap on the IS weight (paper: 4, 5, 8 equal).
  c.rl.cispo_eps_max = 4.0
  # Truncated IS (§3): C > 0 scales each token's objective by
  # sg(min(1, C / rho)), rho = pi_train / pi_gen, so an unclipped PPO token's
  # weight is min(rho, C). Departure: the paper's factor is pi_old / pi_gen with
  # the loss's ratio taken against pi_old; without old weights here every ratio
  # is taken against the generator, so PPO clipping acts on stale tokens
  # (rl/losses.py). 0 disables.
  c.rl.tis_cap = 0.0
  c.rl.zero_variance_filter = True  # Drop groups whose rewards are all equal.
  c.rl.reward_correct = 1.0  # Reward of a verified completion.
  c.rl.reward_incorrect = 0.0  # Reward of a failed, timed-out or wrong one.

  c.buffer = ml_collections.ConfigDict()
  # pipeline_rl | ppo_off_policy (§5; rl/schedules.py).
  c.buffer.schedule = "pipeline_rl"
  # k: max policy versions a consumed token may lag.
  c.buffer.max_off_policy = 8
  # pipeline_rl: decode steps the generator runs per train step, its speed
  # relative to the trainer in this colocated emulation of PipelineRL's
  # concurrency (rl/schedules.py): the stand-in for the paper's ratio of
  # generator speed to trainer speed (64 generating, 16 training GPUs). More
  # than it takes to finish P groups per step lets it run ahead until k holds it
  # back; it decodes further only while the trainer's next batch is unfinished.
  # At 16 (CPU: 96-token completions on 2 x P x G slots) the generator is the
  # slower side and lags stay at 0-3, so k >= 4 never binds; the off-policy
  # ablation sets 4 x sampling.max_new_tokens, where the lag reaches k
  # (docs/ablations.md).
  c.buffer.decode_steps_per_train_step = 16
  # mesh.layout=disaggregated with an in-flight schedule: the decode step of
  # each step's generation at which the trainer's new weights are swapped in.
  # The generator's first steps run with the previous version's weights while
  # the trainer computes that version on its own devices; sequences in flight
  # continue with the new weights at this fixed step, so a run is
  # reproducible. Starts are held to k x P while the weights lag, so no token
  # lags more than k. 0: swapped in before the first step, the colocated
  # schedule token for token.
  c.buffer.sync_at_decode_step = 0
  # mesh.layout=disaggregated with an in-flight schedule: how the generator
  # meets the trainer's new weights (rl/weight_sync.SYNC_MODES). "fixed": at
  # buffer.sync_at_decode_step, from the trainer's host thread (reproducible,
  # resumes bit-identically). "free": the generator decodes on a host thread
  # of its own without waiting for the trainer, swaps in each new version
  # between two decode calls once it has arrived, and records the decode step
  # (generator/swap_decode_step); starts are held within k as in "fixed".
  # Not reproducible: the swaps follow the two roles' timing
  # (rl/free_running.py; buffer.decode_steps_per_train_step is unused).
  c.buffer.sync_mode = "fixed"
  # mesh.layout "disaggregated": a role that makes no progress for this long
  # (the generator: no decode call finished; the trainer: no train step)
  # while waited on stops the run, named with what it was doing and the
  # checkpoint to resume from (rl/role_watchdog.py). sync_mode "free": a
  # stalled generator raises in the trainer, a stalled trainer ends the
  # process with status 75; "fixed": the one host thread's watch ends the
  # process with status 75 for either. Above the longest healthy train step
  # or decode call, compiles included; validation and checkpoints are not
  # watched. 0 = off.
  c.buffer.role_stall_timeout_s = 1800.0

  c.sampling = ml_collections.ConfigDict()
  c.sampling.temperature = 1.0  # Softmax temperature of the generator.
  c.sampling.top_k = 0  # 0 disables.
  c.sampling.top_p = 1.0  # 1.0 disables.
  c.sampling.max_prompt_len = 64 if cpu else 2048  # Prompt budget in tokens.
  c.sampling.max_new_tokens = 96 if cpu else 14_336  # Generation budget.
  # Continuous-batching slots; 0 = the schedule's default
  # (`slot_batches` x P x G in rl/schedules.py).
  c.sampling.num_slots = 0
  c.sampling.decode_steps_per_call = 16  # Decode steps between weight checks.
  # Decode steps between the device loop's checks of whether any slot still
  # runs: a fixed-trip inner loop (sampling/decode_loop.py), the same tokens.
  # On a GPU each check makes the host wait for the device; steps past the
  # loop's end change nothing but cost a step. 1 = a check every step (not
  # yet measured on a GPU: benchmarks/gpu_speed.sh's sampler_check stage).
  c.sampling.decode_steps_per_check = 1
  # Dtype of the sampler's KV cache: float32 | bfloat16. Accelerators keep it in
  # bfloat16 (half the bytes every decode step reads); CPUs compute in float32.
  c.sampling.kv_cache_dtype = "float32" if cpu else "bfloat16"
  # Where the sampler keeps its regrouped weights (sharding.WEIGHT_LAYOUTS):
  # "resident" holds the whole network on each chip, split only over tensor,
  # for the phase, so a decode step reads local weights and gathers none;
  # "sharded" keeps the trainer's fsdp split and gathers the weights on every
  # decode step (less HBM, many more bytes moved per token; docs/tpu.md).
  c.sampling.weight_layout = "sharded" if cpu else "resident"
  # A decode step's attention: plain | pallas | auto (pallas on TPU, whose
  # cache is allocated in whole 128-position tiles): one kernel that streams
  # each row's cache to its length, its scores kept on chip.
  c.sampling.decode_attention = "auto"
  c.sampling.interruption = ml_collections.ConfigDict()
  # Thinking-budget interruptions (§5).
  c.sampling.interruption.enabled = not cpu
  # Budget drawn per sequence
  c.sampling.interruption.thinking_budget_min = 10_000
  # uniformly in [min, max].
  c.sampling.interruption.thinking_budget_max = 12_000
  # Tokens allowed after the phrase.
  c.sampling.interruption.answer_budget = 2_336
  c.sampling.interruption.phrase = "Okay, time is up. Let me stop thinking and formulate a final answer now. </think>"

  c.data = ml_collections.ConfigDict()
  # builtin | builtin_code | reasoning_gym | tfds | jsonl.
  c.data.source = "builtin"
  # Named domains mixed in one run, name -> {weight, source, verifier, data.*
  # overrides} (data/mixture.py; configs/multitask.py);
  # empty = data.source alone.
  c.data.mixture = ml_collections.ConfigDict()
  c.data.prompts_per_step = 16 if cpu else 48  # P prompts per step (paper: 48).
  c.data.generations_per_prompt = 16  # G completions per prompt (paper: 16).
  # error | skip (counted) for prompts over budget.
  c.data.on_long_prompt = "error"
  # Built-in task levels (operators per expression) mixed in training; with
  # (1, 2) the warm-started tiny_cpu policy's thinking reaches the right value
  # in ~56% of validation samples, and with
  # trainer.warm_start_answer_slip_prob = 0.7 its Answer line is right in ~19%
  # (docs/default_run.md).
  c.data.builtin_difficulty = (1, 2)
  # Built-in task: training prompts (levels 1-2 hold 6,370).
  c.data.builtin_num_train = 6_000
  c.data.builtin_num_val = 200  # Built-in task: held-out validation prompts.
  # Seed of the built-in validation draw (from the `val` split, disjoint from
  # the RL and warm-start prompts); -1 = sources.VAL_SEED, one set for every
  # run. A plan that replicates over bases draws one set per base.
  c.data.builtin_val_seed = -1
  c.data.reasoning_gym_name = ""  # reasoning_gym: dataset name.
  # reasoning_gym: training prompts generated.
  c.data.reasoning_gym_size = 10_000
  # reasoning_gym: held-out validation prompts.
  c.data.reasoning_gym_val_size = 200
  c.data.tfds_name = ""  # tfds: builder name (with optional :version).
  c.data.tfds_split = "train"  # tfds: training split.
  c.data.tfds_val_split = "test"  # tfds: validation split.
  c.data.tfds_data_dir = ""  # tfds: data_dir; "" = TFDS default.
  c.data.tfds_prompt_field = "question"  # tfds: feature holding the prompt.
  c.data.tfds_answer_field = "answer"  # tfds: feature holding the answer.
  c.data.jsonl_train = ""  # jsonl: training file of {"prompt", "answer"} rows.
  c.data.jsonl_val = ""  # jsonl: validation file.
  # jsonl: row field holding the prompt (GSM8K: question).
  c.data.jsonl_prompt_field = "prompt"
  c.data.jsonl_answer_field = "answer"  # jsonl: row field holding the answer.
  # jsonl/tfds: the reference answer is the text after the last occurrence of
  # this marker in the answer field (GSM8K: "####"); "" = the whole field.
  c.data.answer_delimiter = ""
  # Prompt rendering (data/pipeline.py PromptFormat). auto: through the
  # tokenizer's chat template when it ships one (instruct checkpoints), else
  # the raw text; on: a template is required; off: always the raw text.
  c.data.chat_template = "auto"
  # System message; "" = none (needs a chat template).
  c.data.system_prompt = ""
  # Appended to every prompt on a new line. The real-checkpoint variants ask
  # for the \boxed{} answer the math verifier reads, in the words DeepSeek-R1
  # and Qwen recommend for math; the built-in task's prompts need none.
  c.data.answer_instruction = (
      ""
      if cpu
      else (
          "Please reason step by step, and put your final answer within \\boxed{}."
      )
  )
  # Passed to the chat template as `enable_thinking`; False makes Qwen3
  # answer without thinking. Templates that do not read it ignore it.
  c.data.enable_thinking = True
  # SentencePiece .model, tokenizer.json or a directory of either; "" = the one
  # in model.hf_path, else one trained for the built-in task (at most
  # model.vocab_size) in the workdir.
  c.data.tokenizer_path = ""

  c.rewards = ml_collections.ConfigDict()
  c.rewards.verifier = "auto"  # auto (per source) | math | task | code.
  # Verifier kinds (math | task | code) that score only the text after the
  # last </think>, and score 0 when the thinking is never closed (§5: answers
  # are checked after stripping the thinking trace);
  # () scores whole completions.
  c.rewards.strip_thinking = ("math", "task", "code")
  c.rewards.timeout_s = 5.0  # Wall-clock limit per verification; then score 0.
  c.rewards.num_workers = 2  # Verifier worker processes.
  c.rewards.code_cpu_s = 2.0  # code: CPU-time limit of the candidate program.
  c.rewards.code_memory_mb = 512  # code: address-space limit.
  # code: the sandbox's boundary (rewards/sandbox/isolation.py): auto and
  # bwrap need bubblewrap, and a run that scores code without it stops at
  # start-up |
  # python: the audit hook alone, no security boundary (trusted code only).
  c.rewards.code_isolation = "auto"
  # code, under bubblewrap: run each program as a fork of one warm sandboxed
  # interpreter per worker (rewards/sandbox/server.py, ~5 ms a program) instead
  # of a fresh sandbox and interpreter (~40 ms); the same limits and hook.
  # configs/multitask.py turns it on.
  c.rewards.code_fork_server = False
  # Address-space limit of a verifier worker; 0 = none.
  c.rewards.worker_memory_mb = 2048
  # Verify the groups a decode call finished while the next call decodes, where
  # that call is decided without their scores (rl/generation.py); the same
  # decisions either way. False waits for the scores (benchmarks/loop.py).
  c.rewards.overlap = True

  c.curriculum = ml_collections.ConfigDict()
  # Retire prompts that are solved (§5).
  c.curriculum.no_positive_resampling = True
  # Historical pass rate that retires a prompt.
  c.curriculum.retire_threshold = 0.9

  c.trainer = ml_collections.ConfigDict()
  c.trainer.num_steps = 60 if cpu else 10_000  # RL optimizer steps.
  c.trainer.eval_every = 10 if cpu else 100  # Steps between validation runs.
  # Denser validation early in a run, where the curve rises and a sigmoid fit
  # learns C_mid: every eval_every_early steps up to step eval_early_until
  # (evaluation.is_eval_step); 0 = only every eval_every.
  c.trainer.eval_early_until = 0
  c.trainer.eval_every_early = 5
  # Validation prompts and k of mean@k. CPU: 200 x 16 puts the sampling noise
  # of mean@16 near 0.01 (std; docs/default_run.md).
  c.trainer.eval_num_prompts = 200 if cpu else 1000
  c.trainer.eval_samples = 16
  # Completions decoded at once in validation; 0 = a train step's P x G. It
  # runs beside the rollout slots and the train state, so on a tight slice a
  # smaller batch is what fits (llama3_8b on v5p 4x4x4: docs/tpu.md).
  c.trainer.eval_batch_rows = 0
  c.trainer.checkpoint_every = 20 if cpu else 100  # Steps between checkpoints.
  c.trainer.keep_checkpoints = 3  # Checkpoints kept on disk.
  c.trainer.log_every = 1  # Steps between metric writes.
  # Consecutive NaN/Inf steps before stopping.
  c.trainer.max_nonfinite_steps = 5
  # Gradient accumulation: the train step splits its P x G completions into this
  # many microbatches (rl/train_step.py); divides P x G, and each microbatch
  # divides over the mesh's batch axes. Same gradient, less activation memory.
  c.trainer.microbatches = 1
  # Positions whose [rows, positions, vocab] logits the train step holds at once
  # when it recomputes log-probs (rl/train_step.py); 0 = the whole sequence.
  c.trainer.logprob_chunk = 0 if cpu else 1024
  # Supervised steps (built-in only).
  c.trainer.warm_start_steps = 1500 if cpu else 0
  c.trainer.warm_start_lr = 3e-3  # Supervised warm-start learning rate.
  c.trainer.warm_start_batch = 32  # Supervised warm-start batch size.
  # The warm start's AdamW weight decay, masked as optim.weight_decay's
  # (norms and biases left out). 0 = none, the warm start's until issue 58.
  c.trainer.warm_start_weight_decay = 0.0
  # Probability that a rewrite of a warm-start worked solution writes a wrong
  # value (builtin_task.SLIP_OFFSETS): a base policy that slips at this rate
  # per step, which RL can sharpen away. 0 = exact solutions.
  c.trainer.warm_start_slip_prob = 0.0
  # Probability that a warm-start solution's Answer line misstates the value its
  # thinking reached (by one of builtin_task.SLIP_OFFSETS). The base policy then
  # computes answers it often misreports: its pass@1 is low while its pass@16
  # is high, headroom that RL can sharpen away. 0 = exact solutions.
  c.trainer.warm_start_answer_slip_prob = 0.7 if cpu else 0.0
  # Where warm-started base policies are cached, one subdirectory per settings
  # fingerprint; "" = <workdir>/base_policy. Sweeps share one across points.
  c.trainer.warm_start_dir = ""
  # Seed of the base policy (its initialisation and warm start);
  # -1 = config.seed. A fixed value gives runs that differ only in config.seed
  # one shared base, as the paper's repeated runs share one pretrained model
  # (warm_start.base_seed).
  c.trainer.warm_start_seed = -1
  # Completion tokens the warm start's targets are cut to; 0 =
  # sampling.max_new_tokens. Points that differ only in their generation budget
  # share one base when this is set (configs/parity.py).
  c.trainer.warm_start_max_new_tokens = 0
  # Parity task only (data/parity_task.py): probability that a warm-start
  # chain leaves out an even digit, a shorter chain that is just as right.
  c.trainer.warm_start_skip_prob = 0.0
  # Parity task only: the first this many supervised steps write the chain in
  # every target, before the mix of chains and guessed direct answers
  # (parity_task.CHAIN_PROB): a curriculum that learns the chain before the
  # choice between chain and direct answer. 0 = the mix from the first step.
  c.trainer.warm_start_chain_first_steps = 0
  # Parity task only, with warm_start_chain_first_steps: > 0 runs the chain
  # phase on past its planned steps, 50 at a time, until the mean loss of its
  # last 50 steps is below this (the learning rate held where the phase was
  # planned to end), for bases whose sudden drop comes late
  # (scalerl_jax/warm_steps.py). 0 = the planned steps only.
  c.trainer.warm_start_chain_loss_target = 0.0
  # warm_start_chain_loss_target > 0: the most chain-only steps in all; a
  # phase that reaches it goes on with a warning and the base gate decides.
  c.trainer.warm_start_chain_max_steps = 0
  # Parity task only, with warm_start_chain_first_steps: the chain phase's
  # learning rate (warm_steps.CHAIN_RATES). "planned": one warmup-cosine
  # schedule over the planned steps (an extension held where the phase was
  # planned to end); "peak": the peak rate through the whole chain phase,
  # extension included, then the mixed steps alone decay.
  c.trainer.warm_start_chain_rate = "planned"
  # Parity task only: the base must pass a gate before RL starts
  # (data/parity_gate.py, warm_start.check_gate): on each of base_gate_levels,
  # the greedy chain exact on at least this fraction of held-out problems, and
  # P(chain) at the decision token within base_gate_p_chain_range. 0 = no gate.
  c.trainer.base_gate_min_chain_exact = 0.0
  c.trainer.base_gate_p_chain_range = (0.0, 1.0)
  c.trainer.base_gate_levels = (1, 2, 3, 4)
  # True: the supervised warm start computes in float32 with the FP32 head,
  # whatever model.compute_dtype and model.fp32_lm_head say, so that points
  # that differ only in precision share one base, as the paper's precision
  # ablations start from one pretrained model (configs/parity_grid.py's
  # bfloat16 points). False: the run's own precision.
  c.trainer.warm_start_float32 = False

  # Per-step checks (scalerl_jax/metrics/monitors.py). One that fires logs a
  # warning and sets alert/<name> = 1 in the step's metrics; a threshold of 0
  # turns it off.
  c.monitor = ml_collections.ConfigDict()
  # entropy_collapse: train/entropy below this fraction of its first value.
  c.monitor.entropy_min_fraction = 0.1
  # truncation: fraction of completions hitting the length limit (the paper's
  # sign of coming instability; PAPER.md §6 sees it from ~10%).
  c.monitor.truncation_rate_max = 0.2
  # logp_mismatch: mean |log pi_train - log pi_gen| per loss token (staleness
  # and generator/trainer numerics together).
  c.monitor.logp_diff_max = 0.5
  # is_ratio: largest IS ratio pi_train / pi_gen (GSPO: the sequence ratio's,
  # TIS on: the token ratio's too); 0 or > 1.
  c.monitor.ratio_max = 100.0
  # reward_stuck: steps in a row whose completions all failed or all passed.
  c.monitor.reward_stuck_steps = 10
  # val_drop: validation mean@k this far below its best so far.
  c.monitor.val_drop_max = 0.15
  # Stop the run on the first alert, after saving a checkpoint of that step.
  c.monitor.stop_on_alert = False

  c.lock()
  return c
