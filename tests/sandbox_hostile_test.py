"""Hostile programs through the real verifier path
(RewardPool -> worker -> sandbox).

Each program prints PWNED only if its attack worked, and its record expects
exactly PWNED: a score of 1 is a breach. Every program must score 0 (or be
killed), the pool must go on scoring, and nothing outside the sandbox's
temporary directory may change. Each runs once per layer: under bubblewrap
(`code_isolation='bwrap'`, skipped with the reason when it does not run here)
and, for the attacks the audit hook stops by itself, under the Python layer
alone. docs/reliability.md tabulates which layer stops which.
"""

import hashlib
import json
import os
import re
import socket
import textwrap
import threading

import pytest

from configs import scalerl
from scalerl_jax import rewards
from scalerl_jax.rewards.sandbox import isolation

# In the trainer's environment, which a program must not read.
_CANARY = "SCALERL_CANARY_7f3a"
_SHELL = "/bin/sh"

# name -> (program, needs the lower layer). Placeholders: TARGET (a path
# outside the sandbox), WORKDIR (a run's workdir, with a secret and a
# checkpoint), PORT (a listening TCP server on 127.0.0.1).
_FORK_EXEC = """
import _posixsubprocess, os
def run(*argv):
  r, w = os.pipe()
  return _posixsubprocess.fork_exec(
      list(argv), [argv[0].encode()], True, (), None, None, -1, -1, -1, -1, -1, -1, r, w,
      True, False, -1, None, None, None, -1, None, False)
"""
HOSTILE = {
    "fork_bomb": ("import os\nwhile True:\n  os.fork()\nprint('PWNED')", False),
    "fork_bomb_below_the_hook": (
        _FORK_EXEC + textwrap.dedent("""
        n = 0
        for _ in range(200):
          try:
            run('/bin/sleep', '30'); n += 1
          except OSError:
            pass
        print('PWNED' if n > 50 else n)"""),
        True,
    ),
    "memory_bomb": ("x = bytearray(10 ** 10)\nprint('PWNED')", False),
    "memory_creep": (
        "a = []\nwhile True:\n  a.append(bytearray(10 ** 7))",
        False,
    ),
    "infinite_loop": ("print('PWNED', flush=True)\nwhile True:\n  pass", False),
    "sleep_forever": (
        "print('PWNED', flush=True)\nimport time\ntime.sleep(10 ** 6)",
        False,
    ),
    "output_flood": ("while True:\n  print('PWNED' * 1000)", False),
    "thread_bomb": (
        textwrap.dedent("""
        import threading, time
        for _ in range(5000):
          threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
        print('PWNED')"""),
        False,
    ),
    "fd_exhaustion": (
        "fs = [open(f'f{i}', 'w') for i in range(5000)]\nprint('PWNED')",
        False,
    ),
    "write_outside_tmp": (
        "open(TARGET, 'w').write('x')\nprint('PWNED')",
        False,
    ),
    "delete_the_workdir": (
        "import shutil\nshutil.rmtree(WORKDIR)\nprint('PWNED')",
        False,
    ),
    "mkfifo_outside_tmp": (
        "import os\nos.mkfifo(TARGET)\nprint('PWNED')",
        True,
    ),
    "shell_writes_outside_tmp": (
        _FORK_EXEC + textwrap.dedent(f"""
        import time
        run({_SHELL!r}, '-c', 'echo x > ' + TARGET)
        time.sleep(0.5)
        print('PWNED' if os.path.exists(TARGET) else 'no')"""),
        True,
    ),
    "disk_fill_in_tmp": (
        textwrap.dedent("""
        for i in range(25):
          with open(f'fill{i}', 'wb') as f:
            f.write(b'x' * (6 << 20))
        print('PWNED')"""),
        True,
    ),
    "read_the_workdir": (
        "print('PWNED' if 'SECRET' in open(WORKDIR + '/secret.txt').read() else 'no')",
        True,
    ),
    "read_a_checkpoint": (
        textwrap.dedent(
            """
        import os
        d = WORKDIR + '/checkpoints/10'
        print('PWNED' if [open(d + '/' + n, 'rb').read() for n in os.listdir(d)] else 'no')"""
        ),
        True,
    ),
    "read_the_parents_environment": (
        textwrap.dedent(f"""
        import os
        env = open(f'/proc/{{os.getppid()}}/environ', 'rb').read()
        print('PWNED' if b{_CANARY!r} in env else 'no')"""),
        True,
    ),
    "socket_connect": (
        textwrap.dedent("""
        import socket
        socket.create_connection(('127.0.0.1', PORT), timeout=2).close()
        print('PWNED')"""),
        False,
    ),
    "raw_socket_module": (
        textwrap.dedent("""
        import _socket
        s = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
        s.connect(('127.0.0.1', PORT))
        print('PWNED')"""),
        False,
    ),
    "ctypes_raw_syscall": (
        textwrap.dedent("""
        import ctypes, os
        libc = ctypes.CDLL(None)
        libc.syscall(62, os.getppid(), 9)  # kill(parent, SIGKILL) on x86-64.
        print('PWNED')"""),
        False,
    ),
    "os_system": (
        "import os\nos.system('touch ' + TARGET)\nprint('PWNED')",
        False,
    ),
    "subprocess_run": (
        "import subprocess\nsubprocess.run(['touch', TARGET])\nprint('PWNED')",
        False,
    ),
    "kill_the_parent": (
        "import os\nos.kill(os.getppid(), 9)\nprint('PWNED')",
        False,
    ),
    "pidfd_kill_the_parent": (
        textwrap.dedent("""
        import os, signal
        signal.pidfd_send_signal(os.pidfd_open(os.getppid()), signal.SIGKILL)
        print('PWNED')"""),
        True,
    ),
    "raise_rlimits": (
        textwrap.dedent("""
        import resource
        inf = resource.RLIM_INFINITY
        resource.setrlimit(resource.RLIMIT_AS, (inf, inf))
        print('PWNED')"""),
        False,
    ),
    "write_proc_self_mem": (
        "f = open('/proc/self/mem', 'wb')\nprint('PWNED')",
        False,
    ),
    "write_to_inherited_fds": (
        textwrap.dedent("""
        import os
        n = 0
        for fd in range(3, 256):
          try:
            os.write(fd, b'x'); n += 1
          except OSError:
            pass
        print('PWNED' if n else 'no')"""),
        False,
    ),
    "overwrite_the_verifier": (
        "open(VERIFIER, 'a').write('\\nraise SystemExit')\nprint('PWNED')",
        False,
    ),
}


