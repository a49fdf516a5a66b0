"""Installs the `randomized_pe` library.

`tasks/` and `experiments/` are run from the repository root
(`python -m experiments.train ...`) and are deliberately not installed as
top-level packages.
"""
import setuptools

setuptools.setup(
    name="randomized_pe",
    version="0.1.0",
    description=(
        "Randomized positional encodings for length generalization of"
        " Transformers (Ruoss et al., ACL 2023) in JAX."
    ),
    license="Apache-2.0",
    python_requires=">=3.10",
    packages=["randomized_pe"],
    install_requires=[
        "jax>=0.4.30,<0.11",
        "jaxlib>=0.4.30,<0.11",
        "dm-haiku>=0.0.13,<0.1",
        "optax>=0.2.5,<0.3",
        "numpy>=1.26,<3",
        "absl-py>=1.4,<3",
        "chex>=0.1.86,<0.2",
        "ml_collections>=0.1.1,<2",
        "orbax-checkpoint>=0.6,<0.13",
        "tqdm>=4.60,<5",
        "matplotlib>=3.7,<4",
        "scipy>=1.11,<2",
    ],
    extras_require={
        "dev": ["pytest>=7.4,<10", "pytest-xdist>=3.5,<4"],
        # Sweeps on a Ray cluster: python -m experiments.sweep --executor=ray.
        "cluster": ["ray>=2.9,<3"],
    },
)
