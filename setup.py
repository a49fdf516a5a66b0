"""Installs the `randomized_pe` library.

`pip install randomized_pe` installs the pure core (samplers, encodings, families,
attention), which needs only jax and numpy. Extras:
  models       the Haiku models of `randomized_pe.models` (the paper's encoder, Ito's)
  experiments  what `experiments/` needs to train, evaluate and report
  cluster      Ray, for sweeps on a cluster (python -m experiments.sweep --executor=ray)
  dev          everything the test suite needs (models, experiments, pytest, the Flax
               and Equinox of examples/, and what builds the wheel in tests/test_package.py)

`tasks/` and `experiments/` are run from the repository root
(`python -m experiments.train ...`) and are deliberately not installed as
top-level packages.
"""
import pathlib
import re

import setuptools

HERE = pathlib.Path(__file__).parent


def _version() -> str:
  """`randomized_pe.__version__`, read from the file (importing it would need jax)."""
  text = (HERE / "randomized_pe" / "__init__.py").read_text(encoding="utf-8")
  return re.search(r'^__version__ = "([^"]+)"$', text, re.MULTILINE).group(1)


MODELS = ["dm-haiku>=0.0.13,<0.1", "chex>=0.1.86,<0.2"]
EXPERIMENTS = MODELS + [
    "optax>=0.2.5,<0.3",
    "absl-py>=1.4,<3",
    "ml_collections>=0.1.1,<2",
    "orbax-checkpoint>=0.6,<0.13",
    "tqdm>=4.60,<5",
    "tensorboardX>=2.6,<3",  # Event files of experiments/training/events.py (no TensorFlow).
    "matplotlib>=3.7,<4",
    "scipy>=1.11,<2",
]
DEV = EXPERIMENTS + [
    "pytest>=7.4,<10",
    "pytest-xdist>=3.5,<4",
    # examples/ (tests/test_examples.py); test-only, never needed by the library.
    "flax>=0.12,<0.13",
    "equinox>=0.13,<0.14",
    # TensorBoard itself reads the runs' event files (tests/test_events.py); a user who
    # only writes them needs tensorboardX alone.
    "tensorboard>=2.15,<3",
    # Builds the wheel without network access (tests/test_package.py).
    "setuptools>=61",
    "wheel>=0.40",
]

setuptools.setup(
    name="randomized_pe",
    version=_version(),
    description=(
        "Randomized positional encodings for length generalization of"
        " Transformers (Ruoss et al., ACL 2023) in JAX."
    ),
    long_description=(HERE / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    project_urls={
        "Paper": "https://arxiv.org/abs/2305.16843",
        "Original release": "https://github.com/google-deepmind/randomized_positional_encodings",
    },
    license="Apache-2.0",
    keywords="jax positional-encoding transformer length-generalization rope alibi",
    classifiers=[
        "Development Status :: 4 - Beta",
        "Intended Audience :: Science/Research",
        "License :: OSI Approved :: Apache Software License",
        "Programming Language :: Python :: 3",
        "Programming Language :: Python :: 3.10",
        "Programming Language :: Python :: 3.11",
        "Programming Language :: Python :: 3.12",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
    python_requires=">=3.10",
    packages=setuptools.find_packages(include=["randomized_pe", "randomized_pe.*"]),
    install_requires=[
        # jax brings its matching jaxlib.
        "jax>=0.4.30,<0.11",
        "numpy>=1.26,<3",
    ],
    extras_require={
        "models": MODELS,
        "experiments": EXPERIMENTS,
        "cluster": ["ray>=2.9,<3"],
        "dev": DEV,
    },
)