def _layers():
  for name, (_, needs_lower) in HOSTILE.items():
    bwrap = pytest.mark.needs_bwrap
    yield pytest.param(name, "bwrap", id=f"{name}-bwrap", marks=bwrap)
    yield pytest.param(
        name, "bwrap_fork_server", id=f"{name}-fork_server", marks=bwrap
    )
    if not needs_lower:  # The others would breach: docs/reliability.md.
      yield pytest.param(name, "python", id=f"{name}-python")


class _Server:
  """A TCP server on 127.0.0.1 that counts connections."""

  def __init__(self):
    self.sock = socket.create_server(("127.0.0.1", 0))
    self.port = self.sock.getsockname()[1]
    self.connections = 0
    threading.Thread(target=self._serve, daemon=True).start()

  def _serve(self):
    while True:
      try:
        conn, _ = self.sock.accept()
      except OSError:
        return
      self.connections += 1
      conn.close()


def _snapshot(root):
  """{path: sha256} of every file under `root`."""
  out = {}
  for dirpath, _, files in os.walk(root):
    for name in files:
      path = os.path.join(dirpath, name)
      with open(path, "rb") as f:
        out[path] = hashlib.sha256(f.read()).hexdigest()
  return out


@pytest.fixture(scope="module")
def world(tmp_path_factory):
  """A fake run's workdir, a TMPDIR for the sandboxes,
  a server, the canary env var."""
  workdir = tmp_path_factory.mktemp("workdir")
  (workdir / "secret.txt").write_text("SECRET")
  (workdir / "checkpoints" / "10").mkdir(parents=True)
  (workdir / "checkpoints" / "10" / "params").write_bytes(b"weights")
  sandboxes = tmp_path_factory.mktemp("sandboxes")
  server = _Server()
  with pytest.MonkeyPatch.context() as patch:
    patch.setenv("TMPDIR", str(sandboxes))
    patch.setenv(_CANARY, "1")
    yield {
        "workdir": workdir,
        "sandboxes": sandboxes,
        "server": server,
        "outside": tmp_path_factory.mktemp("outside"),
    }
  server.sock.close()


