"""Pinned outputs and parameter counts of every encoding of both models (issue #30).

For every encoding of the paper's Haiku encoder (`randomized_pe.families.names()`, under
compat "paper" and "release") and of Ito's model (`randomized_pe.models.ito.names()`), a
tiny model with fixed seeds: its parameter count, its inputs (tokens and the positions
its training sampler draws from a fixed key: the randomized encodings' sampled
positions) and its logits at evaluation and in training (dropout from a fixed key), as
they were when the pins were written. They are compared at 1e-6 absolute (the models
run in float32; logits are O(1)). A restructuring (#30: the Ito model onto the core's
family registry) that keeps every pin changes no output.

The checks come apart so that a failure says what changed:
  - the parameter count, and the initialisation (from the same seed: every Ito parameter
    is pinned whole; the encoder's by path, shape, sum and sum of squares);
  - the sampled positions;
  - the logits of the pinned inputs (for Ito, of the pinned *parameters*): the function
    itself, even where the initialisation changed (e.g. parameters created in another
    order; a restructuring that renames parameters maps the pinned names to the new ones
    in `pinned_ito_params`).

The pins (tests/data/pinned_outputs.npz) are written by `generate()`. Regenerate them
only on purpose, for a change that is meant to change outputs (or to pin a new
encoding), and say so in the commit:

    RANDOMIZED_PE_REGENERATE_PINS=1 .venv/bin/python -m pytest tests/test_pinned_outputs.py

Forward passes run eagerly, as tests/test_ito_model.py's (one XLA program per operation,
shared by all models: cheaper than compiling each model on a slow CPU).
"""
import functools
import hashlib
import os
import pathlib

import jax
import numpy as np
import pytest

import randomized_pe as rpe
from randomized_pe import families
from randomized_pe.models import encoder as model_lib
from randomized_pe.models import ito
from tests.test_ito_model import _model as ito_model
from tests.test_model import TINY, _init as encoder_init, _param_count

PIN_FILE = pathlib.Path(__file__).parent / "data" / "pinned_outputs.npz"
REGENERATE = os.environ.get("RANDOMIZED_PE_REGENERATE_PINS", "") in ("1", "true")
ATOL = 1e-6  # Absolute, float32 logits, on the CPU that wrote the pins.
# On another processor XLA compiles other vector widths and summation orders: float
# results move by up to about 1e-6 there (compiling whole models instead of op by op
# already moves these logits by 7.7e-7 on one CPU). 1e-5 still catches the changes the
# pins are for (u and v swapped: >= 1.6e-2; tanh GELU in Ito's model: >= 4.1e-5).
ATOL_OTHER_CPU = 1e-5
CPU_KEY = "meta/cpu"


def _cpu() -> str:
  """The processor's model name and vector extensions, as /proc/cpuinfo gives them."""
  try:
    info = pathlib.Path("/proc/cpuinfo").read_text().splitlines()
  except OSError:
    return "unknown"
  name = next((l.split(":", 1)[1].strip() for l in info if l.startswith("model name")), "")
  flags = next((l.split(":", 1)[1].split() for l in info if l.startswith("flags")), [])
  return name + " " + " ".join(sorted(f for f in flags if f.startswith(("avx", "fma"))))

COMPATS = ("paper", "release")
ENCODER_LENGTHS = (5, 9)
ENCODER_VOCAB, ENCODER_OUTPUTS = 5, 3  # tests/test_model.py's sizes (TINY: 2 layers, d_model 16).
TINY_ITO = dict(d_model=16, mlp_size=32, num_layers=2)  # Ito's 4x4 grid: 16 tokens, 4 classes.
ITO_BATCH = 2
INIT_SEED, SAMPLE_SEED, APPLY_SEED = 0, 7, 11


def _logits(model, params, tokens, positions):
  """Logits [2, B, T, O] at evaluation (row 0) and in training (row 1, a fixed dropout key)."""
  key = jax.random.PRNGKey(APPLY_SEED)
  return np.stack([np.asarray(model.apply(params, key, tokens, positions, is_training=train))
                   for train in (False, True)])


def _leaves(params):
  """[("module/name:[shape]", value)] sorted by path."""
  return sorted((f"{module}/{name}:{list(value.shape)}", np.asarray(value))
                for module, values in params.items() for name, value in values.items())


