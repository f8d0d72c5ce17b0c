"""Tests of RewardPool: agreement with in-process scoring,
timeouts, crashes, cleanup."""

import json
import os
import signal
import threading
import time

import numpy as np
import psutil
import pytest
import reasoning_gym

from configs import scalerl
from scalerl_jax import rewards
from scalerl_jax.data import builtin_task
from scalerl_jax.rewards.sandbox import isolation

_TIMEOUT_S = 1.5
# sympy tries to evaluate the tower: a timeout.
_HANG = r"\boxed{5^{5^{5^{5^5}}}}"


def _rewards_config(**overrides):
  config = scalerl.get_config()
  with config.unlocked():
    config.rewards.timeout_s = _TIMEOUT_S
    config.rewards.update(overrides)
  return config.rewards


@pytest.fixture(scope="module")
def sandbox_root(tmp_path_factory):
  """A private TMPDIR for the pool's workers, so their
  sandboxes are told apart."""
  root = tmp_path_factory.mktemp("sandboxes")
  with pytest.MonkeyPatch.context() as patch:
    patch.setenv("TMPDIR", str(root))
    yield root


@pytest.fixture(scope="module")
def pool(sandbox_root):
  del sandbox_root  # Set in the environment the pool's processes inherit.
  with rewards.RewardPool(_rewards_config()) as p:
    yield p


def _mixed_batch():
  """(completions, records) over every verifier,
  with right and wrong answers."""
  completions, records = [], []
  for record in builtin_task.builtin_prompts((1, 2), 3, 0, "train"):
    target = builtin_task.target_text(record)
    completions += [target, target.replace("Answer:", "Answer: 1")]
    records += [record, record]
  entry = reasoning_gym.create_dataset("basic_arithmetic", size=1, seed=0)[0]
  rg = {
      "id": "rg",
      "prompt": entry["question"],
      "answer": str(entry["answer"]),
      "verifier": "reasoning_gym:basic_arithmetic",
      "metadata": json.dumps(entry),
  }
  completions += [
      f"<answer>{entry['answer']}</answer>",
      "<answer>0.123</answer>",
  ]
  records += [rg, rg]
  math = {
      "id": "m",
      "prompt": "half?",
      "answer": r"\frac{1}{2}",
      "verifier": "math",
  }
  completions += [r"\boxed{0.5}", r"\boxed{2}"]
  records += [math, math]
  code = {
      "id": "c",
      "prompt": "double",
      "verifier": "code",
      "answer": json.dumps({"inputs": ["4"], "outputs": ["8"]}),
  }
  completions += [
      "```python\nprint(2 * int(input()))\n```",
      "```python\nprint(4)\n```",
  ]
  records += [code, code]
  return completions, records


