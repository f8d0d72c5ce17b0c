# The environment of the GPU scripts (gpu_rl_step.sh, gpu_speed.sh), sourced
# by each from the checkout's root after it sets OUT: unbuffered output, the
# checkout importable, 95% of the card for XLA (default 75%; the limit is
# logged), and one persistent compilation cache, so a later stage reuses an
# earlier one's programs where they are equal.
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.95}
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-/tmp/jax_cache}
export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0
