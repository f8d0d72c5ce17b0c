"""Faults of the disaggregated layout: a role stalled, the process killed
while the weights move (docs/design/disaggregated.md, "Faults").

Both roles live in one process, so a role killed is the process killed:
nothing survives to decode with half-moved weights, and a restart resumes
from the newest complete checkpoint. Lives of tests/scripts/role_faults.py
on two simulated devices (one a role), started and killed by tests/lives.py:

  * fixed mode, swapped in at decode step 16: SIGKILLed halfway through the
    move of version 3 (half the leaves put, sequences in flight), then the
    moment its next checkpoint write begins; restarted after each, it
    finishes bit-identical to an uninterrupted run (train state, slots,
    metrics).
  * fixed mode: the generator's decode call (the next step's, decoding
    ahead) never returns, then the trainer's train step never returns; each
    time the one host thread's watch ends the process with status 75,
    naming the role, and the next life resumes from the checkpoint named.
  * free mode: the generator stalls (the trainer stops the run, naming it),
    then the trainer stalls (the generator ends the process with status 75,
    naming it), then the process is SIGKILLed halfway through a move; each
    message names the checkpoint the next life resumes from, and the run
    finishes with every step once and no lag above k.
"""

import os
import re

import pytest

from scalerl_jax.multihost import peers
from tests import helpers
from tests import lives
from tests import session_env
from tests.scripts import role_faults

# Minutes on 2 cores: README's test command leaves it out, CI runs it.
pytestmark = pytest.mark.slow(seconds=300)

K = 2  # helpers.rl_test_config's buffer.max_off_policy.
_TWO_DEVICES = {
    "XLA_FLAGS": session_env.xla_flags(
        "--xla_force_host_platform_device_count=2"
    )
}
_RESUMED = re.compile(r"Resumed from the checkpoint at step (\d+)")
_TIMEOUT = re.escape(
    f"(buffer.role_stall_timeout_s={role_faults.STALL_TIMEOUT_S:g})"
)
_RESUMES_FROM = (
    r"Restart on the same workdir: the run resumes from the newest complete "
    r"checkpoint, step (?P<step>\d+) in "
)
_GENERATOR_STALLED = re.compile(
    r"RoleStalled: generator: no decode call finished in (?P<age>[\d.]+) s "
    + _TIMEOUT
    + r", with weights of version (?P<version>\d+) and (?P<in_flight>\d+) "
    r"groups in flight, (?P<doing>[^.]+)\. It is hung or stalled \(see its "
    r"log\); the trainer stops the run instead of waiting\. " + _RESUMES_FROM
)
_TRAINER_STALLED = re.compile(
    r"scalerl_jax: trainer: no train step finished in (?P<age>[\d.]+) s "
    + _TIMEOUT
    + r", since it took step (?P<taken>\d+)'s batch; the generator waits "
    r"for it, held back by k with weights of version (?P<version>\d+)\. It "
    r"is hung or stalled \(see its log\); the process exits with status "
    + str(peers.LOST_PEER_EXIT)
    + r" instead of waiting\. "
    + _RESUMES_FROM
)

_FIXED_STALLED = re.compile(
    r"scalerl_jax: (?P<role>generator|trainer): no (?:decode call|train "
    r"step) finished in (?P<age>[\d.]+) s "
    + _TIMEOUT
    + r", (?P<doing>[^;]+); the one host thread waits on it\. It is hung or "
    r"stalled \(see its log\); the process exits with status "
    + str(peers.LOST_PEER_EXIT)
    + r" instead of waiting\. "
    + _RESUMES_FROM
)


def _life(mode, workdir, fault="none"):
  return ["tests.scripts.role_faults", mode, workdir, fault]


def _read(path):
  with open(path) as f:
    return f.read()


def _resumed_from(log_path):
  """The checkpoint step the life logged resuming from."""
  return int(_RESUMED.search(_read(log_path)).group(1))


def _stalled_life(mode, workdir, fault, log_path, status, message):
  """Runs a life whose `fault` stalls a role until the process ends with
  `status`; returns its `message` match, which must name a wait at least
  the stall timeout long."""
  lives.finish(
      _life(mode, workdir, fault), log_path, _TWO_DEVICES, status=status
  )
  stalled = message.search(_read(log_path))
  assert stalled, lives.tail(log_path)
  assert float(stalled["age"]) >= role_faults.STALL_TIMEOUT_S
  return stalled


