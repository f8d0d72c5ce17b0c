"""Verifiable rewards: verifiers registered by name, run in a killable pool.

- `registry`: the registry, `VerifyContext`, `resolve_spec` and in-process
  `verify`.
- `extract`: final-answer and code-block extraction.
- `math_answer` (`math`), `task` (`builtin`, `reasoning_gym:<name>`) and
  `code_sandbox` (`code`): the verifiers; importing this package registers
  them. Their heavy dependencies are imported lazily.
- `pool.RewardPool`: worker processes with a per-call timeout and hard kill;
  what the trainer uses.
"""

from scalerl_jax.rewards import code_sandbox
from scalerl_jax.rewards import math_answer
from scalerl_jax.rewards import task
from scalerl_jax.rewards.pool import RewardPool
from scalerl_jax.rewards.registry import register_verifier
from scalerl_jax.rewards.registry import resolve_spec
from scalerl_jax.rewards.registry import verify
from scalerl_jax.rewards.registry import VerifyContext

__all__ = ["RewardPool", "VerifyContext", "code_sandbox", "math_answer", "register_verifier",
           "resolve_spec", "task", "verify"]
