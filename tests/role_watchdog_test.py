"""The fixed mode's watch (rl/role_watchdog.StepWatch): which role the one
host thread waits on, active only where it is asked for. Its ending a
stalled process is tested end to end in tests/disaggregated_faults_test.py."""

import threading

from configs import scalerl
from scalerl_jax.rl import role_watchdog

G, T = role_watchdog.GENERATOR, role_watchdog.TRAINER


def _threads():
  return [t for t in threading.enumerate() if t.name == "step-watch"]


def test_the_watch_names_the_innermost_wait_and_ends_on_neither():
  watch = role_watchdog.StepWatch(0.0, "")
  assert watch.waiting is None
  with watch.on(T, "computing step 3"):
    with watch.on(G, "starting groups for step 4"):
      watch.waits_on(G, "decoding its call of 16 steps")
      assert watch.waiting == (G, "decoding its call of 16 steps")
    # Back on the trainer once the decoding ahead is dispatched.
    assert watch.waiting == (T, "computing step 3")
  assert watch.waiting is None
  try:
    with watch.on(G, "moving weights v2"):
      raise StopIteration  # Every prompt retired: the save is not watched.
  except StopIteration:
    pass
  assert watch.waiting is None


def test_only_the_disaggregated_fixed_mode_is_watched():
  config = scalerl.get_config()
  before = len(_threads())
  assert not role_watchdog.StepWatch.for_config(config, "").timeout_s
  config.mesh.layout = "disaggregated"
  config.buffer.sync_mode = "free"  # Watched by its own RoleWatch.
  assert not role_watchdog.StepWatch.for_config(config, "").timeout_s
  config.buffer.sync_mode = "fixed"
  watch = role_watchdog.StepWatch.for_config(config, "")
  assert watch.timeout_s == config.buffer.role_stall_timeout_s == 1800
  assert len(_threads()) == before + 1
  watch.close()
  watch._thread.join(timeout=5)  # pylint: disable=protected-access
  assert len(_threads()) == before
