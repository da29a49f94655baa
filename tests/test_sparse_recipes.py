"""The dense-exact recipe as users run it, in every documented layout.

An embedding table beside a dense tower (the bag's mean row, a tanh layer, a linear
head), ``sparse.adam`` with warm-up + cosine, 300 steps of Zipfian ids, each step
bringing the batch's rows up to date first (``catch_up(rows=)``), in the layouts of
docs/sparse.md: one device; ``jit`` with the table split by rows (automatic axes, and
explicit axes, where the lookup reads ``table.at[ids].get(out_sharding=)``); and
``shard_map`` with ``axis_name``, the batch the same on every device or split over
the table's axis. Two checks each, as docs/sparse.md's "Checking a layout" says:

* teacher-forced: every step of the layout, from one device's state at that step,
  equals one device's step (a 3-step test cannot see what shows at step 50);
* free-running: the whole run, against dense ``optax.adam`` on one device. The tower
  is smooth (tanh): a ReLU's kink turns float noise into a different path (a unit
  flipped by a pre-activation of 5e-8), for dense Adam in another summation order too.
"""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import explicit_mesh, use_mesh
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import lars_optax

ROWS, DIM, HIDDEN, BATCH, BAG, STEPS = 2048, 8, 16, 32, 4, 300
SCHEDULE = optax.warmup_cosine_decay_schedule(0.0, 1e-2, 30, STEPS)
N = 8  # devices

pytestmark = pytest.mark.skipif(jax.device_count() < N, reason="needs 8 devices (conftest.py)")


def _data():
  rng = np.random.default_rng(0)
  ids = ((rng.zipf(1.2, size=(STEPS, BATCH, BAG)) - 1) % ROWS).astype(np.int32)
  truth = rng.normal(size=(ROWS,)).astype(np.float32)
  ys = truth[ids].mean(-1) + 0.1 * rng.normal(size=(STEPS, BATCH)).astype(np.float32)
  params = {"table": rng.normal(size=(ROWS, DIM)).astype(np.float32) * 0.1,
            "w1": rng.normal(size=(DIM, HIDDEN)).astype(np.float32) / np.sqrt(DIM),
            "b1": np.zeros(HIDDEN, np.float32),
            "w2": rng.normal(size=(HIDDEN,)).astype(np.float32) / np.sqrt(HIDDEN)}
  return params, jnp.asarray(ids), jnp.asarray(ys)


def _loss(p, ids, y, out_sharding=None, parts=1):
  rows = (p["table"][ids] if out_sharding is None
          else p["table"].at[ids].get(out_sharding=out_sharding))
  hidden = jnp.tanh(rows.mean(axis=1) @ p["w1"] + p["b1"])
  return jnp.mean((hidden @ p["w2"] - y) ** 2) / parts


TX = lars_optax.sparse.adam(SCHEDULE)


def _step(axis_name=None, **loss_kw):
  """The recipe's train step: the batch's rows up to date, sparse gradients, the step."""
  grad_fn = lars_optax.sparse.value_and_grad(functools.partial(_loss, **loss_kw),
                                             sparse="table", axis_name=axis_name)

  def step(p, s, ids, y):
    p, s = lars_optax.sparse.catch_up(TX, p, s, rows={"table": ids}, axis_name=axis_name)
    _, g = grad_fn(p, ids, y)
    u, s = TX.update(g, s, p)
    return optax.apply_updates(p, u), s

  return step


def _run(step, params, state, ids, ys, every=False):
  """The steps over the batches in one compiled scan: the last ``(params, state)``, or
  with ``every`` each step's, stacked."""
  def body(carry, batch):
    carry = step(*carry, *batch)
    return carry, carry if every else None

  last, stacked = jax.jit(lambda c, xs: jax.lax.scan(body, c, xs))((params, state), (ids, ys))
  return stacked if every else last


@functools.lru_cache(maxsize=1)
def _one_device():
  """One device's states at every step (host copies)."""
  params, ids, ys = _data()
  params = jax.tree.map(jnp.asarray, params)
  state = TX.init(params)
  stacked = jax.device_get(_run(_step(), params, state, ids, ys, every=True))
  return [jax.device_get((params, state))] + [
      jax.tree.map(lambda x, i=i: x[i], stacked) for i in range(STEPS)]


