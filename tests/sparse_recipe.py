"""The dense-exact recipe of docs/sparse.md, as a user runs it: shared by
``test_sparse_recipes.py`` and the two-process script ``two_process_recipe.py``.

An embedding table beside a dense tower (the bag's mean row, a tanh layer, a linear
head), ``sparse.adam`` with warm-up + cosine, 300 steps of Zipfian ids, each step
bringing the batch's rows up to date first (``catch_up(rows=)``). Importing it starts
no JAX backend.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax

import lars_optax

ROWS, DIM, HIDDEN, BATCH, BAG, STEPS = 2048, 8, 16, 32, 4, 300
SCHEDULE = optax.warmup_cosine_decay_schedule(0.0, 1e-2, 30, STEPS)
TX = lars_optax.sparse.adam(SCHEDULE)


def data():
  """``(params, ids, ys)`` as host arrays: the same in every process."""
  rng = np.random.default_rng(0)
  ids = ((rng.zipf(1.2, size=(STEPS, BATCH, BAG)) - 1) % ROWS).astype(np.int32)
  truth = rng.normal(size=(ROWS,)).astype(np.float32)
  ys = truth[ids].mean(-1) + 0.1 * rng.normal(size=(STEPS, BATCH)).astype(np.float32)
  params = {"table": rng.normal(size=(ROWS, DIM)).astype(np.float32) * 0.1,
            "w1": rng.normal(size=(DIM, HIDDEN)).astype(np.float32) / np.sqrt(DIM),
            "b1": np.zeros(HIDDEN, np.float32),
            "w2": rng.normal(size=(HIDDEN,)).astype(np.float32) / np.sqrt(HIDDEN)}
  return params, ids, ys


def loss(p, ids, y, out_sharding=None, parts=1):
  rows = (p["table"][ids] if out_sharding is None
          else p["table"].at[ids].get(out_sharding=out_sharding))
  hidden = jnp.tanh(rows.mean(axis=1) @ p["w1"] + p["b1"])
  return jnp.mean((hidden @ p["w2"] - y) ** 2) / parts


def train_step(axis_name=None, **loss_kw):
  """The recipe's train step: the batch's rows up to date, sparse gradients, the step."""
  grad_fn = lars_optax.sparse.value_and_grad(functools.partial(loss, **loss_kw),
                                             sparse="table", axis_name=axis_name)

  def step(p, s, ids, y):
    p, s = lars_optax.sparse.catch_up(TX, p, s, rows={"table": ids}, axis_name=axis_name)
    _, g = grad_fn(p, ids, y)
    u, s = TX.update(g, s, p)
    return optax.apply_updates(p, u), s

  return step


def run(step, params, state, ids, ys, every=False):
  """The steps over the batches in one compiled scan: the last ``(params, state)``, or
  with ``every`` each step's, stacked."""
  def body(carry, batch):
    carry = step(*carry, *batch)
    return carry, carry if every else None

  last, stacked = jax.jit(lambda c, xs: jax.lax.scan(body, c, xs))((params, state), (ids, ys))
  return stacked if every else last


def one_device():
  """One device's ``(params, state)`` at every step, host copies: ``STEPS + 1`` of them."""
  params, ids, ys = data()
  params = jax.tree.map(jnp.asarray, params)
  state = TX.init(params)
  stacked = jax.device_get(run(train_step(), params, state, ids, ys, every=True))
  return [jax.device_get((params, state))] + [
      jax.tree.map(lambda x, i=i: x[i], stacked) for i in range(STEPS)]


def dense_adam():
  """Dense ``optax.adam`` on one device, free-running: the final params (host copies)."""
  params, ids, ys = data()
  params = jax.tree.map(jnp.asarray, params)
  tx = optax.adam(SCHEDULE)

  def step(p, s, i, y):
    g = jax.grad(loss)(p, i, y)
    u, s = tx.update(g, s, p)
    return optax.apply_updates(p, u), s

  (params, _), _ = jax.jit(lambda c: jax.lax.scan(
      lambda c, b: (step(*c, *b), None), c, (ids, ys)))((params, tx.init(params)))
  return jax.device_get(params)


def specs(tree):
  """The table and its per-row state split by rows over "x"; the rest replicated."""
  from jax.sharding import PartitionSpec as P
  return jax.tree.map(lambda a: P("x") if np.shape(a)[:1] == (ROWS,) else P(), tree)


def largest_move(final, first):
  return max(float(np.abs(np.asarray(a) - np.asarray(b)).max())
             for a, b in zip(jax.tree.leaves(final), jax.tree.leaves(first)))
