"""Verifier fuzz: adversarial completions never hang, crash,
raise or leak processes.

Every adversarial completion is scored through `RewardPool` against records of
every verifier. Each call (one completion per worker) must return scores in
[0, 1] within the configured timeout plus one second; afterwards no child
process, sandboxed program or sandbox directory may be left, and no injection
attempt may have touched the file system.
"""

import json
import os
import random
import string
import tempfile
import time
import uuid

import numpy as np
import psutil
import pytest
import reasoning_gym

from configs import scalerl
from scalerl_jax import rewards
from scalerl_jax.data import builtin_task
from scalerl_jax.rewards.sandbox import client
from scalerl_jax.rewards.sandbox import isolation

_TIMEOUT_S = 1.0
_MB = 1 << 20
_MARK = os.path.join(tempfile.gettempdir(), f"scalerl_fuzz_{uuid.uuid4().hex}")


def _nested(depth, open_, close, inner="1"):
  return open_ * depth + inner + close * depth


def _text_cases():
  rng = random.Random(0)
  big_random = "".join(rng.choice(string.printable) for _ in range(_MB))
  digits = "9" * 100_000
  tower = "5^{5^{5^{5^5}}}"
  return [
      # Nothing, or not text at all.
      None,
      "",
      " ",
      12345,
      4.5,
      ["a list"],
      {"a": "dict"},
      b"\xc3\x28\xff\xfe Answer: 42",
      # Megabyte strings.
      "a" * _MB,
      "\\boxed{" * (_MB // 7),
      "{" * _MB,
      "}" * _MB,
      "\n" * _MB + "Answer: 42",
      "Answer: " + "9" * _MB,
      big_random,
      "```" * (_MB // 3),
      "<answer>" * (_MB // 8),
      "\\boxed{" + "a" * _MB + "}",
      # 10^5-digit numbers.
      f"\\boxed{{{digits}}}",
      f"Answer: {digits}",
      f"<answer>{digits}</answer>",
      f"\\boxed{{-{digits}.5}}",
      "\\boxed{1e100000}",
      "\\boxed{10^{100000}}",
      "\\boxed{" + "9" * 2000 + "}",
      "Answer: " + "1" * 4301,
      # Towers and other expressions that are cheap to write
      # and costly to evaluate.
      f"\\boxed{{{tower}}}",
      f"Answer: {tower}",
      f"<answer>{tower}</answer>",
      f"Answer: $${tower}$$",
      "\\boxed{9^{9^{9^{9}}}}",
      "\\boxed{9^{9^{9}}}",
      "\\boxed{2^{2^{2^{2^{2^{2}}}}}}",
      "\\boxed{(10^{10^{10}})!}",
      "\\boxed{100000!}",
      "\\boxed{\\sum_{k=1}^{10^{12}} k^{k}}",
      "\\boxed{\\prod_{k=1}^{10^{9}} k}",
      "\\boxed{\\int_0^\\infty e^{-x^{x}} dx}",
      "\\boxed{\\frac{d}{dx} x^{x^{x}}}",
      "\\boxed{\\lim_{x\\to 0}\\frac{\\sin x}{x}}",
      "\\boxed{" + "1+" * 1000 + "1}",
      "\\boxed{" + "1+" * 100_000 + "1}",
      "\\boxed{x^{" + _nested(2000, "x^{", "}") + "}}",
      # Deep nesting.
      *(
          "\\boxed{" + _nested(d, "\\frac{1}{", "}", "2") + "}"
          for d in (10, 100, 1000, 10_000)
      ),
      "\\boxed{" + _nested(500, "\\sqrt{", "}") + "}",
      "\\boxed{" + _nested(5000, "(", ")") + "}",
      "\\boxed{" + _nested(50_000, "{", "}") + "}",
      _nested(20_000, "\\boxed{", "}"),
      "\\boxed{\\begin{pmatrix}" + "1&" * 10_000 + "1\\end{pmatrix}}",
      # Unclosed and malformed.
      "\\boxed{",
      "\\boxed{42",
      "\\boxed{\\frac{1}{2}",
      "\\boxed",
      "\\boxed}",
      "<answer>42",
      "42</answer>",
      "Answer:",
      "\\boxed{\\left(}",
      "\\boxed{x=}",
      "\\boxed{\\frac{}{}}",
      "\\boxed{\\begin{array}}",
      "\\boxed{^_^}",
      "\\boxed{\\\\\\\\}",
      "\\boxed{$$$}",
      # Undefined or degenerate values.
      "\\boxed{\\infty}",
      "\\boxed{nan}",
      "\\boxed{\\frac{1}{0}}",
      "\\boxed{0^0}",
      "\\boxed{\\log(0)}",
      "\\boxed{\\sqrt{-1}}",
      "\\boxed{\\text{" + "a" * 1000 + "}}",
      # Invalid Unicode: lone surrogates, NULs, noncharacters,
      # direction overrides.
      "\ud800",
      "\\boxed{\udfff}",
      "Answer: \ud83d",
      "\x00" * 1000,
      "\\boxed{\x00}",
      "\ufffe\uffff",
      "\u202e\u202d \\boxed{42}",
      "a\u0301" * 10_000,
      "\U0010ffff" * 100,
      "\\boxed{4\u200d2}",
      "Answer: \udcff\udcfe",
      # Injection attempts: the verifiers must never evaluate them.
      f"Answer: __import__('os').system('touch {_MARK}')",
      f"\\boxed{{__import__('os').system('touch {_MARK}')}}",
      f"<answer>exec(\"open('{_MARK}', 'w')\")</answer>",
      "\\boxed{\\input{/etc/passwd}}",
      # Thinking markers: unbalanced, repeated, nested around an answer.
      "<think>" * (_MB // 7),
      "</think>" * (_MB // 8),
      "<think></think>" * (_MB // 15),
      "<think>" + "\\boxed{" * 100_000 + "</think>" + "}" * 100_000,
      "</think><think>" * 1000 + "Answer: 42",
      "<think> Answer: 42",
      # Plain answers, so that the batch is not all failures.
      "Answer: 42",
      "\\boxed{42}",
      "<answer>42</answer>",
  ]


def _program(source):
  return f"```python\n{source}\n```"


def _code_cases():
  return [
      _program(s)
      for s in (
          "while True: pass",
          "import time\ntime.sleep(10 ** 6)",
          "chunks = []\nwhile True: chunks.append(' ' * 10 ** 6)",
          "bytearray(10 ** 12)",
          "import os\nwhile True: os.fork()",
          "import subprocess\nsubprocess.Popen(['sleep', '1000'])",
          "import os\nos.system('sleep 1000 &')",
          "import multiprocessing\nmultiprocessing.Pool(4).map(abs, range(10))",
          "import threading, time\nfor _ in range(200):\n  threading.Thread(target=time.sleep, "
          "args=(1000,)).start()",
          "import sys\nsys.setrecursionlimit(10 ** 6)\ndef f(n): return f(n + 1)\nf(0)",
          "while True: print('x' * 10 ** 6)",
          "import sys\nwhile True: sys.stderr.write('e' * 10 ** 6)",
          "open('big', 'w').write('x' * 10 ** 9)",
          "import signal\nfor s in (signal.SIGTERM, signal.SIGXCPU, signal.SIGINT):\n"
          "  signal.signal(s, signal.SIG_IGN)\nwhile True: pass",
          "import os\nos.setsid()\nwhile True: pass",
          "print(open('/etc/passwd').read())",
          "import socket\nsocket.create_connection(('127.0.0.1', 22), timeout=1)",
          f"open({_MARK!r}, 'w').write('escaped')\nprint(6)",
          "import ctypes\nprint(6)",
          "import os\nos.close(1)\nos.close(0)",
          "exec(compile('while 1: pass', 'x', 'exec'))",
          "print(2 * int(input()) syntax error",
          "import sys\nsys.exit(0)",
          "x = 1\n" * 250_000 + "print(6)",
          "print('\ud800')",
          "print(6, flush=True)\nimport os\nos._exit(0)",
          "print(2 * int(input()))",
      )
  ]


def _records():
  builtin = builtin_task.builtin_prompts((2,), 1, 0, "train")[0]
  entry = reasoning_gym.create_dataset("basic_arithmetic", size=1, seed=0)[0]
  gym = {
      "id": "rg",
      "prompt": entry["question"],
      "answer": str(entry["answer"]),
      "source": "reasoning_gym",
      "verifier": "reasoning_gym:basic_arithmetic",
      "metadata": json.dumps(entry),
  }
  math = {
      "id": "m",
      "prompt": "?",
      "answer": "42",
      "source": "jsonl",
      "verifier": "math",
  }
  code = {
      "id": "c",
      "prompt": "double",
      "source": "jsonl",
      "verifier": "code",
      "answer": json.dumps({"inputs": ["3"], "outputs": ["6"]}),
  }
  return builtin, gym, math, code


def _live(processes):
  out = []
  for process in processes:
    try:
      if process.status() != psutil.STATUS_ZOMBIE:
        out.append(process)
    except psutil.NoSuchProcess:
      pass
  return out


def _sandboxed_programs(root):
  """Sandboxed programs (their temp dir is on the command line) under `root`."""
  return _live(
      p
      for p in psutil.process_iter(["cmdline"])
      if any(arg.startswith(str(root)) for arg in p.info["cmdline"] or [])
  )


@pytest.mark.needs_bwrap
def test_adversarial_completions(tmp_path, monkeypatch):
  # The workers inherit TMPDIR: their sandboxes live under tmp_path, where
  # leftovers can be told apart from other processes' on a shared machine.
  monkeypatch.setenv("TMPDIR", str(tmp_path))
  builtin, gym, math, code = _records()
  cases = [
      (text, record)
      for record in (math, builtin, gym)
      for text in _text_cases()
  ]
  cases += [(program, code) for program in _code_cases()]
  cases += [(text, code) for text in _text_cases()[:20]]
  cases += [(program, math) for program in _code_cases()[:5]]
  assert len(cases) >= 200
  config = scalerl.get_config()
  with config.unlocked():
    config.rewards.timeout_s = _TIMEOUT_S
    config.rewards.code_cpu_s = 1.0
    config.rewards.code_memory_mb = 256
  children_before = {p.pid for p in psutil.Process().children(recursive=True)}
  slowest, timeouts = 0.0, 0
  start = time.monotonic()
  with rewards.RewardPool(config.rewards) as pool:
    width = config.rewards.num_workers  # One completion per worker per call.
    for i in range(0, len(cases), width):
      chunk = cases[i : i + width]
      call_start = time.monotonic()
      scores, stats = pool.score([c for c, _ in chunk], [r for _, r in chunk])
      elapsed = time.monotonic() - call_start
      assert elapsed <= _TIMEOUT_S + 1.0, (
          elapsed,
          [repr(c)[:80] for c, _ in chunk],
      )
      assert scores.dtype == np.float32 and scores.shape == (len(chunk),)
      assert np.all((scores >= 0) & (scores <= 1)), scores
      slowest = max(slowest, stats["slowest_s"])
      timeouts += stats["num_timeouts"]
    # Plain correct answers still score 1, and programs ran in their sandbox:
    # under tmp_path, or inside bubblewrap's own tmpfs where it is used.
    root = (
        isolation.SANDBOX_ROOT
        if isolation.use_bwrap(config.rewards.code_isolation)
        else str(tmp_path)
    )
    in_root = _program(
        f"import os\nprint(6 if os.getcwd().startswith({root!r}) else 0)"
    )
    scores, _ = pool.score(
        ["Answer: 42", _program("print(2 * int(input()))"), in_root],
        [math, code, code],
    )
    np.testing.assert_array_equal(scores, [1.0, 1.0, 1.0])
  total = time.monotonic() - start
  print(
      f"fuzz: {len(cases)} completions, timeout {_TIMEOUT_S} s, slowest call "
      f"{slowest:.2f} s, {timeouts} timeouts, {total:.1f} s in all"
  )
  assert timeouts > 0  # The hard kill was exercised (infinite loops, towers).
  assert slowest <= _TIMEOUT_S + 1.0
  assert not _live(
      p
      for p in psutil.Process().children(recursive=True)
      if p.pid not in children_before
  )
  assert not _sandboxed_programs(tmp_path)
  assert not [
      d for d in os.listdir(tmp_path) if d.startswith(client.TEMP_PREFIX)
  ]
  assert not os.path.exists(_MARK)
