"""scalerl_jax: JAX-native ScaleRL."""
