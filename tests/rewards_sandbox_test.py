"""Tests of the code sandbox: confinement, limits, and cleanup."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from scalerl_jax import rewards
from scalerl_jax.rewards import code_sandbox
from scalerl_jax.rewards import isolation
from scalerl_jax.rewards import registry


def _ctx(wall_s=10.0, cpu_s=2.0, memory_mb=512, spawned=None):
  # A fresh sandbox per program, whose process group and temporary directory
  # these tests follow; the fork server's runs are held to the same results
  # by test_the_fork_server_runs_a_program_as_a_fresh_sandbox_does.
  spawned = spawned if spawned is not None else []
  return registry.VerifyContext(
      deadline=time.monotonic() + wall_s,
      code_cpu_s=cpu_s,
      code_memory_mb=memory_mb,
      code_fork_server=False,
      on_spawn=lambda pgid, tmpdir: spawned.append((pgid, tmpdir)),
  )


def _run(source, **ctx_args):
  return code_sandbox.run_program(textwrap.dedent(source), "", _ctx(**ctx_args))


def _code_record(expected_output):
  return {
      "id": "c",
      "verifier": "code",
      "answer": json.dumps([{"input": "", "output": expected_output}]),
  }


def _as_completion(source):
  return f"```python\n{textwrap.dedent(source)}\n```"


@pytest.mark.parametrize(
    "attempt",
    [
        "open(TARGET, 'w').write('pwned')",
        "import os; os.close(os.open(TARGET, os.O_WRONLY | os.O_CREAT))",
        "import pathlib; pathlib.Path(TARGET).write_text('pwned')",
        "open('inside', 'w').close(); import os; os.rename('inside', TARGET)",
        "import os; os.symlink(TARGET, 'link'); open('link', 'w').write('pwned')",
        "import os; os.mkdir(TARGET)",
        "import shutil; open('inside', 'w').close(); shutil.copy('inside', TARGET)",
    ],
)
def test_writing_outside_the_temp_dir_fails_and_scores_zero(tmp_path, attempt):
  target = str(tmp_path / "escaped")
  # The program catches the error and prints the expected output anyway: the
  # sandbox must still stop it at the attempt.
  source = f"TARGET = {target!r}\ntry:\n  {attempt}\nexcept Exception:\n  pass\nprint('done')\n"
  result = code_sandbox.run_program(source, "", _ctx())
  assert result.violation and not result.ok
  assert not os.path.exists(target)
  assert (
      rewards.verify(_as_completion(source), _code_record("done"), "code")
      == 0.0
  )
  assert not os.path.exists(target)


def test_existing_files_outside_cannot_be_removed(tmp_path):
  victim = tmp_path / "keep.txt"
  victim.write_text("data")
  result = _run(f"import os; os.remove({str(victim)!r})")
  assert result.violation
  assert victim.read_text() == "data"


@pytest.mark.parametrize(
    "attempt",
    [
        "import socket; socket.socket()",
        "import socket; socket.create_connection(('127.0.0.1', 9), timeout=1)",
        "import socket; socket.getaddrinfo('example.com', 80)",
        "import urllib.request; urllib.request.urlopen('http://127.0.0.1:9', timeout=1)",
    ],
)
def test_opening_a_socket_fails_and_scores_zero(attempt):
  source = f"try:\n  {attempt}\nexcept Exception:\n  pass\nprint('done')\n"
  result = code_sandbox.run_program(source, "", _ctx())
  assert result.violation and not result.ok
  assert (
      rewards.verify(_as_completion(source), _code_record("done"), "code")
      == 0.0
  )


@pytest.mark.parametrize(
    "attempt",
    [
        "import os; os.fork()",
        "import subprocess; subprocess.run(['sleep', '60'])",
        "import os; os.system('sleep 60 &')",
        "import multiprocessing as mp; mp.Process(target=print).start()",
        "import os; os.kill(os.getppid(), 0)",
        "import ctypes",
    ],
)
def test_process_creation_signals_and_native_code_are_blocked(attempt):
  spawned = []
  result = code_sandbox.run_program(attempt, "", _ctx(spawned=spawned))
  assert result.violation
  ((pgid, _),) = spawned
  assert not [p for p in psutil.process_iter(["pid"]) if _in_group(p, pgid)]


def _in_group(process, pgid):
  try:
    return os.getpgid(process.pid) == pgid
  except (ProcessLookupError, psutil.NoSuchProcess):
    return False


def test_writes_inside_the_temp_dir_work_and_the_dir_is_removed():
  spawned = []
  result = code_sandbox.run_program(
      "import tempfile, os\n"
      "open('a.txt', 'w').write('x' * 10)\n"
      "with tempfile.NamedTemporaryFile(dir='.') as f: f.write(b'y')\n"
      "os.mkdir('d'); os.rename('a.txt', 'd/b.txt')\n"
      "print(open('d/b.txt').read(), os.getcwd() == os.environ['HOME'])\n",
      "",
      _ctx(spawned=spawned),
  )
  assert result.ok, result
  assert result.stdout == b"xxxxxxxxxx True\n"
  ((_, tmpdir),) = spawned
  assert os.path.basename(tmpdir).startswith(code_sandbox.TEMP_PREFIX)
  assert not os.path.exists(tmpdir)


def test_cpu_limit_kills_a_busy_loop():
  start = time.monotonic()
  result = _run("while True: pass", cpu_s=1.0, wall_s=30.0)
  assert not result.timed_out  # The CPU limit, not the wall clock, stopped it.
  assert result.returncode in (-signal.SIGXCPU, -signal.SIGKILL)
  assert time.monotonic() - start < 15.0


@pytest.mark.parametrize(
    "source",
    [
        "x = bytearray(10 ** 10)",
        "chunks = []\nwhile True: chunks.append(bytearray(10 ** 7))",
    ],
)
def test_memory_limit_stops_allocation(source):
  result = _run(source, memory_mb=256, wall_s=30.0)
  # MemoryError, not a hang.
  assert result.returncode == 1 and not result.timed_out


def test_wall_clock_deadline_kills_a_sleeper_and_its_group():
  spawned = []
  start = time.monotonic()
  result = code_sandbox.run_program(
      "import time\ntime.sleep(60)", "", _ctx(wall_s=1.0, spawned=spawned)
  )
  assert result.timed_out and result.returncode == -signal.SIGKILL
  assert time.monotonic() - start < 5.0
  ((pgid, tmpdir),) = spawned
  assert not [p for p in psutil.process_iter(["pid"]) if _in_group(p, pgid)]
  assert not os.path.exists(tmpdir)


def test_output_is_capped():
  result = _run("while True: print('x' * 65536)", wall_s=20.0)
  assert not result.ok
  assert len(result.stdout) <= code_sandbox.MAX_OUTPUT_BYTES


def test_stdin_reaches_the_program():
  result = code_sandbox.run_program(
      "import sys\nprint(sys.stdin.read()[::-1])", "abc", _ctx()
  )
  assert result.ok and result.stdout == b"cba\n"


def test_wait_reaps_an_exited_process_and_leaves_a_running_one():
  # `_wait` watches a pidfd instead of polling: an exited process is reaped
  # (returncode set) and a running one is still running when it times out.
  quick = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
  assert code_sandbox._wait(quick, 10.0)
  assert quick.returncode == 3
  slow = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
  try:
    assert not code_sandbox._wait(slow, 0.2)
    assert slow.poll() is None
  finally:
    slow.kill()
    slow.wait()


_NO_BWRAP = "bubblewrap does not run here (apt-get install bubblewrap)"
_PROGRAMS = {
    "prints": ("print(sum(range(10)))", ""),
    "echoes_stdin": ("print(input()[::-1])", "hello\n"),
    "exits_3": ("import sys\nprint('a')\nsys.exit(3)", ""),
    "exits_with_message": ("import sys\nsys.exit('bye')", ""),
    "raises": ("print('x')\nraise ValueError('boom')", ""),
    "violates_the_hook": ("import os\nos.system('true')", ""),
    "forks": ("import os\nos.fork()", ""),
    "imports_ctypes": ("import ctypes", ""),
    "signals_its_parent": ("import os\nos.kill(os.getppid(), 9)", ""),
    "writes_outside": ("open('/sandbox_escape', 'w')", ""),
    "exhausts_memory": ("x = bytearray(10 ** 10)", ""),
}


# Run in a process of their own: in a pytest-xdist worker the in-process
# fork server did not answer (seen under `-n 2`, not understood; the reward
# workers, which are plain processes, are unaffected).
_RUN_BOTH = """
import json, sys, time
from scalerl_jax.rewards import code_sandbox, registry
out = []
for source, stdin in json.loads(sys.argv[1]):
  pair = []
  for fork_server in (True, False):
    ctx = registry.VerifyContext(
        deadline=time.monotonic() + 10.0, code_cpu_s=1.0, code_memory_mb=256,
        code_isolation="bwrap", code_fork_server=fork_server)
    r = code_sandbox.run_program(source, stdin, ctx)
    pair.append([r.returncode, r.stdout.decode("latin-1"), r.timed_out])
  out.append(pair)
