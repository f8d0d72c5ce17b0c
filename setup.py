"""Package metadata for scalerl_jax.

CPU JAX from PyPI is the default. For accelerators install the matching JAX
build first (see README.md), then this package.

Only `scalerl_jax` is installed. `configs/` and `launch/` stay in the checkout
and are run from its root (`python -m launch.train --config=configs/...`), so
no top-level `configs` or `launch` package lands in site-packages.

The JAX libraries change their APIs between minor versions, so each is bounded
by the range this code was tested with: from the tested version up to the next
minor version. constraints.txt records the exact versions of a tested
environment (README.md says how to install with it).
"""

import setuptools

_RUNTIME = [
    "jax>=0.10.2,<0.11",
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

_EXTRAS = {
    # Test tools, plus PyTorch (CPU) and transformers for the Hugging Face
    # parity tests. torch is pinned to the build these machines carry locally.
    "test": [
        "pytest",
        "pytest-xdist",
        # tests/helpers.built_once: one build for every test worker.
        "filelock",
        "psutil",
        "chex",
        "torch==2.13.0",
        "transformers",
        # The TPU compiler (libtpu 0.0.42.1, a 213 MB wheel): tests/aot_test.py
        # compiles the small variants for a TPU slice on a CPU-only machine.
        "jax[tpu]==0.10.2",
        # The formatter and the linter (pyproject.toml), pinned: a
        # formatter's output changes between versions, and CI checks with it.
        "pyink==26.5.1",
        "ruff==0.16.9",
    ],
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
    # than constraints.txt: install it in a venv of its own
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
