"""Two controllers on CPU: one RL run in
2 processes of 4 devices == 1 process of 8.

Two processes on localhost each call `jax.distributed.initialize` (through
`config.mesh.distributed`) and hold 4 simulated CPU devices; they reduce over
gloo, JAX's CPU collectives. Together they train 2 RL steps of the built-in
task with validation and a checkpoint after each, the second step in a run
resumed from the first step's checkpoint, then export the checkpoint. A
reference run trains the same 2 steps straight in one process with 8 simulated
devices, on the same (data 2, fsdp 2, tensor 2) mesh, at the same time. Both
start from one warm-started base policy, the test session's
(`helpers.rl_base_dir`). Each process logs every host-side decision
(`tests/scripts/multi_controller.py`).

How the data is split: the host side is replicated, the device side split.
Every process runs the same host program on the same data: the same prompt
pipeline and curriculum, the same rollout buffer, the whole train batch. The
mesh splits the device work: sampler slots (with their KV cache rows) and
train-batch rows over data x fsdp, so each process prefills, decodes and
back-propagates only the rows of its own devices (`sharding.place_global` and
jit's placement hand each device its slice), and weights and Adam moments
over fsdp x tensor. Host arrays are token ids and a few floats per sequence,
small next to the device work, and identical host programs on identical
inputs make identical decisions. The inputs agree because the sampler's
finished sequences and the train step's metrics come back replicated to every
process, and the verifier scores are shared (below): those scores are the
only host values the processes exchange.

Where rewards are scored: once per completion, split over the processes, and
shared (`rewards/workers/shared.py`). Process i verifies the i-th contiguous
share of each batch of completions in its own reward pool, and the scores are
all-gathered. Not on every host: a verification can time out or crash on one
host and not another, and any disagreement would send the hosts' decisions
(zero-variance groups, curriculum, buffer) apart until their collectives hang;
splitting also does each verification once instead of once per host.

The test asserts: the two processes' decision logs (prompts started, groups
harvested with their scores, the buffer's hand-out order, curriculum and
data-iterator state after each step, validation metrics, losses) and their
gathered parameters are identical; the same decisions and, within 1e-5, the
same parameters as the one-process run; the resumed run restores exactly the
parameters the first run ended with; each completion was verified by one
process; orbax wrote each checkpoint from both processes; process 0 alone
wrote metrics (the one-process run's, wall-clock fields aside) and the
export.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import portpicker
import pytest

from scalerl_jax import experiment
from scalerl_jax import workdir as workdir_lib
from tests import helpers
from tests import session_env
from tests.scripts import multi_controller

# Minutes on 2 cores: README's test command leaves it out, CI runs it.
pytestmark = pytest.mark.slow(seconds=130)

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_TIMEOUT_S = 600.0
_MAX_PARAM_DIFF = 1e-5


def _command(args: list[str]) -> list[str]:
  return [sys.executable, "-m", "tests.scripts.multi_controller", *args]


def _run_all(jobs: list[tuple[list[str], int, str]]) -> None:
  """Runs (command, simulated CPU devices, log file) jobs at once.

  Fails as soon as one fails (the others would wait in a collective), and
  kills every process group still running when it returns or raises: no
  process, reward workers included, outlives the test.
  """
  procs = []
  try:
    for command, devices, log in jobs:
      # NPROC sizes XLA:CPU's thread pools: with the default (the core count, at
      # least one thread per device), collectives that a program runs
      # concurrently can take every thread and deadlock on a 2-core machine.
      env = dict(
          os.environ,
          JAX_PLATFORMS="cpu",
          PYTHONPATH=_ROOT,
          NPROC="32",
          XLA_FLAGS=session_env.xla_flags(
              f"--xla_force_host_platform_device_count={devices} "
              "--xla_cpu_collective_call_terminate_timeout_seconds=600 "
              "--xla_cpu_collective_timeout_seconds=600"
          ),
      )
      with open(log, "w") as f:
        procs.append(
            subprocess.Popen(
                command,
                cwd=_ROOT,
                env=env,
                stdout=f,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
    deadline = time.monotonic() + _TIMEOUT_S
    codes = [p.poll() for p in procs]
    while None in codes and not any(codes) and time.monotonic() < deadline:
      time.sleep(0.2)
      codes = [p.poll() for p in procs]
    if any(code != 0 for code in codes):
      tails = "\n".join(
          f"--- {log} ({'still running' if code is None else f'exit {code}'}):\n"
          f"{open(log).read()[-3000:]}"
          for (_, _, log), code in zip(jobs, codes)
          if code != 0
      )
      pytest.fail(
          f"a process failed, or the runs took over {_TIMEOUT_S:.0f} s:\n{tails}"
      )
  finally:
    for p in procs:
      if p.poll() is None:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def _load(out: str, tag: str) -> tuple[dict, dict[str, np.ndarray]]:
  with open(os.path.join(out, f"decisions_{tag}.json")) as f:
    decisions = json.load(f)
  with np.load(os.path.join(out, f"params_{tag}.npz")) as params:
    return decisions, dict(params)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """The two-process run and the one-process reference;
  their logs and parameters."""
  root = tmp_path_factory.mktemp("multi_controller")
  out, base = str(root / "out"), str(root / "base_policy")
  start = time.monotonic()
  # The base policy both runs start from, restored by every process: the
  # session's warm start of helpers.rl_test_config (helpers.rl_base_dir), whose
  # cache key this run's config shares (the key leaves the mesh and the RL
  # learning rate out). Built here on one device, Experiment.build finds it
  # and restores it; it would warm-start one were the keys to differ.
  shutil.copytree(
      os.path.join(helpers.rl_base_dir(), workdir_lib.BASE_POLICY_DIR), base
  )
  config = multi_controller.make_config(2, base)
  config.mesh.shape = (1, 1, 1)
  experiment.Experiment.build(config, str(root / "warm_start"))
  warm_start_s = time.monotonic() - start
  common = ["--out", out, "--warm_start_dir", base]
  port = portpicker.pick_unused_port()
  jobs = [
      (
          _command(
              common
              + [
                  "--workdir",
                  str(root / "ref"),
                  "--tag",
                  "ref",
                  "--num_steps",
                  "2",
              ]
          ),
          8,
          str(root / "ref.log"),
      )
  ]
  jobs += [
      (
          _command(
              common
              + [
                  "--workdir",
                  str(root / "mc"),
                  "--tag",
                  f"p{i}",
                  "--num_steps",
                  "1,2",
                  "--num_processes",
                  "2",
                  "--process_id",
                  str(i),
                  "--coordinator",
                  f"localhost:{port}",
              ]
          ),
          4,
          str(root / f"p{i}.log"),
      )
      for i in range(2)
  ]
  _run_all(jobs)
  print(
      f"warm start {warm_start_s:.0f} s; all runs {time.monotonic() - start:.0f} s"
  )
  return {"root": root, **{tag: _load(out, tag) for tag in ("ref", "p0", "p1")}}


def _metrics(workdir) -> list[dict]:
  """metrics.jsonl without the wall-clock measurements."""
  with open(workdir / "metrics.jsonl") as f:
    rows = [json.loads(line) for line in f]
  return [
      {
          k: v
          for k, v in r.items()
          if not k.startswith("time/") and k != "compute/device_seconds"
      }
      for r in rows
  ]


def _decisions(log: dict) -> list:
  """The decision events, without the parameter snapshots
  (which differ by run split)."""
  return [e for e in log["events"] if e[0] not in ("init", "final")]


def _assert_close(a, b, where="events"):
  """Equal JSON trees, floats within 1e-5 relative
  (reductions ordered differently)."""
  if isinstance(a, float) or isinstance(b, float):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=where)
  elif isinstance(a, dict):
    assert a.keys() == b.keys(), where
    for k in a:
      _assert_close(a[k], b[k], f"{where}[{k!r}]")
  elif isinstance(a, list):
    assert len(a) == len(b), where
    for i, (x, y) in enumerate(zip(a, b)):
      _assert_close(x, y, f"{where}[{i}]")
  else:
    assert a == b, f"{where}: {a!r} != {b!r}"


def test_each_process_sees_its_4_devices_of_8(runs):
  for i in range(2):
    assert runs[f"p{i}"][0]["topology"] == {
        "process_index": i,
        "process_count": 2,
        "local_devices": 4,
        "devices": 8,
    }
  assert runs["ref"][0]["topology"]["process_count"] == 1


def test_processes_take_identical_host_decisions(runs):
  (log0, params0), (log1, params1) = runs["p0"], runs["p1"]
  assert log0["events"] == log1["events"]
  kinds = [e[0] for e in log0["events"]]
  # Both steps started prompts, harvested and handed out groups, and validated.
  assert {"start", "harvest", "take", "after_step", "validation"} <= set(kinds)
  assert [e[1] for e in log0["events"] if e[0] == "validation"] == [0, 1, 2]
  assert [e[1] for e in log0["events"] if e[0] == "after_step"] == [1, 2]
  assert params0.keys() == params1.keys()
  for k in params0:
    np.testing.assert_array_equal(params0[k], params1[k], err_msg=k)


def test_each_completion_is_verified_once_by_one_of_the_processes(runs):
  here = [runs[f"p{i}"][0]["verified_here"] for i in range(2)]
  # Every batch (G = 4 completions per group, 16 per validation
  # batch) splits evenly.
  assert here[0] == here[1] == runs["ref"][0]["verified_here"] // 2 > 0


def test_decisions_match_the_one_process_run(runs):
  _assert_close(_decisions(runs["p0"][0]), _decisions(runs["ref"][0]))


def test_params_match_the_one_process_run(runs):
  ref, mc = runs["ref"][1], runs["p0"][1]
  finals = sorted(k for k in ref if k.startswith("final0/"))
  assert finals
  diff, moved = 0.0, 0.0
  for k in finals:
    name = k.split("/", 1)[1]
    np.testing.assert_array_equal(
        mc[f"init0/{name}"], ref[f"init0/{name}"], err_msg=name
    )
    diff = max(diff, float(np.abs(mc[f"final1/{name}"] - ref[k]).max()))
    moved = max(moved, float(np.abs(ref[k] - ref[f"init0/{name}"]).max()))
  print(
      f"max |param diff| vs one process: {diff:.3g}; largest update over 2 steps: {moved:.3g}"
  )
  # Training moved the parameters: the check has teeth.
  assert moved > 50 * _MAX_PARAM_DIFF
  assert diff <= _MAX_PARAM_DIFF


def test_resume_restores_the_first_runs_parameters(runs):
  params = runs["p0"][1]
  names = [k.split("/", 1)[1] for k in params if k.startswith("final0/")]
  for name in names:
    np.testing.assert_array_equal(
        params[f"init1/{name}"], params[f"final0/{name}"], err_msg=name
    )
  assert [
      e[1:] for e in runs["p0"][0]["events"] if e[0] in ("init", "final")
  ] == [[0, 0], [0, 1], [1, 1], [1, 2]]


def test_checkpoints_written_by_both_processes_metrics_and_export_by_process_0(
    runs,
):
  root = runs["root"]
  checkpoints = root / "mc" / "checkpoints"
  assert sorted(os.listdir(checkpoints)) == ["1", "2"]
  for step in ("1", "2"):
    state = os.listdir(checkpoints / step / "state")
    assert {"ocdbt.process_0", "ocdbt.process_1"} <= set(state), state
  rows, ref_rows = _metrics(root / "mc"), _metrics(root / "ref")
  # Written once: by process 0 alone.
  assert [r["step"] for r in rows] == [0, 1, 2]
  _assert_close(rows, ref_rows, "metrics")
  assert os.path.isfile(root / "out" / "export_p0" / "model.safetensors")
  assert not os.path.exists(root / "out" / "export_p1")