@functools.lru_cache(maxsize=1)
def _dense_adam():
  """Dense optax.adam on one device, free-running: the final params."""
  params, ids, ys = _data()
  params = jax.tree.map(jnp.asarray, params)
  tx = optax.adam(SCHEDULE)

  def step(p, s, i, y):
    g = jax.grad(_loss)(p, i, y)
    u, s = tx.update(g, s, p)
    return optax.apply_updates(p, u), s

  (params, _), _ = jax.jit(lambda c: jax.lax.scan(
      lambda c, b: (step(*c, *b), None), c, (ids, ys)))((params, tx.init(params)))
  return jax.device_get(params)


def _specs(tree):
  """The table and its per-row state split by rows over "x"; the rest replicated."""
  return jax.tree.map(lambda a: P("x") if np.shape(a)[:1] == (ROWS,) else P(), tree)


def _layout(name):
  """``(step, put, context)``: the layout's compiled step, how its inputs are placed."""
  if name in ("jit_automatic_axes", "jit_explicit_axes"):
    explicit = name == "jit_explicit_axes"
    if explicit and not hasattr(jax, "set_mesh"):
      pytest.skip("explicit axes need jax.set_mesh (jax >= 0.7.1)")
    mesh = (explicit_mesh((N,), ("x",)) if explicit
            else Mesh(np.array(jax.devices()[:N]), ("x",)))
    step = jax.jit(_step(out_sharding=P() if explicit else None))

    def put(tree):
      return jax.device_put(tree, jax.tree.map(lambda q: NamedSharding(mesh, q), _specs(tree)))
    return step, put, (lambda: use_mesh(mesh)) if explicit else None
  mesh = Mesh(np.array(jax.devices()[:N]), ("x",))
  split = name == "shard_map_batch_split"
  params, _, _ = _data()
  p_spec, s_spec = _specs(params), _specs(TX.init(jax.tree.map(jnp.asarray, params)))
  batch = P("x") if split else P()
  step = jax.jit(jax.shard_map(_step(axis_name="x", parts=N if split else 1), mesh=mesh,
                               in_specs=(p_spec, s_spec, batch, batch),
                               out_specs=(p_spec, s_spec)))

  def put(tree):
    return jax.device_put(tree, jax.tree.map(lambda q: NamedSharding(mesh, q), _specs(tree)))
  return step, put, None


LAYOUTS = ["jit_automatic_axes", "jit_explicit_axes", "shard_map_batch_replicated",
           "shard_map_batch_split"]


def _largest_move(final, first):
  return max(float(np.abs(np.asarray(a) - np.asarray(b)).max())
             for a, b in zip(jax.tree.leaves(final), jax.tree.leaves(first)))


@pytest.mark.parametrize("name", LAYOUTS)
def test_every_step_of_the_layout_equals_one_devices_step(name):
  """Teacher-forced: from one device's state at each of 300 steps, one step of the
  layout gives one device's next params."""
  trajectory = _one_device()
  _, ids, ys = _data()
  step, put, context = _layout(name)
  worst = 0.0
  with context() if context else _nothing():
    for i in range(STEPS):
      params, _ = step(*put(trajectory[i]), ids[i], ys[i])
      want = trajectory[i + 1][0]
      worst = max(worst, max(float(np.abs(np.asarray(a) - b).max()) for a, b in zip(
          jax.tree.leaves(params), jax.tree.leaves(want))))
  move = _largest_move(trajectory[-1][0], trajectory[0][0])
  assert worst <= 1e-6 * move, f"{name}: {worst:.3g} = {worst / move:.3g} of the largest move"


@pytest.mark.parametrize("name", ["one_device", *LAYOUTS])
def test_the_free_running_recipe_follows_dense_adam(name):
  """300 free-running steps with warm-up + cosine and a smooth tower, then a full
  catch_up: dense optax.adam's params, within 1e-5 of the largest move."""
  params, ids, ys = _data()
  if name == "one_device":
    step, put, context = jax.jit(_step()), (lambda t: jax.tree.map(jnp.asarray, t)), None
  else:
    step, put, context = _layout(name)
  with context() if context else _nothing():
    p, s = jax.device_get(_run(step, put(params), put(TX.init(jax.tree.map(jnp.asarray, params))),
                               ids, ys))
  p, _ = lars_optax.sparse.catch_up(TX, jax.tree.map(jnp.asarray, p),
                                    jax.tree.map(jnp.asarray, s))
  want = _dense_adam()
  move = _largest_move(want, params)
  chex.assert_trees_all_close(jax.device_get(p), want, rtol=0, atol=1e-5 * move)


class _nothing:
  def __enter__(self):
    return self

  def __exit__(self, *exc):
    return False
