"""The killable worker pool in which every verifier runs.

`pool.RewardPool` scores completions in worker processes (`worker.py`) that
a fork server (`zygote.py`) forks and `processes.py` starts, replaces and
stops; `shared.py` splits the scoring over a multi-controller run's
processes. Design: docs/design/rewards.md.
"""
