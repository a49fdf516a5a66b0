"""Randomized positional encodings for length generalization (Ruoss et al., ACL 2023).

The pure core has no Haiku: `randomized_pe.samplers` (which positions, by name),
`randomized_pe.encodings` (encodings as jax.numpy functions),
`randomized_pe.families` (how positions enter a model, by name; encoding names),
`randomized_pe.release` (the original release's behaviour as one record),
`randomized_pe.attention` (softmax attention over the batch in cache-sized chunks) and
`randomized_pe.geometric` (NDR's geometric attention, the `geometric` family's weights).
Models live in `randomized_pe.models` (the paper's Haiku encoder is
`randomized_pe.models.encoder`); `EncoderConfig` and `make_encoder` are loaded from it
on first use, so that Flax or Equinox users never import Haiku.
"""

from randomized_pe import attention
from randomized_pe import encodings
from randomized_pe import families
from randomized_pe import geometric
from randomized_pe import release
from randomized_pe import samplers
from randomized_pe.families import get as get_encoding

__version__ = "0.2.0"

_MODEL_NAMES = ("EncoderConfig", "make_encoder", "Encoder", "MultiHeadAttention",
                "EncoderModel")


def __getattr__(name):
  if name in _MODEL_NAMES:
    from randomized_pe.models import encoder  # pylint: disable=import-outside-toplevel
    return getattr(encoder, name)
  raise AttributeError(f"module 'randomized_pe' has no attribute {name!r}")


__all__ = ["attention", "encodings", "families", "geometric", "release", "samplers",
           "get_encoding",
           *_MODEL_NAMES]
