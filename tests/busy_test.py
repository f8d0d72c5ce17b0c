"""metrics/busy.py: a role's busy seconds, the union of its programs'
[dispatch, ready] intervals within a step's window."""

import threading
import time

import jax
import jax.numpy as jnp
import pytest

from scalerl_jax.metrics import busy


def test_the_window_counts_overlapping_programs_once():
  clock = busy.BusyClock("generator")
  for span in [(0.0, 2.0), (1.0, 3.0), (5.0, 6.0), (0.5, 1.5)]:
    clock.span(*span)
  # [1, 3] and [5, 5.5] of the union [0, 3] u [5, 6].
  assert clock.window(1.0, 5.5) == pytest.approx(2.5)
  # (5, 6) ended after the window: its last half is the next one's.
  assert clock.window(5.5, 10.0) == pytest.approx(0.5)
  assert clock.window(0.0, 10.0) == 0.0
  clock.close()


def test_a_watched_program_counts_from_dispatch_until_ready():
  clock = busy.BusyClock("trainer")
  x = jnp.ones((256, 256))
  t0 = time.perf_counter()
  out = jax.jit(lambda a: a @ a)(x)
  clock.watch(out, t0)
  jax.block_until_ready(out)
  seen = time.perf_counter()
  # Ready by `seen`: counted from t0, no later, and no earlier than t0.
  assert 0 < clock.window(t0 - 1.0, seen + 1.0) <= seen - t0 + 0.5
  clock.close()


def test_close_stops_the_clocks_thread():
  clock = busy.BusyClock("generator")
  clock.watch(jnp.zeros(()))
  threads = {t.name for t in threading.enumerate()}
  assert "busy-clock-generator" in threads
  clock.close()
  assert "busy-clock-generator" not in {t.name for t in threading.enumerate()}


def test_idle_is_the_rest_of_the_wall_time():
  row = busy.scalars({"generator": 3.0, "trainer": 1.0}, 4.0)
  assert row == {
      "time/generator_busy_s": 3.0,
      "time/generator_idle_s": 1.0,
      "time/generator_idle_frac": 0.25,
      "time/trainer_busy_s": 1.0,
      "time/trainer_idle_s": 3.0,
      "time/trainer_idle_frac": 0.75,
  }


def test_a_program_still_running_counts_until_the_windows_end():
  clock = busy.BusyClock("generator")
  release = threading.Event()

  class Slow:
    """A watched 'array' that is ready once released."""

    def is_ready(self):
      return release.is_set()

    def block_until_ready(self):
      release.wait()
      return self

  clock.watch(Slow(), t0=10.0)
  # Not ready: busy from its dispatch to the window's end, without waiting.
  assert clock.window(9.0, 12.0) == pytest.approx(2.0)
  release.set()
  clock.close()