@pytest.fixture(scope="module")
def pools(world):
  del world  # Its environment reaches the pools' processes.
  opened = {}
  yield lambda layer: opened.get(layer) or opened.setdefault(
      layer, _pool(layer)
  )
  for pool in opened.values():
    pool.close()


def _pool(layer):
  config = scalerl.get_config()
  with config.unlocked():
    config.rewards.update(
        timeout_s=3.0,
        num_workers=1,
        code_cpu_s=1.0,
        code_memory_mb=256,
        code_isolation="bwrap" if layer.startswith("bwrap") else layer,
        code_fork_server=layer == "bwrap_fork_server",
    )
  return rewards.RewardPool(config.rewards)


def _record(tests_output):
  return {
      "id": "hostile",
      "verifier": "code",
      "answer": json.dumps([{"input": "", "output": tests_output}]),
  }


def _completion(source):
  return f"<think>x</think>```python\n{source}\n```"


@pytest.mark.parametrize("name,layer", list(_layers()))
def test_hostile_program_scores_zero_and_changes_nothing_outside(
    world, pools, name, layer
):
  target = world["outside"] / f"{name}-{layer}"
  source = HOSTILE[name][0]
  for placeholder, value in (
      ("TARGET", repr(str(target))),
      ("WORKDIR", repr(str(world["workdir"]))),
      ("PORT", str(world["server"].port)),
      ("VERIFIER", repr(rewards.code_sandbox.__file__)),
  ):
    source = source.replace(placeholder, value)
  before = _snapshot(world["workdir"])
  verifier_before = _snapshot(os.path.dirname(rewards.code_sandbox.__file__))
  connections = world["server"].connections
  pool = pools(layer)
  scores, _ = pool.score([_completion(source)], [_record("PWNED")])
  assert scores.tolist() == [0.0]
  assert not target.exists()
  assert _snapshot(world["workdir"]) == before
  assert (
      _snapshot(os.path.dirname(rewards.code_sandbox.__file__))
      == verifier_before
  )
  assert world["server"].connections == connections
  # Every sandbox's directory is gone.
  assert not os.listdir(world["sandboxes"])
  # The run goes on: the same pool scores an honest program.
  scores, _ = pool.score([_completion("print(6 * 7)")], [_record("42")])
  assert scores.tolist() == [1.0]


@pytest.mark.parametrize("mode", ["auto", "bwrap"])
def test_without_bubblewrap_a_run_that_scores_code_stops_at_start_up(
    monkeypatch, mode
):
  monkeypatch.setattr(
      isolation, "bwrap_works", lambda: (False, "bwrap is not installed")
  )
  config = scalerl.get_config()
  install = re.escape("install it (apt-get install bubblewrap)")
  with config.unlocked():
    config.rewards.code_isolation = mode
    config.data.source = "builtin_code"
  assert isolation.config_scores_code(config)
  with pytest.raises(RuntimeError, match=f"'{mode}': bwrap is not .*{install}"):
    isolation.check(mode, isolation.config_scores_code(config))
  # A run that scores no code starts under `auto`; `bwrap` is required.
  config.data.source = "builtin"
  assert not isolation.config_scores_code(config)
  if mode == "auto":
    isolation.check(mode, isolation.config_scores_code(config))
  # Code records reaching the pool stop the run, never scored outside.
  config.rewards.update(num_workers=1, code_isolation=mode)
  if mode == "bwrap":
    with pytest.raises(RuntimeError, match=install):
      rewards.RewardPool(config.rewards)
    return
  with rewards.RewardPool(config.rewards) as pool:
    with pytest.raises(RuntimeError, match=install):
      pool.score([_completion("print(42)")], [_record("42")])


def test_python_isolation_is_explicit_and_says_it_is_no_boundary(monkeypatch):
  monkeypatch.setattr(
      isolation, "bwrap_works", lambda: (False, "bwrap is not installed")
  )
  warnings = []
  monkeypatch.setattr(
      isolation.logging,
      "warning",
      lambda msg, *args: warnings.append(msg % args),
  )
  isolation._warn_no_boundary.cache_clear()
  assert not isolation.use_bwrap("python")
  assert len(warnings) == 1 and "no security boundary" in warnings[0]
  assert rewards.verify(
      _completion("print(6 * 7)"),
      _record("42"),
      "code",
      rewards.VerifyContext(code_isolation="python"),
  )