def _fingerprint(params):
  """(paths, float64 [n, 2] of each parameter's (sum, sum of squares))."""
  leaves = [(path, value.astype(np.float64)) for path, value in _leaves(params)]
  return (np.array([path for path, _ in leaves]),
          np.array([[x.sum(), (x * x).sum()] for _, x in leaves]))


# --------------------------------------------------------------------------
# The cases: every array a pin holds, as {suffix: array}.


def encoder_config(pe, compat):
  return rpe.EncoderConfig(vocab_size=ENCODER_VOCAB, pe=pe, compat=compat, **TINY)


def encoder_case(pe, compat, pinned=None):
  """The encoder's pins; with `pinned` ({suffix: array}), its logits on the pinned inputs."""
  config = encoder_config(pe, compat)
  out = {}
  for length in ENCODER_LENGTHS:
    model, params, tokens = encoder_init(config, ENCODER_OUTPUTS, length, seed=INIT_SEED)
    positions = config.sample_positions(jax.random.PRNGKey(SAMPLE_SEED), length)
    out[f"len{length}/tokens"], out[f"len{length}/positions"] = tokens, positions
    if pinned is not None:
      tokens, positions = pinned[f"len{length}/tokens"], pinned[f"len{length}/positions"]
    out[f"len{length}/logits"] = _logits(model, params, tokens, positions)
  out["param_count"] = np.array(_param_count(params))
  out["param_paths"], out["param_sums"] = _fingerprint(params)
  return {name: np.asarray(value) for name, value in out.items()}


def pinned_ito_params(pinned):
  """The pinned Ito parameters as a Haiku params dict (from "param_paths" and the flat
  float32 "params", in path order)."""
  params, start = {}, 0
  for path in pinned["param_paths"]:
    name, shape = str(path).split(":")
    shape = tuple(int(n) for n in shape.strip("[]").split(",") if n.strip())
    module, name = name.rsplit("/", 1)
    size = int(np.prod(shape))
    params.setdefault(module, {})[name] = pinned["params"][start:start + size].reshape(shape)
    start += size
  return params


def ito_case(pe, pinned=None):
  """Ito's pins; with `pinned`, its logits on the pinned tokens, positions and parameters."""
  model = ito_model(pe, **TINY_ITO)
  config = model.config
  tokens = jax.random.randint(jax.random.PRNGKey(100), (ITO_BATCH, config.num_cells), 0,
                              config.vocab_size)
  params = model.init(jax.random.PRNGKey(INIT_SEED), tokens)
  positions = config.sample_positions(jax.random.PRNGKey(SAMPLE_SEED))
  out = {"tokens": tokens, "positions": positions,
         "param_count": np.array(ito.parameter_count(params, model.frozen_mask(params))),
         "param_count_total": np.array(ito.parameter_count(params, trainable_only=False))}
  leaves = _leaves(params)
  out["param_paths"] = np.array([path for path, _ in leaves])
  out["params"] = np.concatenate([value.ravel() for _, value in leaves])
  if pinned is not None:
    tokens, positions, params = pinned["tokens"], pinned["positions"], pinned_ito_params(pinned)
  out["logits"] = _logits(model, params, tokens, positions)
  return {name: np.asarray(value) for name, value in out.items()}


def _cases():
  """(prefix, function of pinned) for every encoding of both models."""
  cases = [(f"encoder/{compat}/{pe}", lambda pinned, pe=pe, compat=compat:
            encoder_case(pe, compat, pinned)) for compat in COMPATS for pe in families.names()]
  return cases + [(f"ito/{pe}", lambda pinned, pe=pe: ito_case(pe, pinned))
                  for pe in ito.names()]


def generate(path=PIN_FILE):
  """Writes every pin (see the module docstring for when)."""
  arrays = {}
  for prefix, case in _cases():
    pins = case(None)
    if "params" in pins:  # Ito's: stored once per distinct set (encodings share them).
      values = pins.pop("params")
      pins["params_id"] = np.array(hashlib.sha1(values.tobytes()).hexdigest()[:12])
      arrays[f"ito/params/{pins['params_id']}"] = values
    arrays.update({f"{prefix}/{name}": value for name, value in pins.items()})
  arrays[CPU_KEY] = np.array(_cpu())
  path.parent.mkdir(parents=True, exist_ok=True)
  np.savez_compressed(path, **arrays)


# --------------------------------------------------------------------------
# The tests.


