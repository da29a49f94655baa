"""Shared test helpers, and 8 virtual CPU devices for the distributed tests."""

import contextlib

import jax

# The distributed tests (pmap, sharded jit, shard_map) need several devices; on
# CPU, JAX can split the host into virtual ones. This must run before the
# first computation, which is why it lives here (pytest imports conftest first).
# A GPU/TPU run keeps its real devices.
NUM_CPU_DEVICES = 8
# RuntimeError: a backend was already initialised (e.g. by a plugin).
with contextlib.suppress(RuntimeError):
  jax.config.update("jax_num_cpu_devices", NUM_CPU_DEVICES)


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