@pytest.mark.needs_bwrap
def test_scores_match_in_process_verification(pool):
  completions, records = _mixed_batch()
  scores, stats = pool.score(completions, records)
  expected = [
      rewards.verify(c, r, rewards.resolve_spec(r))
      for c, r in zip(completions, records)
  ]
  assert scores.dtype == np.float32 and scores.shape == (len(completions),)
  np.testing.assert_array_equal(scores, expected)
  np.testing.assert_array_equal(scores, [1.0, 0.0] * (len(completions) // 2))
  assert stats["num_completions"] == len(completions)
  assert (
      stats["num_timeouts"] == stats["num_errors"] == stats["num_crashes"] == 0
  )
  assert 0 < stats["mean_s"] <= stats["slowest_s"] < _TIMEOUT_S


@pytest.mark.needs_bwrap
def test_a_hanging_verification_is_killed_and_the_pool_recovers(pool):
  record = {"id": "m", "answer": "1", "verifier": "math"}
  restarts = pool.score([r"\boxed{1}"], [record])[1]["num_worker_restarts"]
  start = time.monotonic()
  scores, stats = pool.score([_HANG, r"\boxed{1}"], [record, record])
  assert time.monotonic() - start < _TIMEOUT_S + 1.0
  np.testing.assert_array_equal(scores, [0.0, 1.0])
  assert stats["num_timeouts"] == 1
  assert _TIMEOUT_S <= stats["slowest_s"] < _TIMEOUT_S + 1.0
  assert stats["num_worker_restarts"] == restarts + 1
  completions, records = _mixed_batch()
  scores, stats = pool.score(completions, records)
  np.testing.assert_array_equal(scores, [1.0, 0.0] * (len(completions) // 2))
  assert stats["num_timeouts"] == 0


@pytest.mark.needs_bwrap
def test_a_code_timeout_leaves_no_program_behind(pool, sandbox_root):
  record = {"id": "c", "verifier": "code", "answer": "assert f(1) == 1"}
  sleeper = "```python\nimport time\ntime.sleep(600)\n```"
  scores, _ = pool.score([sleeper], [record])
  assert scores[0] == 0.0
  assert not _sandboxed_programs(sandbox_root)
  assert not os.listdir(sandbox_root)  # Temp dirs removed.


@pytest.mark.needs_bwrap
def test_a_worker_dying_mid_program_leaves_nothing_behind(sandbox_root):
  # A fresh sandbox per program, found as its worker's child.
  record = {"id": "c", "verifier": "code", "answer": "assert f(1) == 1"}
  sleeper = "```python\nimport time\ntime.sleep(600)\n```"
  # Ample time to catch the program running, however loaded the machine.
  timeout_s = 20.0

  def kill_the_worker_once_its_program_runs():
    deadline = time.monotonic() + timeout_s / 2
    while time.monotonic() < deadline:
      # The pool's own probe that bubblewrap runs (isolation.bwrap_works) is
      # this process's child; the program is a worker's.
      try:
        parents = {p.ppid() for p in _sandboxed_programs(sandbox_root)}
      except psutil.NoSuchProcess:  # The probe ended while being looked at.
        continue
      workers = parents - {os.getpid()}
      if workers:
        time.sleep(0.2)  # Let the worker report the program to the pool first.
        psutil.Process(workers.pop()).kill()
        return

  with rewards.RewardPool(
      _rewards_config(
          timeout_s=timeout_s, num_workers=1, code_fork_server=False
      )
  ) as slow_pool:
    killer = threading.Thread(target=kill_the_worker_once_its_program_runs)
    killer.start()
    scores, stats = slow_pool.score([sleeper], [record])
    killer.join()
  assert scores[0] == 0.0 and stats["num_crashes"] == 1
  # The pool killed the program's group and removed the temp dir that the
  # dead worker could not.
  assert not _sandboxed_programs(sandbox_root)
  assert not os.listdir(sandbox_root)


@pytest.mark.needs_bwrap
def test_killed_workers_are_replaced(pool):
  workers = psutil.Process(pool._workers._zygote.pid).children()
  assert len(workers) == 2
  for process in workers:
    process.send_signal(signal.SIGKILL)
  # Their sockets close on death.
  while any(_alive(process) for process in workers):
    time.sleep(0.01)
  completions, records = _mixed_batch()
  scores, stats = pool.score(completions, records)
  np.testing.assert_array_equal(scores, [1.0, 0.0] * (len(completions) // 2))
  assert stats["num_crashes"] + stats["num_timeouts"] + stats["num_errors"] == 0


def test_invalid_completions_score_zero(pool):
  record = {"id": "m", "answer": "7", "verifier": "math"}
  scores, stats = pool.score(
      [None, 7, b"\\boxed{7}", "\\boxed{7}"], [record] * 4
  )
  np.testing.assert_array_equal(scores, [0.0, 0.0, 1.0, 1.0])
  assert stats["num_invalid"] == 2


def test_verifier_errors_score_zero_and_are_counted(pool):
  scores, stats = pool.score(
      [r"\boxed{1}", r"\boxed{1}"],
      [
          {"id": "e", "answer": "", "verifier": "math"},
          {"id": "f", "answer": "1", "verifier": "math"},
      ],
  )
  np.testing.assert_array_equal(scores, [0.0, 1.0])
  assert stats["num_errors"] == 1


def test_malformed_records_raise_before_scoring(pool):
  with pytest.raises(ValueError, match="'verifier'"):
    pool.score(["x"], [{"id": "bad", "answer": "1"}])
  with pytest.raises(ValueError, match="2 completions but 1 records"):
    pool.score(["x", "y"], [{"id": "m", "answer": "1", "verifier": "math"}])


def test_verifier_mode_from_config():
  record = {"id": "b", "answer": "4", "verifier": "builtin"}
  with rewards.RewardPool(
      _rewards_config(verifier="math", num_workers=1)
  ) as math_pool:
    # The math verifier accepts a boxed answer the built-in scorer would not.
    scores, _ = math_pool.score([r"\boxed{4}"], [record])
    assert scores[0] == 1.0
  with pytest.raises(ValueError, match="rewards.verifier"):
    rewards.RewardPool(_rewards_config(verifier="exact"))


def test_strip_thinking_from_config_reaches_the_workers(pool):
  # The answer sits only inside a thinking trace the completion never closed.
  record = {"id": "m", "answer": "54", "verifier": "math"}
  completions = [
      r"<think> so \boxed{54} and then",
      r"<think> so \boxed{54} </think>",
  ]
  # Default: every kind strips.
  scores, _ = pool.score(completions, [record] * 2)
  np.testing.assert_array_equal(scores, [0.0, 0.0])
  with rewards.RewardPool(
      _rewards_config(strip_thinking=("task", "code"), num_workers=1)
  ) as whole_pool:
    scores, _ = whole_pool.score(completions, [record] * 2)
    np.testing.assert_array_equal(scores, [1.0, 1.0])
  with pytest.raises(ValueError, match="rewards.strip_thinking"):
    rewards.RewardPool(_rewards_config(strip_thinking=("maths",)))


@pytest.mark.needs_bwrap
def test_submit_returns_at_once_and_scores_as_score_does_beside_a_direct_call(
    pool,
):
  completions, records = _mixed_batch()
  scoring = pool.submit(
      [_HANG] + completions,
      [{"id": "m", "answer": "1", "verifier": "math"}] + records,
  )
  assert not scoring.done()  # The hang alone takes the whole timeout.
  # A direct call meanwhile waits its turn: the two batches must not mix.
  direct, direct_stats = pool.score(completions, records)
  scores, stats = scoring.result(timeout=60)
  np.testing.assert_array_equal(
      scores, [0.0] + [1.0, 0.0] * (len(completions) // 2)
  )
  np.testing.assert_array_equal(direct, scores[1:])
  assert (stats["num_completions"], stats["num_timeouts"]) == (
      len(completions) + 1,
      1,
  )
  assert (direct_stats["num_completions"], direct_stats["num_timeouts"]) == (
      len(completions),
      0,
  )


def test_submit_raises_score_errors_at_result(pool):
  scoring = pool.submit(["x"], [{"id": "bad", "answer": "1"}])
  with pytest.raises(ValueError, match="verifier"):
    scoring.result(timeout=60)


def test_close_waits_for_a_submitted_call_and_leaves_nothing_behind():
  before = {p.pid for p in psutil.Process().children(recursive=True)}
  p = rewards.RewardPool(_rewards_config(num_workers=1))
  scoring = p.submit([_HANG], [{"id": "m", "answer": "1", "verifier": "math"}])
  deadline = time.monotonic() + 60
  # Calls not started are cancelled.
  while not scoring.running() and time.monotonic() < deadline:
    time.sleep(0.01)
  p.close()
  # Finished (killed at its timeout) before close.
  scores, stats = scoring.result(timeout=0)
  assert scores[0] == 0.0 and stats["num_timeouts"] == 1
  assert {p.pid for p in psutil.Process().children(recursive=True)} == before
  with pytest.raises(RuntimeError, match="closed"):
    p.submit(["x"], [{"id": "m", "answer": "1", "verifier": "math"}])


@pytest.mark.needs_bwrap
def test_close_leaves_nothing_behind():
  before = {p.pid for p in psutil.Process().children(recursive=True)}
  p = rewards.RewardPool(_rewards_config(num_workers=2))
  # Server + 2.
  assert len(psutil.Process().children(recursive=True)) == len(before) + 3
  p.score(
      ["```python\nimport time\ntime.sleep(600)\n```"],
      [{"id": "c", "verifier": "code", "answer": "assert f(1) == 1"}],
  )
  p.close()
  p.close()  # Idempotent.
  assert {p.pid for p in psutil.Process().children(recursive=True)} == before
  with pytest.raises(RuntimeError, match="closed"):
    p.score(["x"], [{"id": "m", "answer": "1", "verifier": "math"}])


def _alive(process):
  try:
    return process.status() != psutil.STATUS_ZOMBIE
  except psutil.NoSuchProcess:
    return False


def _sandboxed_programs(root):
  """Live sandboxes below this process: bwrap, or a server in `root`
  (its own processes left out)."""
  found = []
  for process in psutil.Process().children(recursive=True):
    try:
      cmdline = process.cmdline()
    except psutil.Error:
      continue
    if (
        cmdline
        and _alive(process)
        and (
            os.path.basename(cmdline[0]) == "bwrap"
            or any(arg.startswith(str(root)) for arg in cmdline)
        )
    ):
      found.append(process)
  pids = {process.pid for process in found}
  return [process for process in found if process.ppid() not in pids]


@pytest.mark.needs_bwrap
def test_copies_of_a_program_for_the_same_code_record_run_once(pool):
  # A coin flip: 16 separate runs would all agree with probability 2**-15.
  program = (
      "```python\nimport random\ndef f():\n  return random.random() < 0.5\n```"
  )
  record = {"id": "coin", "verifier": "code", "answer": "assert f()"}
  other = {"id": "coin2", "verifier": "code", "answer": "assert f() == True"}
  scores, stats = pool.score(
      [program] * 16 + [program], [record] * 16 + [other]
  )
  assert len(set(scores[:16].tolist())) == 1 and stats["num_completions"] == 17
  # Other kinds are scored one by one, copies too.
  math = {
      "id": "m",
      "prompt": "half?",
      "answer": r"\frac{1}{2}",
      "verifier": "math",
  }
  assert pool.score([r"\boxed{0.5}"] * 3, [math] * 3)[0].tolist() == [1.0] * 3
