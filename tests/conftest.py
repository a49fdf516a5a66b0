"""Shared test settings: float32 everywhere, CPU, few threads."""
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