@pytest.fixture(scope="module")
def pins():
  if REGENERATE:
    generate()
  with np.load(PIN_FILE) as data:
    return {name: data[name] for name in data.files}


def _pinned(pins, prefix):
  pinned = {name[len(prefix) + 1:]: value for name, value in pins.items()
            if name.startswith(prefix + "/")}
  if "params_id" in pinned:
    pinned["params"] = pins[f"ito/params/{pinned.pop('params_id')}"]
  return pinned


def test_every_encoding_is_pinned(pins):
  pinned = {"/".join(name.split("/")[:-1]) for name in pins if name.endswith("/param_count")}
  assert pinned == {prefix for prefix, _ in _cases()}, (
      "encodings added or removed since the pins were written: an encoding lost is an output "
      "changed; pin a new one on purpose (module docstring)")
  assert PIN_FILE.stat().st_size < 300_000


@functools.lru_cache(maxsize=None)
def _atol() -> float:
  """ATOL on the CPU that wrote the pins, ATOL_OTHER_CPU elsewhere."""
  with np.load(PIN_FILE) as data:
    same = CPU_KEY in data.files and str(data[CPU_KEY]) == _cpu()
  return ATOL if same else ATOL_OTHER_CPU


def _check(prefix, pinned, got):
  """Counts and initialisation, then positions, then logits: the first difference fails."""
  atol = _atol()
  assert set(got) == set(pinned), f"{prefix}: pinned arrays {sorted(set(pinned) ^ set(got))}"
  order = sorted(got, key=lambda n: (not n.startswith("param"), n.endswith("logits")))
  for name in order:
    want, have = pinned[name], got[name]
    where = f"{prefix}/{name}"
    assert have.shape == want.shape, f"{where}: shape {have.shape}, pinned {want.shape}"
    if want.dtype.kind in "iuU" or name.startswith("param_count"):
      np.testing.assert_array_equal(have, want, err_msg=where)
    elif name == "param_sums":  # Sums of up to ~1e3 numbers: float32 rounding.
      np.testing.assert_allclose(have, want, rtol=1e-5, atol=1e-5, err_msg=where)
    else:
      np.testing.assert_allclose(have, want, rtol=0, atol=atol, err_msg=where)


@pytest.mark.parametrize("compat", COMPATS)
@pytest.mark.parametrize("pe", families.names())
def test_encoder_outputs_equal_the_pins(pe, compat, pins):
  prefix = f"encoder/{compat}/{pe}"
  pinned = _pinned(pins, prefix)
  _check(prefix, pinned, encoder_case(pe, compat, pinned))


@pytest.mark.parametrize("pe", ito.names())
def test_ito_outputs_equal_the_pins(pe, pins):
  prefix = f"ito/{pe}"
  pinned = _pinned(pins, prefix)
  _check(prefix, pinned, ito_case(pe, pinned))


# The pins would notice the two changes issue #30 names (both went unnoticed by every
# other test when tried on a copy): the Ito MLP's exact GELU replaced by the tanh
# approximation (logits move by ~5e-5), and the relative family's content bias u and
# position bias v exchanged (logits move by ~2e-2).


@pytest.mark.parametrize("pe", ["2d_fixed", "relative"])
def test_ito_pins_catch_the_tanh_gelu(pe, pins, monkeypatch):
  gelu = jax.nn.gelu
  monkeypatch.setattr(jax.nn, "gelu", lambda x, approximate=True: gelu(x, approximate=True))
  prefix = f"ito/{pe}"
  pinned = _pinned(pins, prefix)
  with pytest.raises(AssertionError, match=f"{prefix}/logits"):
    _check(prefix, pinned, ito_case(pe, pinned))


@pytest.mark.parametrize("pe", ["relative", "randomized_relative"])
def test_encoder_pins_catch_u_and_v_swapped(pe, pins, monkeypatch):
  get_params = model_lib._get_params

  def swapped(specs):  # The relative family's parameters with u and v exchanged.
    params = get_params(specs)
    return {**params, "content_bias": params["relative_bias"],
            "relative_bias": params["content_bias"]} if "content_bias" in params else params

  monkeypatch.setattr(model_lib, "_get_params", swapped)
  for compat in COMPATS:
    prefix = f"encoder/{compat}/{pe}"
    pinned = _pinned(pins, prefix)
    with pytest.raises(AssertionError, match=f"{prefix}/len5/logits"):
      _check(prefix, pinned, encoder_case(pe, compat, pinned))
