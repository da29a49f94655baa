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
import pytest
from conftest import explicit_mesh, use_mesh
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import lars_optax
import sparse_recipe as recipe

N = 8  # devices

# 300 steps in each layout: the slow tier (pytest -m slow).
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(jax.device_count() < N, reason="needs 8 devices (conftest.py)")]

_one_device = functools.lru_cache(maxsize=1)(recipe.one_device)
_dense_adam = functools.lru_cache(maxsize=1)(recipe.dense_adam)
_data, _step, _run, _specs, _largest_move = (recipe.data, recipe.train_step, recipe.run,
                                             recipe.specs, recipe.largest_move)
TX, STEPS = recipe.TX, recipe.STEPS


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
