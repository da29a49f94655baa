"""Shared test helpers, and 8 virtual CPU devices for the distributed tests."""

import contextlib
import os
import re
import shutil
import tempfile

# The suite compiles a few thousand small XLA programs, many of them more than
# once (the same optimizer on the same tree in several tests and both xdist
# workers); on CPU compiling is most of its time. One persistent compilation
# cache per run, in a fresh temporary directory that the workers (and the
# notebooks' kernels and the demo's subprocess) share through these variables,
# compiles each program once. It starts empty, so a run never depends on an
# earlier one, and it is removed when the run ends. Set before JAX is imported.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="lars_optax_tests_xla_")
  os.environ["LARS_OPTAX_TESTS_OWN_CACHE"] = os.environ["JAX_COMPILATION_CACHE_DIR"]
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")

import jax  # (after the cache's variables are set)
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.experimental.sparse import BCOO

# (Again in this process, in case a plugin imported JAX before the variables were set.)
jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])
jax.config.update("jax_persistent_cache_min_compile_time_secs",
                  float(os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"]))
jax.config.update("jax_persistent_cache_min_entry_size_bytes",
                  int(os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"]))

# The distributed tests (pmap, sharded jit, shard_map) need several devices; on
# CPU, JAX can split the host into virtual ones. This must run before the
# first computation, which is why it lives here (pytest imports conftest first).
# A GPU/TPU run keeps its real devices.
NUM_CPU_DEVICES = 8
# RuntimeError: a backend was already initialised (e.g. by a plugin).
with contextlib.suppress(RuntimeError):
  jax.config.update("jax_num_cpu_devices", NUM_CPU_DEVICES)

import lars_optax  # noqa: E402  (after the device count is set)


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


def mxnet_params(dtype=jnp.float32):
  """A small MXNet-named params tree (a weight and a bias) for the optimizer tests."""
  return {"fc1_weight": jnp.array([[1.0, -2.0], [0.5, 3.0]], dtype),
          "fc1_bias": jnp.array([0.1, -0.2], dtype)}


def mxnet_grads(dtype=jnp.float32, scale=1.0):
  """Gradients for :func:`mxnet_params`, times ``scale``."""
  return {"fc1_weight": jnp.array([[0.3, -0.1], [0.0, 0.4]], dtype) * scale,
          "fc1_bias": jnp.array([0.5, -0.5], dtype) * scale}


def mxnet_run(tx, steps=3, dtype=jnp.float32, jit=True):
  """``steps`` updates of :func:`mxnet_params` (gradients scaled 1, 2, ...); (params, state)."""
  params = mxnet_params(dtype)
  state = tx.init(params)
  update = jax.jit(tx.update) if jit else tx.update
  for k in range(steps):
    updates, state = update(mxnet_grads(dtype, scale=1.0 + k), state, params)
    params = optax.apply_updates(params, updates)
  return params, state


def as_row_sparse(g, dtype=np.float32):
  """MXNet's ``tostype('row_sparse')``: the rows with a non-zero entry.

  Padded to one slot per row (with the padding index, the number of rows),
  so that every step has the same shapes and compiles once.
  """
  g = np.asarray(g, dtype)
  n = g.shape[0]
  rows = np.nonzero(np.any(g.reshape(n, -1) != 0, axis=1))[0]
  values = np.zeros_like(g)
  values[:len(rows)] = g[rows]
  padded = np.full(n, n, np.int32)
  padded[:len(rows)] = rows
  return BCOO((jnp.asarray(values), jnp.asarray(padded)[:, None]), shape=g.shape)


def launched_kernels(hlo: str) -> int:
  """Operations of a compiled HLO module's entry computation that launch a
  kernel (fusions, copies, library calls), from ``compiled.as_text()``."""
  entry = hlo[hlo.index("ENTRY"):].split("\n}", maxsplit=1)[0]
  ops = re.findall(r"\n\s*(?:ROOT )?%\S+ = .*? ([\w\-]+)\(", entry)
  return sum(op not in ("parameter", "constant", "tuple", "get-tuple-element", "bitcast",
                        "optimization-barrier") for op in ops)


def step_lowered_for(tx, params, platform: str) -> str:
  """The StableHLO of one jitted step (``update`` + ``apply_updates``) of ``tx``
  on ``params`` (its own gradients), lowered for ``platform`` ("cpu", "cuda",
  "tpu"; no such device needed)."""
  import optax

  def step(p, s, g):
    u, s = tx.update(g, s, p)
    return optax.apply_updates(p, u), s

  return jax.jit(step).trace(params, tx.init(params), params).lower(
      lowering_platforms=(platform,)).as_text()


def explicit_mesh(shape: tuple[int, ...], names: tuple[str, ...]):
  """A mesh of the first devices whose axes are all ``Explicit``: shardings are
  part of the arrays' types ("sharding in types")."""
  return jax.make_mesh(shape, names, axis_types=(jax.sharding.AxisType.Explicit,) * len(names),
                       devices=jax.devices()[:int(np.prod(shape))])


def use_mesh(mesh):
  """``jax.set_mesh(mesh)`` (``jax.sharding.use_mesh`` before jax 0.7.1)."""
  set_mesh = getattr(jax, "set_mesh", None)
  return set_mesh(mesh) if set_mesh is not None else jax.sharding.use_mesh(mesh)


def public(name):
  """A public name of the library: the top level first, then ``lars_optax.mxnet``."""
  for namespace in (lars_optax, lars_optax.mxnet):
    if name in namespace.__all__:
      return getattr(namespace, name)
  raise AttributeError(f"lars_optax has no public {name!r}")


def pytest_unconfigure(config):
  """Removes this run's compilation cache (in the process that made it)."""
  own = os.environ.get("LARS_OPTAX_TESTS_OWN_CACHE")
  if own and not hasattr(config, "workerinput"):
    shutil.rmtree(own, ignore_errors=True)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
  """Runs a test marked ``op_by_op`` under ``jax.disable_jit()``.

  A jitted step is a new XLA program for every optimizer, tree and set of
  hyperparameters, and compiling it is most of a small test's time on CPU. Op by
  op, the programs are single primitives, shared by every test in the process.
  The mark is for tests of trees, names, dtypes, masks and equalities between two
  runs of the library. Tests of numbers against a reference (MXNet, TF, the peers),
  of training loops, of documented code, and of what jit, pmap, shard_map, donation
  or sharding do stay compiled.
  """
  if item.get_closest_marker("op_by_op"):
    with jax.disable_jit():
      yield
  else:
    yield


# --------------------------------------------------------------------------
# The inner loop (pytest -m unit) and the default tier's budget
# --------------------------------------------------------------------------

# The modules of argument and structure checks: their tests are the inner loop,
# ``pytest -m unit``, but for those marked ``numeric`` (they take steps and compare
# numbers, e.g. with optax), which run in the default tier only.
UNIT_MODULES = {"test_api.py", "test_layout.py", "test_links.py", "test_optimizer_table.py",
                "test_validation.py"}


def pytest_ignore_collect(collection_path, config):
  """``-m unit`` collects only the unit modules: the others hold no unit test, and
  importing them (Flax, Haiku, Equinox, ...) is most of a short run's time."""
  name = collection_path.name
  if (config.option.markexpr == "unit" and name.startswith("test_") and name.endswith(".py")
      and name not in UNIT_MODULES):
    return True
  return None


@pytest.hookimpl(tryfirst=True)  # (before -m selects by the marks)
def pytest_collection_modifyitems(config, items):
  for item in items:
    if item.path.name in UNIT_MODULES and not item.get_closest_marker("numeric"):
      item.add_marker(pytest.mark.unit)


# The default tier's summed test durations (setup, call and teardown of every test,
# over all workers), against the figure stored in tests/budget.json: with
# LARS_OPTAX_DURATION_BUDGET=1 (.ci/run sets it) a default-tier run that passes it fails.
BUDGET = os.path.join(os.path.dirname(__file__), "budget.json")
_durations: list[float] = []


def pytest_runtest_logreport(report):
  _durations.append(report.duration)


def _default_tier(config) -> bool:
  """The README's command: the default tier's marks, the whole of tests/, no -k."""
  start = str(config.invocation_params.dir)
  given = [os.path.abspath(os.path.join(start, a)) for a in config.args]
  return (config.option.markexpr == "not slow" and not config.option.keyword
          and given == [os.path.dirname(os.path.abspath(__file__))])


def pytest_sessionfinish(session, exitstatus):
  config = session.config
  if hasattr(config, "workerinput") or not _default_tier(config):
    return
  import json
  with open(BUDGET) as f:
    budget = json.load(f)["default_tier_seconds"]
  total = sum(_durations)
  reporter = config.pluginmanager.get_plugin("terminalreporter")
  over = total > budget
  if reporter is not None:
    reporter.write_line(f"default tier: {total:,.0f} s of test time over all workers "
                        f"(budget {budget:,} s, tests/budget.json)", red=over)
  if over and os.environ.get("LARS_OPTAX_DURATION_BUDGET") == "1":
    if reporter is not None:
      reporter.write_line(
          "FAILED: the default tier passed its budget. Move long runs to the slow tier "
          "(-m slow) or share compiled programs (tests/optimizers.py); raise the figure "
          "only with a reason in the commit.", red=True)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