def test_killed_while_the_weights_move_resumes_bit_identically(tmp_path):
  reference = helpers.copy_rl_base(str(tmp_path / "reference"))
  killed = helpers.copy_rl_base(str(tmp_path / "killed"))
  log = lambda name: str(tmp_path / f"{name}.log")
  lives.finish(_life("fixed", reference), log("reference"), _TWO_DEVICES)
  plan = [
      ("file", role_faults.MOVING, "moving_at=3"),
      ("checkpoint_write", 1, "none"),
  ]
  for i, (kind, parameter, fault) in enumerate(plan):
    lives.kill_once(
        _life("fixed", killed, fault),
        killed,
        log(f"life{i}"),
        kind,
        parameter,
        _TWO_DEVICES,
    )
  os.remove(os.path.join(killed, role_faults.MOVING))
  lives.finish(_life("fixed", killed), log("last"), _TWO_DEVICES)

  # Killed in step 3's move, the run resumed from a checkpoint of step 2 or
  # 3 (the kill may cut step 3's write); the last life had steps to run.
  num_steps = role_faults.NUM_STEPS["fixed"]
  assert _resumed_from(log("life1")) in (2, 3), lives.tail(log("life1"))
  assert _resumed_from(log("last")) < num_steps
  lives.assert_same_final_state(reference, killed, num_steps)
  stream = helpers.metrics_without_times(killed)
  assert [r["step"] for r in stream] == list(range(num_steps + 1))
  assert stream == helpers.metrics_without_times(reference)


def test_a_stalled_role_in_the_fixed_mode_ends_the_process_naming_it(
    tmp_path,
):
  workdir = helpers.copy_rl_base(str(tmp_path / "run"))
  log = lambda name: str(tmp_path / f"{name}.log")

  # Step 1's train step is dispatched, and step 2's first call decoding
  # ahead under version 1's weights never returns.
  stalled = _stalled_life(
      "fixed",
      workdir,
      "generator_stalls",
      log("generator_stalls"),
      peers.LOST_PEER_EXIT,
      _FIXED_STALLED,
  )
  assert stalled["role"] == "generator"
  assert re.fullmatch(
      r"decoding its call of \d+ steps for step 2 with weights of version 1",
      stalled["doing"],
  ), stalled["doing"]
  # Step 1 was checkpointed before its train step.
  assert int(stalled["step"]) == 1

  # Resumed there: its 2nd batch (step 2's) goes into a train step that
  # never returns.
  stalled = _stalled_life(
      "fixed",
      workdir,
      "trainer_stalls",
      log("trainer_stalls"),
      peers.LOST_PEER_EXIT,
      _FIXED_STALLED,
  )
  assert _resumed_from(log("trainer_stalls")) == 1
  assert stalled["role"] == "trainer"
  assert stalled["doing"] == "computing step 2"
  assert int(stalled["step"]) == 2


def test_a_stalled_role_stops_the_run_naming_it_then_it_resumes(tmp_path):
  workdir = helpers.copy_rl_base(str(tmp_path / "run"))
  log = lambda name: str(tmp_path / f"{name}.log")

  # The generator's decode call never returns: the trainer, waiting on it,
  # stops the run; the stalled thread is left to end with the process.
  stalled = _stalled_life(
      "free",
      workdir,
      "generator_stalls",
      log("generator_stalls"),
      1,
      _GENERATOR_STALLED,
  )
  text = _read(log("generator_stalls"))
  assert stalled["doing"].startswith("decoding its call of 4 steps"), text
  assert 'threads left: ["free-generator"]' in text
  checkpoint = int(stalled["step"])

  # The trainer's train step never returns: the generator, held back by k,
  # ends the process with status 75.
  stalled = _stalled_life(
      "free",
      workdir,
      "trainer_stalls",
      log("trainer_stalls"),
      peers.LOST_PEER_EXIT,
      _TRAINER_STALLED,
  )
  assert _resumed_from(log("trainer_stalls")) == checkpoint
  # The 2nd batch of the life, taken after checkpointing the step before.
  assert int(stalled["taken"]) == checkpoint + 1 == int(stalled["step"])
  checkpoint = int(stalled["step"])

  # SIGKILLed halfway through the life's third move (a new version's).
  lives.kill_once(
      _life("free", workdir, "moving_nth=3"),
      workdir,
      log("moving"),
      "file",
      role_faults.MOVING,
      _TWO_DEVICES,
  )
  assert _resumed_from(log("moving")) == checkpoint
  os.remove(os.path.join(workdir, role_faults.MOVING))
  lives.finish(_life("free", workdir), log("last"), _TWO_DEVICES)
  assert (
      checkpoint <= _resumed_from(log("last")) < role_faults.NUM_STEPS["free"]
  )

  num_steps = role_faults.NUM_STEPS["free"]
  rows = helpers.metrics_without_times(workdir)
  assert [r["step"] for r in rows] == list(range(num_steps + 1))
  for r in rows[1:]:
    assert r["staleness/max"] <= K and r["staleness/over_k"] == 0, r
    assert r["buffer/evicted_stale"] == 0, r
  assert os.path.exists(os.path.join(workdir, "DONE"))
