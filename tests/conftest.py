"""Shared test helpers."""

import contextlib

import jax


@contextlib.contextmanager
def x64():
  """Enables float64 inside the block (jax.enable_x64 across JAX versions)."""
  if hasattr(jax, "enable_x64"):
    with jax.enable_x64(True):
      yield
  else:  # older JAX
    from jax.experimental import enable_x64  # pylint: disable=g-import-not-at-top
    with enable_x64():
      yield
