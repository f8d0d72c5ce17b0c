"""Package metadata for scalerl_jax.

CPU JAX from PyPI is the default. For accelerators install the matching JAX
build first (see README.md), then this package.

Only `scalerl_jax` is installed. `configs/` and `launch/` stay in the checkout
and are run from its root (`python -m launch.train --config=configs/...`), so
no top-level `configs` or `launch` package lands in site-packages.

The JAX libraries change their APIs between minor versions, so each is bounded
by the range this code was tested with: from the oldest tested version up to
the minor version after the newest. JAX 0.11 and later publish wheels for
Python 3.12+ only, so Python 3.11 resolves to JAX 0.10.2 and 3.12+ to 0.12.
constraints/ records the exact versions of one tested environment per Python
line (README.md says how to install with them).
"""

import setuptools

_RUNTIME = [
    "jax>=0.10.2,<0.13",
    "flax>=0.12.8,<0.13",
    "optax>=0.2.8,<0.3",
    "orbax-checkpoint>=0.12.8,<0.13",
    "grain>=0.2.18,<0.3",
    "sentencepiece",
    "ml-collections",
    "tensorflow-datasets",
    "absl-py",
    "etils[epath]",
    "safetensors",
    "numpy",
    "scipy",
    "matplotlib",
    "tensorboardX",
    "tqdm",
]

# The TPU runtime and compiler: JAX's own extra pins the libtpu made for the
# JAX that the range above resolves to.
_TPU = ["jax[tpu]"]

_EXTRAS = {
    # Test tools, plus PyTorch and transformers for the Hugging Face parity
    # tests. torch is pinned to the build these machines carry locally for
    # Python 3.11 (CPU); on 3.12+ the registry's build of it (CUDA, which runs
    # on a CPU too).
    "test": [
        "pytest",
        "pytest-xdist",
        # tests/helpers.built_once: one build for every test worker.
        "filelock",
        "psutil",
        "chex",
        "torch==2.13.0",
        "transformers",
        # The TPU compiler (libtpu, a ~200 MB wheel): tests/aot_test.py
        # compiles the small variants for a TPU slice on a CPU-only machine.
        *_TPU,
        # The formatter and the linter (pyproject.toml), pinned: a
        # formatter's output changes between versions, and CI checks with it.
        "pyink==26.5.1",
        "ruff==0.16.9",
    ],
    # A TPU VM, or compiling for a TPU slice on any machine:
    # `pip install -e ".[tpu]"`.
    "tpu": _TPU,
    # Optional prompt sources and verifiers.
    "tasks": [
        "reasoning-gym",
        "math-verify",
    ],
    # Loading tokenizers shipped with Hugging Face checkpoints (tokenizer.json)
    # and rendering their chat templates.
    "hf": [
        "tokenizers",
        "jinja2",
    ],
    # Tunix's sampler, the comparison column of benchmarks/sampler.py. It pins
    # safetensors<0.8 and pulls older transformers/tokenizers/huggingface_hub
    # than constraints/: install it in a venv of its own
    # (benchmarks/tunix_sampler.py says how).
    "bench": [
        "google-tunix>=0.1.7,<0.2",
    ],
}

setuptools.setup(
    name="scalerl_jax",
    version="0.1.0",
    description="JAX-native ScaleRL: predictable reinforcement learning of language models.",
    python_requires=">=3.10",
    packages=setuptools.find_packages(include=["scalerl_jax", "scalerl_jax.*"]),
    install_requires=_RUNTIME,
    extras_require=_EXTRAS,
)
