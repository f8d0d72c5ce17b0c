"""Verifiable rewards: verifiers registered by name, run in a killable pool.

Importing the package registers the verifiers (`math`, `builtin`,
`reasoning_gym:<name>`, `code`); the trainer scores through
`workers.pool.RewardPool`. Design: docs/design/rewards.md.
"""

from scalerl_jax.rewards import code_sandbox
from scalerl_jax.rewards import math_answer
from scalerl_jax.rewards import task
from scalerl_jax.rewards.registry import VerifyContext
from scalerl_jax.rewards.registry import register_verifier
from scalerl_jax.rewards.registry import resolve_spec
from scalerl_jax.rewards.registry import verify
from scalerl_jax.rewards.workers.pool import RewardPool

__all__ = [
    "RewardPool",
    "VerifyContext",
    "code_sandbox",
    "math_answer",
    "register_verifier",
    "resolve_spec",
    "task",
    "verify",
]
