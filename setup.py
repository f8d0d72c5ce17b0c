"""Package metadata for scalerl_jax.

CPU JAX from PyPI is the default. For accelerators install the matching JAX
build first (see README.md), then this package.
"""

import setuptools

_RUNTIME = [
    "jax",
    "flax",
    "optax",
    "orbax-checkpoint",
    "grain",
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
]

_EXTRAS = {
    # Test tools, plus PyTorch (CPU) and transformers for the Hugging Face
    # parity tests. torch is pinned to the build these machines carry locally.
    "test": [
        "pytest",
        "pytest-xdist",
        "psutil",
        "chex",
        "torch==2.13.0",
        "transformers",
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
}

setuptools.setup(
    name="scalerl_jax",
    version="0.1.0",
    description="JAX-native ScaleRL: predictable reinforcement learning of language models.",
    python_requires=">=3.10",
    packages=setuptools.find_packages(include=["scalerl_jax", "scalerl_jax.*", "configs", "configs.*", "launch", "launch.*"]),
    install_requires=_RUNTIME,
    extras_require=_EXTRAS,
)
