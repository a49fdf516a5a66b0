"""Randomized positional encodings for length generalization (Ruoss et al., ACL 2023).

The pure core has no Haiku: `randomized_pe.positions` (samplers),
`randomized_pe.encodings` (encodings as jax.numpy functions),
`randomized_pe.registry` (encodings by name) and `randomized_pe.attention`
(softmax attention over the batch in cache-sized chunks). The Haiku encoder lives in
`randomized_pe.model`; `EncoderConfig` and `make_encoder` are loaded from it on
first use, so that Flax or Equinox users never import Haiku.
"""

from randomized_pe import attention
from randomized_pe import encodings
from randomized_pe import positions
from randomized_pe import registry
from randomized_pe.registry import get as get_encoding

__version__ = "0.1.0"

_MODEL_NAMES = ("EncoderConfig", "make_encoder", "Encoder", "MultiHeadAttention")


def __getattr__(name):
  if name in _MODEL_NAMES:
    from randomized_pe import model  # pylint: disable=import-outside-toplevel
    return getattr(model, name)
  raise AttributeError(f"module 'randomized_pe' has no attribute {name!r}")


__all__ = ["attention", "encodings", "positions", "registry", "get_encoding", *_MODEL_NAMES]