print(json.dumps(out))
"""


def test_the_fork_server_runs_a_program_as_a_fresh_sandbox_does():
  # The same program under the same limits gives the same exit status,
  # output and deadline verdict as a fork of the warm sandboxed interpreter
  # as it does as a fresh bubblewrap sandbox and interpreter.
  if not isolation.bwrap_works()[0]:
    pytest.skip(_NO_BWRAP)
  names = sorted(_PROGRAMS)
  done = subprocess.run(
      [
          sys.executable,
          "-c",
          _RUN_BOTH,
          json.dumps([_PROGRAMS[n] for n in names]),
      ],
      capture_output=True,
      text=True,
      timeout=300,
      check=True,
      cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
  )
  for name, (fork, fresh) in zip(names, json.loads(done.stdout)):
    assert fork == fresh, name


_LEAVE_AND_LOOK = """
import sys, time
from scalerl_jax.rewards import code_sandbox, registry
ctx = lambda: registry.VerifyContext(
    deadline=time.monotonic() + 10.0, code_isolation="bwrap",
    code_fork_server=True)
first = code_sandbox.run_program(sys.argv[1], "", ctx())
server = code_sandbox._server.proc.pid
second = code_sandbox.run_program(sys.argv[2], "", ctx())
print(first.ok, first.stdout == b"started\\n", code_sandbox._server.proc.pid == server)
print(second.ok, second.stdout.decode().strip())
"""


def test_the_fork_server_leaves_nothing_of_one_program_to_the_next():
  # The first program escapes the audit hook to start a process that would
  # outlive it and leaves a file; the second, in the same sandbox, finds
  # neither (the program's PID namespace dies with it, and the server
  # empties the sandbox after each run).
  if not isolation.bwrap_works()[0]:
    pytest.skip(_NO_BWRAP)
  leave = textwrap.dedent("""
      import _posixsubprocess, os
      r, w = os.pipe()
      _posixsubprocess.fork_exec(
          ['/bin/sleep', '30'], [b'/bin/sleep'], True, (), None, None,
          -1, -1, -1, -1, -1, -1, r, w, True, False, -1, None, None, None,
          -1, None, False)
      open('left_behind', 'w').write('x')
      print('started')
  """)
  look = textwrap.dedent("""
      import os
      sleepers = 0
      for p in os.listdir('/proc'):
        try:
          sleepers += p.isdigit() and b'sleep' in open(
              f'/proc/{p}/cmdline', 'rb').read()
        except OSError:
          pass
      mine = os.path.basename(os.getcwd())
      print(sleepers, sorted(set(os.listdir('..')) - {mine}))
  """)
  done = subprocess.run(
      [sys.executable, "-c", _LEAVE_AND_LOOK, leave, look],
      capture_output=True,
      text=True,
      timeout=120,
      check=True,
      cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
  )
  first, second = done.stdout.splitlines()
  assert first == "True True True"  # Ran, and the same sandbox served both.
  assert second == "True 0 ['sandbox_boot.py', 'server.py']"
