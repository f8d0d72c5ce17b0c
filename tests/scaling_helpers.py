"""Synthetic compute-performance curves and run workdirs for the scaling tests.

`table1_run` draws the curves of PAPER.md §1 Table 1: each curve's (C_mid, B,
A) with R_0 = 0.3, 100 evaluations evenly spaced in compute from C_mid / 5 to
20 C_mid (so the first half reaches 10 C_mid), and Gaussian noise of sd 0.005,
about the sampling noise of mean@16 over 1,000 prompts.

`write_workdir` fabricates a run's workdir as the trainer writes it: one
metrics.jsonl line per step with cumulative compute, validation every few
steps from step 0 on, scores from a known sigmoid in steps plus noise.
"""

import json
import os

import numpy as np

from scalerl_jax import workdir as workdir_lib
from scalerl_jax.scaling import runs
from scalerl_jax.scaling import sigmoid

# (name, C_mid in GPU-hours, B, A) from PAPER.md §1.
TABLE1 = (
    ("scalerl_8b", 2542, 1.92, 0.610),
    ("gen_32k", 11272, 1.89, 0.645),
    ("moe_17bx16", 4242, 1.65, 0.710),
    ("batch_512", 2818, 1.77, 0.605),
    ("batch_2048", 10909, 1.70, 0.645),
    ("gens_8", 2542, 2.44, 0.585),
    ("gens_24", 3054, 2.22, 0.595),
    ("gens_32", 2936, 2.07, 0.595),
    ("math", 2896, 2.05, 0.595),
    ("code", 1675, 1.09, 0.615),
)
R0 = 0.3
NOISE = 0.005
FLOPS_PER_STEP = 1e14


def table1_run(index, seed):
  """(compute in GPU-hours, score) of Table 1 curve `index`,
  noise drawn from `seed`."""
  _, c_mid, b, a = TABLE1[index]
  compute = np.linspace(c_mid / 5, 20 * c_mid, 100)
  noise = np.random.default_rng([index, seed]).normal(0.0, NOISE, compute.size)
  return compute, sigmoid.sigmoid(compute, a, b, c_mid, R0) + noise


def write_workdir(
    workdir,
    *,
    a,
    b,
    c_mid_step,
    seed,
    r0=0.2,
    noise=NOISE,
    num_steps=200,
    eval_every=5,
    seconds_per_step=36.0,
    stderr=None,
    train_score=False,
    extra_lines=()
):
  """Writes `<workdir>/metrics.jsonl` of a fabricated run.

  Args:
    workdir: the run's directory (created).
    a, b: the curve's A and B.
    c_mid_step: its C_mid, in steps.
    seed: seed of the noise.
    r0: the pass rate before RL.
    noise: sd of the Gaussian noise on every validation score, step 0's too.
    num_steps: the last step.
    eval_every: steps between validations.
    seconds_per_step: device seconds each step adds (FLOPS_PER_STEP FLOPs).
    stderr: val/mean_at_k_stderr written on every validation line, as the
      trainer logs it; None writes none, as older runs.
    train_score: also write train/reward_mean on every line after step 0, as
      the trainer logs a batch's reward (no line at step 0, which trains
      nothing): the same sigmoid plus noise, drawn after the validation's.
    extra_lines: raw lines appended at the end.

  Returns:
    {step: score written} of the validation lines.
  """
  os.makedirs(workdir, exist_ok=True)
  rng = np.random.default_rng(seed)
  scores = {}
  with open(os.path.join(workdir, workdir_lib.METRICS_FILE), "w") as f:
    for step in range(num_steps + 1):
      row = {
          "step": step,
          "compute/flops": step * FLOPS_PER_STEP,
          "compute/device_seconds": step * seconds_per_step,
          "train/loss": 0.1,
      }
      if step % eval_every == 0:
        score = sigmoid.sigmoid(step, a, b, c_mid_step, r0) + rng.normal(
            0, noise
        )
        row["val/mean_at_k"] = scores[step] = float(np.clip(score, 0, 1))
        if stderr is not None:
          row["val/mean_at_k_stderr"] = stderr
      if train_score and step > 0:
        score = sigmoid.sigmoid(step, a, b, c_mid_step, r0) + rng.normal(
            0, noise
        )
        row["train/reward_mean"] = float(np.clip(score, 0, 1))
      f.write(json.dumps(row) + "\n")
    f.writelines(line + "\n" for line in extra_lines)
  return scores
