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
from scalerl_jax.rewards import registry
from scalerl_jax.rewards.sandbox import boot
from scalerl_jax.rewards.sandbox import client
from scalerl_jax.rewards.sandbox import isolation


def _ctx(wall_s=10.0, cpu_s=2.0, memory_mb=512, spawned=None, isolation="auto"):
  # A fresh sandbox per program, whose process group (and temporary
  # directory, without bubblewrap) these tests follow; the fork server's runs
  # are held to the same results by
  # test_the_fork_server_runs_a_program_as_a_fresh_sandbox_does.
  spawned = spawned if spawned is not None else []
  return registry.VerifyContext(
      deadline=time.monotonic() + wall_s,
      code_cpu_s=cpu_s,
      code_memory_mb=memory_mb,
      code_isolation=isolation,
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
@pytest.mark.needs_bwrap
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


@pytest.mark.needs_bwrap
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
@pytest.mark.needs_bwrap
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
@pytest.mark.needs_bwrap
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


@pytest.mark.parametrize(
    "isolation", [pytest.param("auto", marks=pytest.mark.needs_bwrap), "python"]
)
def test_writes_inside_the_temp_dir_work_and_the_dir_is_removed(isolation):
  spawned = []
  result = code_sandbox.run_program(
      "import tempfile, os\n"
      "open('a.txt', 'w').write('x' * 10)\n"
      "with tempfile.NamedTemporaryFile(dir='.') as f: f.write(b'y')\n"
      "os.mkdir('d'); os.rename('a.txt', 'd/b.txt')\n"
      "print(open('d/b.txt').read(), os.getcwd() == os.environ['HOME'])\n",
      "",
      _ctx(spawned=spawned, isolation=isolation),
  )
  assert result.ok, result
  assert result.stdout == b"xxxxxxxxxx True\n"
  ((_, tmpdir),) = spawned
  if isolation == "python":  # Under bubblewrap nothing is written outside.
    assert os.path.basename(tmpdir).startswith(client.TEMP_PREFIX)
  assert not os.path.exists(tmpdir)


@pytest.mark.needs_bwrap
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
@pytest.mark.needs_bwrap
def test_memory_limit_stops_allocation(source):
  result = _run(source, memory_mb=256, wall_s=30.0)
  # MemoryError, not a hang.
  assert result.returncode == 1 and not result.timed_out


@pytest.mark.needs_bwrap
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


@pytest.mark.needs_bwrap
def test_output_is_capped():
  result = _run("while True: print('x' * 65536)", wall_s=20.0)
  assert not result.ok
  assert len(result.stdout) <= boot.MAX_OUTPUT_BYTES


@pytest.mark.needs_bwrap
def test_stdin_reaches_the_program():
  result = code_sandbox.run_program(
      "import sys\nprint(sys.stdin.read()[::-1])", "abc", _ctx()
  )
  assert result.ok and result.stdout == b"cba\n"


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


@pytest.mark.needs_bwrap
def test_the_fork_server_runs_a_program_as_a_fresh_sandbox_does():
  # The same program under the same limits gives the same exit status,
  # output and deadline verdict as a fork of the warm sandboxed interpreter
  # as it does as a fresh bubblewrap sandbox and interpreter.
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


# The audit hook is a guard, not the boundary: these programs switch it off
# (it reports through a module global) to test what lies beneath.
_NO_HOOK = "import boot\nboot._violation = lambda event: None\n"
_LEAVE_AND_LOOK = """
import json, sys, time
from scalerl_jax.rewards import code_sandbox, registry
ctx = lambda: registry.VerifyContext(
    deadline=time.monotonic() + 10.0, code_isolation="bwrap",
    code_fork_server=True)
first = code_sandbox.run_program(sys.argv[1], "", ctx())
server = code_sandbox._server.proc.pid
sleeper = first.stdout.decode().split()[0]
second = code_sandbox.run_program(sys.argv[2].replace("SLEEPER", sleeper), "", ctx())
print(json.dumps([first.stdout.decode(), code_sandbox._server.proc.pid == server,
                  second.stdout.decode()]))
"""


@pytest.mark.needs_bwrap
def test_the_fork_server_leaves_nothing_of_one_program_to_the_next():
  # The first program, its audit hook off, starts a process below the hook
  # that would outlive it, leaves files everywhere it can and locks a
  # directory against its removal; the second, in the same sandbox, finds
  # no other process and no file (the server sweeps the namespace and
  # empties the tmpfs after each run; everything else is read-only).
  leave = _NO_HOOK + textwrap.dedent("""
      import _posixsubprocess, os
      r, w = os.pipe()
      pid = _posixsubprocess.fork_exec(
          ['/bin/sleep', '30'], [b'/bin/sleep'], True, (), None, None,
          -1, -1, -1, -1, -1, -1, r, w, True, False, -1, None, None, None,
          -1, None, False)
      written = []
      for path in ('left', '../left', '/left', '/dev/left', '/dev/shm/left',
                   '/tmp/left', '/usr/left'):
        try:
          open(path, 'w').write('x')
          written.append(path)
        except OSError:
          pass
      os.makedirs('../locked/inner')
      open('../locked/inner/f', 'w').write('x')
      os.chmod('../locked/inner', 0)
      os.chmod('../locked', 0)
      print(pid, written)
  """)
  look = _NO_HOOK + textwrap.dedent("""
      import os
      try:
        os.kill(SLEEPER, 0)
        others = True
      except ProcessLookupError:
        others = False
      mine = os.path.basename(os.getcwd())
      print(others, sorted(set(os.listdir('..')) - {mine}),
            [p for p in ('/left', '/dev/left', '/dev/shm/left')
             if os.path.exists(p)])
  """)
  done = subprocess.run(
      [sys.executable, "-c", _LEAVE_AND_LOOK, leave, look],
      capture_output=True,
      text=True,
      timeout=120,
      check=True,
      cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
  )
  first, same_server, second = json.loads(done.stdout)
  # Only its own directory and the sandbox's tmpfs took a file.
  assert first.split(maxsplit=1)[1] == "['left', '../left']\n"
  assert same_server
  assert second == "False ['boot.py', 'server.py'] []\n"


_CONFINEMENT = _NO_HOOK + textwrap.dedent("""
    import ctypes, gc, os, sys
    libc = ctypes.CDLL(None, use_errno=True)
    found = {}
    found['proc'] = os.path.exists('/proc/self')
    # ptrace(PTRACE_ATTACH, 1), shmget(IPC_PRIVATE, 4096, IPC_CREAT | 0600),
    # add_key: denied by the seccomp filter.
    found['ptrace'] = libc.ptrace(16, 1, 0, 0) == 0
    found['shmget'] = libc.shmget(0, 4096, 0o1600) >= 0
    found['add_key'] = libc.syscall(248, b'user', b'k', b'v', 1, -3) >= 0
    try:
      with open('big', 'wb') as f:
        for _ in range(100):
          f.write(b'x' * (1 << 20))
      found['wrote_100_mib'] = True
    except OSError:
      found['wrote_100_mib'] = False
    print(sorted(k for k, v in found.items() if v))
""")


@pytest.mark.parametrize("fork_server", [False, True])
@pytest.mark.needs_bwrap
def test_below_the_hook_the_sandbox_denies_proc_ptrace_ipc_and_disk(
    fork_server,
):
  ctx = registry.VerifyContext(
      deadline=time.monotonic() + 20.0,
      code_memory_mb=1024,
      code_isolation="bwrap",
      code_fork_server=fork_server,
  )
  try:
    result = code_sandbox.run_program(_CONFINEMENT, "", ctx)
  finally:
    code_sandbox.stop_server()
  assert result.stdout == b"[]\n", result


_HANDLES = textwrap.dedent("""
    import gc, sys
    print(sorted(m for m in sys.modules if 'ctypes' in m),
          sorted({type(o).__name__ for o in gc.get_objects()
                  if 'ctypes' in type(type(o)).__module__
                  or 'ctypes' in type(o).__module__}))
""")


@pytest.mark.needs_bwrap
def test_the_fork_server_leaves_the_program_no_handle_of_its_own():
  # A forked program starts from the server's memory: the server must hold
  # no ctypes module or object a program could call through.
  ctx = registry.VerifyContext(
      deadline=time.monotonic() + 10.0,
      code_isolation="bwrap",
      code_fork_server=True,
  )
  try:
    result = code_sandbox.run_program(_HANDLES, "", ctx)
  finally:
    code_sandbox.stop_server()
  assert result.stdout == b"[] []\n", result


@pytest.mark.needs_bwrap
def test_a_fork_flood_below_the_hook_meets_the_pids_ceiling():
  # Below the audit hook, root ignores RLIMIT_NPROC: the sandbox's pids
  # cgroup is the bound, refusing the fork once MAX_TASKS tasks exist (bwrap
  # and the server's runner among them), long before the deadline.
  parent, why = isolation.pids_cgroup_parent()
  if parent is None:
    pytest.skip(f"no pids cgroup can be made here: {why}")
  result = _run(
      _NO_HOOK + textwrap.dedent("""
      import _posixsubprocess, os
      held = 0
      try:
        while True:
          r, w = os.pipe()
          _posixsubprocess.fork_exec(
              ['/bin/sleep', '60'], [b'/bin/sleep'], True, (), None, None,
              -1, -1, -1, -1, -1, -1, r, w, True, False, -1, None, None, None,
              -1, None, False)
          os.close(r)
          os.close(w)
          held += 1
      except BlockingIOError:
        print(held)
      """),
      isolation="bwrap",
  )
  assert not result.timed_out
  held = int(result.stdout)
  assert 0 < held < isolation.MAX_TASKS
  assert not os.listdir(parent) or not any(
      name.startswith(f"scalerl_sandbox_{os.getpid()}_")
      for name in os.listdir(parent)
  )
