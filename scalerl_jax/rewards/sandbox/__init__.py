"""The code sandbox: bubblewrap, seccomp, and a server that runs programs.

`client.Sandbox` starts `server.py` (standard library only) under bubblewrap
(`isolation.py`, `seccomp.py`); the server forks each program's process,
which `boot.py` confines and whose report it writes. The verifier that uses
it is rewards/code_sandbox.py. Design: docs/design/sandbox.md.
"""
