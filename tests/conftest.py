"""Shared test settings: fail loudly on silent broadcasting mistakes."""

import jax

jax.config.update("jax_numpy_rank_promotion", "raise")
