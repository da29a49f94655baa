"""Tests for lars_optax.sparse: row-sparse (BCOO) gradients and lazy steps on them.

Covered: the lazy optimizers on BCOO gradient leaves equal the dense lazy path
(and MXNet's row_sparse fixtures); duplicates are summed; a listed all-zero row
is present; dense leaves in the same tree; the update is row-sparse and
``optax.apply_updates`` adds it by a scatter, with no table-sized temporary
(``memory_analysis``); Flax ``TrainState`` and ``nnx.Optimizer``; the errors
(layout, index dtype, shape, out-of-range, optimizers that are not row-wise);
:func:`lars_optax.sparse.value_and_grad` with Flax linen, nnx, Haiku and
Equinox models; :func:`lars_optax.sparse.psum` under ``pmap``.
"""

import json
import pathlib

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import optimizers
from conftest import as_row_sparse as _as_row_sparse
from jax.experimental.sparse import BCOO

import lars_optax


def _bcoo(values, rows, shape):
  return BCOO((jnp.asarray(values), jnp.asarray(rows)[:, None]), shape=shape)


def _dense(values, rows, shape):
  out = np.zeros(shape, np.float32)
  np.add.at(out, np.asarray(rows), np.asarray(values))
  return jnp.asarray(out)


def _params(n=8, d=3):
  rng = np.random.default_rng(0)
  return {"emb": jnp.asarray(rng.normal(size=(n, d)), jnp.float32),
          "w": jnp.asarray(rng.normal(size=(d, 2)), jnp.float32)}


OPTIMIZERS = {  # every lazy step of the one table (tests/optimizers.py), and two other paths
    **{name: lambda name=name: optimizers.lazy_step(optimizers.BY_NAME[name])
       for name in optimizers.LAZY},
    "create_adam": lambda: lars_optax.mxnet.create("adam", learning_rate=0.01, lazy_update=True),
    "create_sgd": lambda: lars_optax.mxnet.create("sgd", momentum=0.9, lazy_update=True),
    "wrapped_optax_adam": lambda: lars_optax.sparse.lazy_update(optax.adam(0.01)),
}

STEPS = [([1, 4, 1], 0), ([0, 4], 1), ([7], 2), ([2, 2, 2, 5], 3)]


def _run(tx, params, sparse, jit=True):
  update = jax.jit(tx.update) if jit else tx.update
  state = tx.init(params)
  rng = np.random.default_rng(1)
  for rows, _ in STEPS:
    values = rng.normal(size=(len(rows), params["emb"].shape[1])).astype(np.float32)
    emb = (_bcoo(values, rows, params["emb"].shape) if sparse
           else _dense(values, rows, params["emb"].shape))
    grads = {"emb": emb, "w": jnp.asarray(rng.normal(size=(3, 2)), jnp.float32)}
    updates, state = update(grads, state, params)
    if sparse:
      assert isinstance(updates["emb"], BCOO)
    params = optax.apply_updates(params, updates)
  return params, state


@pytest.mark.op_by_op
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_lazy_step_on_bcoo_equals_dense_lazy_path(name):
  params = _params()
  p_sparse, s_sparse = _run(OPTIMIZERS[name](), params, sparse=True)
  p_dense, s_dense = _run(OPTIMIZERS[name](), params, sparse=False)
  chex.assert_trees_all_close(p_sparse, p_dense, rtol=1e-6, atol=1e-7)
  chex.assert_trees_all_close(s_sparse, s_dense, rtol=1e-6, atol=1e-7)
  # Rows 3 and 6 never appear: untouched.
  np.testing.assert_array_equal(p_sparse["emb"][np.array([3, 6])], params["emb"][np.array([3, 6])])


def test_lazy_step_on_bcoo_without_jit_equals_jit():
  params = _params()
  tx = OPTIMIZERS["mxnet.adam"]()
  chex.assert_trees_all_close(_run(tx, params, True, jit=False), _run(tx, params, True),
                              rtol=1e-6, atol=1e-7)


def test_duplicate_rows_are_summed():
  params = {"emb": jnp.ones((4, 2))}
  tx = lars_optax.mxnet.sgd(1.0, lazy_update=True)
  g = _bcoo([[1.0, 2.0], [3.0, 4.0], [0.5, 0.5]], [2, 2, 0], (4, 2))
  updates, _ = tx.update({"emb": g}, tx.init(params), params)
  np.testing.assert_allclose(updates["emb"].todense(),
                             [[-0.5, -0.5], [0, 0], [-4.0, -6.0], [0, 0]])


def test_row_listed_with_zero_values_is_present():
  """As MXNet's row_sparse: a listed row is updated even if its values are 0."""
  params = {"emb": jnp.ones((3, 2))}
  tx = lars_optax.mxnet.sgd(0.1, wd=0.5, lazy_update=True)  # wd moves a present row
  g = _bcoo(np.zeros((1, 2), np.float32), [1], (3, 2))
  updates, _ = tx.update({"emb": g}, tx.init(params), params)
  new = optax.apply_updates(params, updates)["emb"]
  np.testing.assert_allclose(new, [[1, 1], [0.95, 0.95], [1, 1]])


@pytest.mark.op_by_op
def test_scalar_state_counts_every_step():
  params = _params()
  _, state = _run(OPTIMIZERS["mxnet.adam"](), params, sparse=True)
  assert int(optax.tree_utils.tree_get(state, "count")) == len(STEPS)


@pytest.mark.op_by_op
def test_dense_leaf_in_the_tree_follows_the_dense_lazy_rule():
  params = {"emb": jnp.ones((4, 2)), "b": jnp.ones((3,))}
  tx = lars_optax.mxnet.adam(0.1, lazy_update=True)
  grads = {"emb": _bcoo([[1.0, 1.0]], [0], (4, 2)), "b": jnp.array([0.0, 2.0, 0.0])}
  updates, state = tx.update(grads, tx.init(params), params)
  np.testing.assert_array_equal(np.asarray(updates["b"])[[0, 2]], 0.0)
  assert float(updates["b"][1]) != 0
  np.testing.assert_array_equal(np.asarray(optax.tree_utils.tree_get(state, "mu")["b"])[[0, 2]],
                                0.0)


@pytest.mark.parametrize("kind", ["bcoo", "row_sparse"])
def test_update_is_row_sparse_of_the_gradients_type_and_apply_updates_scatters(kind):
  """The update has the gradient's pytree type: a plain BCOO for a plain BCOO (so
  that optax.apply_if_finite's zero tree of the gradient matches it), a
  RowSparseUpdate for a RowSparseUpdate."""
  params = {"emb": jnp.zeros((5, 2))}
  tx = lars_optax.mxnet.sgd(1.0, lazy_update=True)
  grad = (_bcoo([[1.0, 2.0]], [3], (5, 2)) if kind == "bcoo"
          else lars_optax.sparse.row_sparse(jnp.array([[1.0, 2.0]]), rows=jnp.array([3]),
                                            num_rows=5))
  updates, _ = tx.update({"emb": grad}, tx.init(params), params)
  u = updates["emb"]
  assert type(u) is type(grad)
  assert jax.tree.structure(u) == jax.tree.structure(grad)
  assert u.shape == (5, 2)
  np.testing.assert_array_equal(u.indices[:, 0], [3])
  new = optax.apply_updates(params, updates)["emb"]
  np.testing.assert_array_equal(new, np.array([[0, 0], [0, 0], [0, 0], [-1, -2], [0, 0]]))
  assert new.dtype == jnp.float32


@pytest.mark.parametrize("name", ["mxnet.adam", "mxnet.sgd", "adam_masters_float16"])
def test_donated_step_has_no_table_sized_temporary(name):
  """Also with float32 masters for a float16 table: their float32 update is added
  on its rows only, never by widening the table (XLA's CPU scatter widens a whole
  bfloat16 table by itself, so float16 is the case checked here)."""
  n, d, k = 100_000, 32, 64
  masters = name == "adam_masters_float16"
  dtype = np.float16 if masters else np.float32
  params = {"emb": jnp.zeros((n, d), dtype)}
  tx = (lars_optax.mxnet.adam(0.1, lazy_update=True, multi_precision=True) if masters
        else OPTIMIZERS[name]())
  state = tx.init(params)
  grads = {"emb": _bcoo(np.ones((k, d), dtype), np.arange(k) * 7, (n, d))}

  def step(params, state, grads):
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  compiled = jax.jit(step, donate_argnums=(0, 1)).lower(params, state, grads).compile()
  mem = compiled.memory_analysis()
  table = n * d * 4
  assert mem.temp_size_in_bytes < table // 20, (mem.temp_size_in_bytes, table)
  # Params and every buffer (moments, momentum, masters) are updated in place.
  buffers = sum(x.nbytes for x in jax.tree.leaves((params, state)) if x.shape == (n, d))
  assert buffers >= table * (2 if name == "mxnet.sgd" else 3)
  assert mem.alias_size_in_bytes >= buffers


def test_wider_row_sparse_update_keeps_the_tables_dtype_and_sums_repeated_rows():
  table = jnp.asarray([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], jnp.float16)
  u = lars_optax.sparse.row_sparse(jnp.asarray([[0.25, 0.5], [0.5, 0.25], [1.0, 1.0]], jnp.float32),
                            rows=jnp.array([2, 0, 2]), num_rows=3)
  new = table + u
  assert new.dtype == jnp.float16
  expected = np.asarray(table, np.float32) + np.asarray(u.todense())
  np.testing.assert_array_equal(np.asarray(new, np.float32), expected.astype(np.float16))
  chex.assert_trees_all_equal(optax.apply_updates({"t": table}, {"t": u}),
                              optax.apply_updates({"t": table}, {"t": u.todense()}))


def test_bfloat16_params_take_bcoo_gradients():
  params = {"emb": jnp.ones((4, 2), jnp.bfloat16)}
  tx = lars_optax.mxnet.sgd(0.5, lazy_update=True)
  g = _bcoo(np.ones((1, 2), np.float32), [1], (4, 2))
  updates, _ = jax.jit(tx.update)({"emb": g}, tx.init(params), params)
  new = optax.apply_updates(params, updates)["emb"]
  assert new.dtype == jnp.bfloat16
  np.testing.assert_array_equal(np.asarray(new, np.float32), [[1, 1], [0.5, 0.5], [1, 1], [1, 1]])


# --------------------------------------------------------------------------
# MXNet's row_sparse fixtures
# --------------------------------------------------------------------------

REF = json.loads(
    (pathlib.Path(__file__).parent / "reference" / "mxnet_optimizers.json").read_text())
CASES = {c["name"]: c for c in REF["cases"]}


@pytest.mark.parametrize("name", ["adam_lazy", "sgd_lazy"])
def test_matches_mxnet_row_sparse_fixtures(name):
  case = CASES[name]
  tx = lars_optax.mxnet.create(case["optimizer"], **case["kwargs"])
  params = {k: jnp.asarray(v, jnp.float32) for k, v in case["params"].items()}
  state = tx.init(params)

  @jax.jit
  def step(params, state, grads):
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  for t, grads in enumerate(case["grads"]):
    params, state = step(params, state, {k: _as_row_sparse(g) for k, g in grads.items()})
    for k, expected in case["weights"][t].items():
      exp = np.asarray(expected)
      err = np.abs(np.asarray(params[k]) - exp).max() / max(np.abs(exp).max(), 1e-30)
      assert err < 1e-4, (t, k, err)


# --------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------


def test_lars_rejects_bcoo_naming_the_leaf():
  params = _params()
  tx = lars_optax.lars(0.1)
  grads = {"emb": _bcoo([[1.0, 1.0, 1.0]], [0], (8, 3)), "w": jnp.ones((3, 2))}
  with pytest.raises(ValueError, match=r"lars: gradient 'emb' is row-sparse"):
    tx.update(grads, tx.init(params), params)


@pytest.mark.parametrize("inner", [
    lambda: lars_optax.lars(0.1),
    lambda: optax.chain(optax.clip_by_global_norm(1.0), optax.sgd(0.1)),
    lambda: lars_optax.tf_lars(0.1),
], ids=["lars", "clip_by_global_norm", "tf_lars"])
def test_not_row_wise_inner_raises_naming_the_leaf(inner):
  params = _params()
  tx = lars_optax.sparse.lazy_update(inner())
  grads = {"emb": _bcoo([[1.0, 1.0, 1.0]], [0], (8, 3)), "w": jnp.ones((3, 2))}
  with pytest.raises(ValueError, match=r"gradient 'emb' is row-sparse.*not row-wise"):
    tx.update(grads, tx.init(params), params)


def test_buffers_of_an_unknown_state_are_found_by_structure():
  """A state type lars_optax does not list: its params-shaped field is still gathered."""
  from typing import NamedTuple

  class MyState(NamedTuple):
    acc: dict
    steps: jax.Array

  def init(params):
    return MyState(jax.tree.map(jnp.zeros_like, params), jnp.zeros([], jnp.int32))

  def update(updates, state, params=None):
    del params
    acc = jax.tree.map(lambda a, g: a + g * g, state.acc, updates)
    return jax.tree.map(lambda g, a: -g / jnp.sqrt(a + 1.0), updates, acc), MyState(
        acc, state.steps + 1)

  tx = lars_optax.sparse.lazy_update(optax.GradientTransformation(init, update))
  params = {"emb": jnp.ones((5, 2))}
  sparse_g = {"emb": _bcoo(np.full((1, 2), 2.0, np.float32), [3], (5, 2))}
  _, state = jax.jit(tx.update)(sparse_g, tx.init(params), params)
  np.testing.assert_array_equal(state.acc["emb"], [[0, 0], [0, 0], [0, 0], [4, 4], [0, 0]])
  assert int(state.steps) == 1


def test_reduction_over_a_state_buffer_is_not_row_wise():
  """A rule that mixes rows of its state only (not of the gradient) is caught too."""

  def init(params):
    return optax.TraceState(trace=jax.tree.map(jnp.ones_like, params))

  def update(updates, state, params=None):
    del params
    out = jax.tree.map(lambda g, t: g / jnp.sum(t), updates, state.trace)
    return out, optax.TraceState(trace=jax.tree.map(jnp.add, state.trace, updates))

  params = {"emb": jnp.ones((5, 2))}
  tx = lars_optax.sparse.lazy_update(optax.GradientTransformation(init, update))
  with pytest.raises(ValueError, match=r"gradient 'emb' is row-sparse.*not row-wise"):
    tx.update({"emb": _bcoo(np.ones((1, 2), np.float32), [1], (5, 2))}, tx.init(params), params)


def _lazy_update_error(grad, shape=(4, 2)):
  params = {"emb": jnp.ones(shape)}
  tx = lars_optax.mxnet.adam(0.1, lazy_update=True)
  tx.update({"emb": grad}, tx.init(params), params)


@pytest.mark.op_by_op
def test_wrong_layout_raises_naming_the_leaf():
  g = BCOO.fromdense(jnp.eye(4, 2))  # n_sparse == 2
  with pytest.raises(ValueError, match=r"gradient 'emb' is a BCOO with n_batch=0, n_sparse=2"):
    _lazy_update_error(g)


def test_float_indices_raise_naming_the_leaf():
  # e.g. after jax.tree.map(lambda x: x.astype(jnp.float32), grads), which casts indices too
  g = jax.tree.map(lambda x: x.astype(jnp.float32), _bcoo(np.ones((1, 2), np.float32), [1], (4, 2)))
  with pytest.raises(TypeError, match=r"gradient 'emb' is a row-sparse BCOO with indices of "
                                      r"dtype float32"):
    _lazy_update_error(g)


def test_shape_differing_from_param_raises_naming_the_leaf():
  with pytest.raises(ValueError, match=r"gradient 'emb' has shape \(5, 2\).*\(4, 2\)"):
    _lazy_update_error(_bcoo(np.ones((1, 2), np.float32), [1], (5, 2)))


@pytest.mark.parametrize("row", [-1, 5, 100])
def test_out_of_range_rows_raise_when_concrete(row):
  with pytest.raises(ValueError, match=r"gradient 'emb' has row indices out of range"):
    _lazy_update_error(_bcoo(np.ones((1, 2), np.float32), [row], (4, 2)))


@pytest.mark.parametrize("row", [-1, 5, 100])
def test_out_of_range_rows_raise_under_jit(row):
  params = {"emb": jnp.ones((4, 2))}
  tx = lars_optax.mxnet.sgd(1.0, lazy_update=True)
  g = _bcoo(np.ones((3, 2), np.float32), [1, row, 2], (4, 2))
  with pytest.raises(Exception, match=rf"gradient 'emb' has row indices out of range .*\[{row}\]"):
    jax.block_until_ready(jax.jit(tx.update)({"emb": g}, tx.init(params), params))


def test_padding_index_is_not_out_of_range_under_jit():
  params = {"emb": jnp.ones((4, 2))}
  tx = lars_optax.mxnet.sgd(1.0, lazy_update=True)
  g = _bcoo(np.ones((3, 2), np.float32), [4, 1, 4], (4, 2))
  updates, _ = jax.jit(tx.update)({"emb": g}, tx.init(params), params)
  new = optax.apply_updates(params, updates)["emb"]
  np.testing.assert_array_equal(new, [[1, 1], [0, 0], [1, 1], [1, 1]])


# --------------------------------------------------------------------------
# Flax TrainState and nnx.Optimizer
# --------------------------------------------------------------------------


def test_flax_train_state_apply_gradients():
  from flax.training import train_state

  params = _params()
  ts = train_state.TrainState.create(apply_fn=None, params=params,
                                     tx=lars_optax.mxnet.adam(0.1, lazy_update=True))
  grads = {"emb": _bcoo([[1.0, 1.0, 1.0]], [2], (8, 3)), "w": jnp.zeros((3, 2))}
  new = jax.jit(lambda ts, g: ts.apply_gradients(grads=g))(ts, grads)
  changed = np.nonzero(np.any(np.asarray(new.params["emb"] != params["emb"]), axis=1))[0]
  np.testing.assert_array_equal(changed, [2])
  assert int(new.step) == 1


# --------------------------------------------------------------------------
# sparse_value_and_grad with unchanged models
# --------------------------------------------------------------------------

IDS = jnp.array([[1, 2, 2], [7, 1, 49]], jnp.int32)
Y = jnp.array([0.5, -1.0])


def _check_grads(sparse_g, dense_g, max_rows=8):
  leaves, _ = jax.tree.flatten(sparse_g, is_leaf=lambda x: isinstance(x, BCOO))
  dense_leaves = jax.tree.leaves(dense_g)
  assert any(isinstance(x, BCOO) for x in leaves)
  for s, d in zip(leaves, dense_leaves):
    if isinstance(s, BCOO):
      assert s.data.shape[0] == max_rows
      np.testing.assert_array_equal(np.unique(np.asarray(s.indices)), [1, 2, 7, 49, 50])
      s = s.todense()
    np.testing.assert_allclose(s, d, rtol=1e-6, atol=1e-8)


def _linen():
  import flax.linen as nn

  class Bag(nn.Module):
    @nn.compact
    def __call__(self, ids):
      return nn.Dense(1)(nn.Embed(50, 4)(ids).mean(axis=1))[:, 0]

  model = Bag()
  params = model.init(jax.random.key(0), IDS)["params"]
  return params, lambda p, ids, y: jnp.mean((model.apply({"params": p}, ids) - y) ** 2)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_value_and_grad_flax_linen_embed(jit):
  params, loss = _linen()
  fn = lars_optax.sparse.value_and_grad(loss, sparse="embedding", max_rows=8)
  fn = jax.jit(fn) if jit else fn
  value, grads = fn(params, IDS, Y)
  ref_value, ref_grads = jax.value_and_grad(loss)(params, IDS, Y)
  np.testing.assert_allclose(value, ref_value, rtol=1e-6)
  _check_grads(grads, ref_grads)


def test_value_and_grad_flax_nnx_embed_with_nnx_optimizer():
  from flax import nnx

  class Bag(nnx.Module):
    def __init__(self, rngs):
      self.embed = nnx.Embed(50, 4, rngs=rngs)
      self.out = nnx.Linear(4, 1, rngs=rngs)

    def __call__(self, ids):
      return self.out(self.embed(ids).mean(axis=1))[:, 0]

  model = Bag(nnx.Rngs(0))
  graphdef, params = nnx.split(model, nnx.Param)
  loss = lambda p, ids, y: jnp.mean((nnx.merge(graphdef, p)(ids) - y) ** 2)
  _, grads = lars_optax.sparse.value_and_grad(loss, sparse="embedding", max_rows=8)(params, IDS, Y)
  ref = nnx.grad(lambda m: jnp.mean((m(IDS) - Y) ** 2))(model)
  _check_grads(grads, ref)
  optimizer = nnx.Optimizer(model, lars_optax.mxnet.adam(0.1, lazy_update=True), wrt=nnx.Param)
  before = np.asarray(model.embed.embedding[...])
  optimizer.update(model, grads)
  changed = np.nonzero(np.any(np.asarray(model.embed.embedding[...]) != before, axis=1))[0]
  np.testing.assert_array_equal(changed, [1, 2, 7, 49])


@pytest.mark.op_by_op
def test_value_and_grad_haiku_embed():
  import haiku as hk

  f = hk.without_apply_rng(hk.transform(
      lambda ids: hk.Linear(1)(hk.Embed(50, 4)(ids).mean(axis=1))[:, 0]))
  params = f.init(jax.random.key(0), IDS)
  loss = lambda p, ids, y: jnp.mean((f.apply(p, ids) - y) ** 2)
  _, grads = lars_optax.sparse.value_and_grad(loss, sparse="embeddings", max_rows=8)(params, IDS, Y)
  _check_grads(grads, jax.grad(loss)(params, IDS, Y))


def test_value_and_grad_equinox_embedding():
  import equinox as eqx

  model = eqx.nn.Embedding(50, 4, key=jax.random.key(1))
  loss = lambda m, ids, y: jnp.mean((jax.vmap(jax.vmap(m))(ids).mean(axis=(1, 2)) - y) ** 2)
  _, grads = jax.jit(lars_optax.sparse.value_and_grad(loss, sparse="weight", max_rows=8))(model,
                                                                                          IDS, Y)
  _check_grads(grads, jax.grad(loss)(model, IDS, Y))


def test_value_and_grad_has_aux():
  params, loss = _linen()
  fn = lars_optax.sparse.value_and_grad(lambda p, i, y: (loss(p, i, y), {"n": i.size}),
                                        sparse="embedding",
                             max_rows=8, has_aux=True)
  (value, aux), _ = fn(params, IDS, Y)
  np.testing.assert_allclose(value, loss(params, IDS, Y), rtol=1e-6)
  assert int(aux["n"]) == IDS.size


def test_value_and_grad_whole_train_step_has_no_table_sized_temporary():
  import flax.linen as nn

  n = 100_000

  class Bag(nn.Module):
    @nn.compact
    def __call__(self, ids):
      return nn.Dense(1)(nn.Embed(n, 32)(ids).mean(axis=1))[:, 0]

  model = Bag()
  ids = jnp.asarray(np.random.default_rng(0).integers(0, n, (64, 4)), jnp.int32)
  params = model.init(jax.random.key(0), ids)["params"]
  tx = lars_optax.mxnet.adam(0.01, lazy_update=True)
  grad_fn = lars_optax.sparse.value_and_grad(
      lambda p, ids: jnp.mean(model.apply({"params": p},
                                          ids) ** 2), sparse="embedding", max_rows=256)

  def step(params, state, ids):
    _, grads = grad_fn(params, ids)
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  state = tx.init(params)
  compiled = jax.jit(step, donate_argnums=(0, 1)).lower(params, state, ids).compile()
  assert compiled.memory_analysis().temp_size_in_bytes < n * 32 * 4 // 20


def test_value_and_grad_too_many_rows_raises_when_concrete():
  params, loss = _linen()
  with pytest.raises(ValueError, match=r"max_rows: a lookup of 'Embed_0/embedding' reads 4"):
    lars_optax.sparse.value_and_grad(loss, sparse="embedding", max_rows=3)(params, IDS, Y)


def test_value_and_grad_other_use_of_the_table_raises():
  params = {"emb": jnp.ones((5, 2))}
  loss = lambda p, ids: p["emb"][ids].sum() + jnp.sum(p["emb"] ** 2)
  with pytest.raises(ValueError, match=r"sparse: the leaf 'emb' is used by"):
    lars_optax.sparse.value_and_grad(loss, sparse="emb", max_rows=4)(params, jnp.array([1, 2]))


@pytest.mark.parametrize("max_rows", [0, 2.5, True])
def test_value_and_grad_bad_max_rows(max_rows):
  with pytest.raises(ValueError, match="max_rows"):
    lars_optax.sparse.value_and_grad(lambda p: p, sparse="emb", max_rows=max_rows)


def test_value_and_grad_two_lookups_of_one_table():
  params = {"emb": jnp.arange(10.0).reshape(5, 2)}
  loss = lambda p, a, b: jnp.sum(p["emb"][a] * p["emb"][b])
  a, b = jnp.array([0, 1]), jnp.array([1, 3])
  _, g = lars_optax.sparse.value_and_grad(loss, sparse="emb", max_rows=2)(params, a, b)
  assert g["emb"].data.shape[0] == 4
  np.testing.assert_allclose(g["emb"].todense(), jax.grad(loss)(params, a, b)["emb"])


# --------------------------------------------------------------------------
# Data parallelism
# --------------------------------------------------------------------------


def _data_parallel_step(name, n_dev, seed):
  """A linen embedding model, its state, a batch of 2 examples per device and a step.

  The step sums the replicas' row-sparse gradients over ``axis_name`` when given.
  """
  params, loss = _linen()
  tx = OPTIMIZERS[name]()
  state = tx.init(params)
  rng = np.random.default_rng(seed)
  ids = jnp.asarray(rng.integers(0, 50, (n_dev * 2, 3)), jnp.int32)
  y = jnp.asarray(rng.normal(size=n_dev * 2), jnp.float32)
  summed = lambda p, i, t: loss(p, i, t) * i.shape[0]  # a sum over the examples
  grad_fn = lars_optax.sparse.value_and_grad(summed, sparse="embedding", max_rows=ids.size)

  def step(params, state, ids, y, axis_name=None):
    _, grads = grad_fn(params, ids, y)
    if axis_name:
      grads = lars_optax.sparse.psum(grads, axis_name)
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  return params, state, ids, y, step


@pytest.mark.parametrize("name", ["mxnet.adam", "mxnet.sgd"])
def test_pmap_step_equals_single_device_step_on_the_whole_batch(name):
  n_dev = jax.local_device_count()
  params, state, ids, y, step = _data_parallel_step(name, n_dev, seed=2)
  single = jax.jit(step)(params, state, ids, y)
  rep = lambda x: jnp.broadcast_to(x, (n_dev, *jnp.shape(x)))
  multi = jax.pmap(lambda p, s, i, t: step(p, s, i, t, "batch"), axis_name="batch")(
      jax.tree.map(rep, params), jax.tree.map(rep, state),
      ids.reshape(n_dev, 2, 3), y.reshape(n_dev, 2))
  for k in range(n_dev):
    chex.assert_trees_all_close(jax.tree.map(lambda x, k=k: x[k], multi), single,
                                rtol=1e-5, atol=1e-6)


def test_sparse_psum_mean_divides_by_axis_size():
  n_dev = jax.local_device_count()
  g = {"emb": _bcoo(np.ones((1, 2), np.float32), [1], (4, 2)), "b": jnp.ones(2)}
  rep = lambda x: jnp.broadcast_to(x, (n_dev, *jnp.shape(x)))

  def mean(g):
    out = lars_optax.sparse.psum(g, "i", mean=True)
    assert out["emb"].data.shape[0] == n_dev  # every replica's rows, gathered
    return {"emb": out["emb"].todense(), "b": out["b"]}

  out = jax.pmap(mean, axis_name="i")(jax.tree.map(rep, g))
  np.testing.assert_allclose(out["b"][0], [1.0, 1.0])
  np.testing.assert_allclose(out["emb"][0], [[0, 0], [1.0, 1.0], [0, 0], [0, 0]], rtol=1e-6)


def test_sparse_psum_unbound_axis_names_the_option():
  with pytest.raises(ValueError, match="axis_name: 'nope' is not bound"):
    lars_optax.sparse.psum({"b": jnp.ones(2)}, "nope")


# --------------------------------------------------------------------------
# The benchmark script (a quick smoke run)
# --------------------------------------------------------------------------


@pytest.mark.slow  # (a benchmark's quick run)
def test_benchmark_quick_run_prints_a_markdown_table():
  import importlib.util

  path = pathlib.Path(__file__).parent.parent / "benchmarks" / "sparse_embedding.py"
  spec = importlib.util.spec_from_file_location("sparse_embedding_benchmark", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  report = module.main(["--quick", "--rounds", "1", "--rows", "2000"])
  assert "2,000 x 64 float32 table" in report
  assert ("| lars_optax.mxnet.adam(lazy_update=True), BCOO gradient (unique_indices=True) |"
          in report)
  assert "multi_precision=True), float16 table" in report
  assert "not run (no --mxnet-python)" in report


def test_shard_map_step_equals_single_device_step_on_the_whole_batch():
  from jax.sharding import Mesh
  from jax.sharding import PartitionSpec as P

  mesh = Mesh(np.array(jax.devices()), ("batch",))
  n_dev = len(jax.devices())
  params, state, ids, y, step = _data_parallel_step("mxnet.adam", n_dev, seed=3)
  single = jax.jit(step)(params, state, ids, y)
  sharded = jax.jit(jax.shard_map(
      lambda p, s, i, t: step(p, s, i, t, "batch"), mesh=mesh,
      in_specs=(P(), P(), P("batch"), P("batch")), out_specs=P(), check_vma=False))
  chex.assert_trees_all_close(sharded(params, state, ids, y), single, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", sorted(set(lars_optax.mxnet.registered()) - {
    n.removeprefix("mxnet.") for n in optimizers.ROW_SPARSE}))
def test_every_registered_optimizer_without_lazy_updates_rejects_a_bcoo_naming_the_leaf(name):
  params = {"emb": jnp.ones((5, 3))}
  grads = {"emb": lars_optax.sparse.row_sparse(jnp.ones((2, 3)), rows=jnp.array([0, 3]),
                                               num_rows=5)}
  tx = lars_optax.mxnet.create(name)
  with pytest.raises(ValueError, match=rf"{name}: gradient 'emb' is row-sparse \(a BCOO\)"):
    tx.update(grads, tx.init(params), params)


# --------------------------------------------------------------------------
# Applying a row-sparse update: optax, Equinox, Flax TrainState, nnx.Optimizer
# --------------------------------------------------------------------------

SPARSE_ROWS = np.array([1, 4, 9])


def _rows_grad(dense):
  """The rows SPARSE_ROWS of a dense table gradient, as a row-sparse BCOO."""
  return lars_optax.sparse.row_sparse(dense[SPARSE_ROWS], rows=jnp.asarray(SPARSE_ROWS),
                                      num_rows=dense.shape[0])


def _table_grad(shape, seed=5):
  rng = np.random.default_rng(seed)
  g = np.zeros(shape, np.float32)
  g[SPARSE_ROWS] = rng.normal(size=(len(SPARSE_ROWS), shape[1]))
  return jnp.asarray(g)


class _EqxBag:
  """An Equinox embedding bag (an Embedding and an MLP whose activation is a leaf)."""

  @staticmethod
  def model():
    import equinox as eqx

    class Bag(eqx.Module):
      emb: eqx.nn.Embedding
      mlp: eqx.nn.MLP

      def __init__(self, key):
        k1, k2 = jax.random.split(key)
        self.emb = eqx.nn.Embedding(12, 4, key=k1)
        self.mlp = eqx.nn.MLP(4, 1, 8, 1, key=k2)

    return Bag(jax.random.key(0))

  @staticmethod
  def grads(model, sparse):
    import equinox as eqx

    params = eqx.filter(model, eqx.is_array)
    dense = jax.tree.map(jnp.ones_like, params)
    table = _table_grad(model.emb.weight.shape)
    return eqx.tree_at(lambda m: m.emb.weight, dense, _rows_grad(table) if sparse else table)


def _apply_lars_optax(model, updates):
  return lars_optax.sparse.apply_updates(model, updates)


def _apply_partition_combine(model, updates):
  """The other idiom of docs/troubleshooting.md: apply to the arrays, then combine."""
  import equinox as eqx

  params, static = eqx.partition(model, eqx.is_array)
  return eqx.combine(optax.apply_updates(params, updates), static)


@pytest.mark.op_by_op
@pytest.mark.parametrize("apply", [_apply_lars_optax, _apply_partition_combine],
                         ids=["lars_optax_apply_updates", "partition_combine"])
def test_equinox_model_takes_a_row_sparse_update(apply):
  """lars_optax.sparse.apply_updates, the drop-in for eqx.apply_updates (whole model, None
  updates, row-sparse leaves), and the partition/combine idiom: equal to
  optax.apply_updates on the arrays and to eqx.apply_updates of the dense step."""
  import equinox as eqx

  model = _EqxBag.model()
  tx = lars_optax.mxnet.adam(0.1, lazy_update=True)
  params = eqx.filter(model, eqx.is_array)
  state = tx.init(params)

  @eqx.filter_jit
  def step(model, state, grads):
    updates, state = tx.update(grads, state, eqx.filter(model, eqx.is_array))
    return apply(model, updates), updates, state

  new, updates, _ = step(model, state, _EqxBag.grads(model, sparse=True))
  assert isinstance(updates.emb.weight, lars_optax.sparse.RowSparseUpdate)
  assert updates.mlp.activation is None and new.mlp.activation is model.mlp.activation
  chex.assert_trees_all_close(eqx.filter(new, eqx.is_array),
                              optax.apply_updates(params, updates), rtol=1e-5)
  dense_updates, _ = tx.update(_EqxBag.grads(model, sparse=False), state, params)
  chex.assert_trees_all_close(eqx.filter(new, eqx.is_array),
                              eqx.filter(eqx.apply_updates(model, dense_updates), eqx.is_array),
                              rtol=1e-5)
  changed = np.nonzero(np.any(np.asarray(new.emb.weight != model.emb.weight), axis=1))[0]
  np.testing.assert_array_equal(changed, SPARSE_ROWS)


def test_lars_optax_apply_updates_on_dense_trees_is_optax_apply_updates():
  params = {"w": jnp.ones((3,), jnp.bfloat16), "b": jnp.zeros((2,))}
  updates = {"w": jnp.full((3,), 0.25, jnp.float32), "b": jnp.ones((2,))}
  new = lars_optax.sparse.apply_updates(params, updates)
  chex.assert_trees_all_equal(new, optax.apply_updates(params, updates))
  assert new["w"].dtype == jnp.bfloat16  # cast back, as optax does (eqx.apply_updates widens)
  chex.assert_trees_all_equal(lars_optax.sparse.apply_updates(params, {"w": None,
                                                                       "b": updates["b"]}),
                              {"w": params["w"], "b": jnp.ones((2,))})
  with pytest.raises(ValueError, match=r"^apply_updates: the updates' tree is not a prefix"):
    lars_optax.sparse.apply_updates(params, {"w": updates["w"]})
  # A row-sparse update's own errors come through as they are.
  table = {"emb": jnp.zeros((4, 2))}
  bad = lars_optax.sparse.row_sparse(jnp.ones((1, 2)), rows=jnp.array([9]), num_rows=4)
  with pytest.raises(ValueError, match=r"row indices out of range \[0, 4\)"):
    lars_optax.sparse.apply_updates(table, {"emb": bad})


@pytest.mark.op_by_op
@pytest.mark.xfail(strict=True, raises=ValueError, reason=(
    "eqx.apply_updates maps over the updates first, so a row-sparse update (a pytree "
    "node, so that it can leave jit) must match the model's array leaf: 'pytree "
    "structure error'. lars_optax.sparse.dense_updates(tx) returns arrays it takes; "
    "lars_optax.sparse.apply_updates takes the row-sparse update."))
def test_equinox_apply_updates_takes_a_bare_row_sparse_update():
  import equinox as eqx

  model = _EqxBag.model()
  tx = lars_optax.mxnet.adam(0.1, lazy_update=True)
  params = eqx.filter(model, eqx.is_array)
  updates, _ = tx.update(_EqxBag.grads(model, sparse=True), tx.init(params), params)
  new = eqx.apply_updates(model, updates)
  chex.assert_trees_all_close(eqx.filter(new, eqx.is_array),
                              optax.apply_updates(params, updates))


@pytest.mark.parametrize("name", ["adam", "groupadagrad", "ftrl"])
def test_equinox_apply_updates_with_dense_updates_equals_optax_apply_updates(name):
  """eqx.apply_updates(model, updates), Equinox's own idiom, under eqx.filter_jit with
  the model donated: equal to optax.apply_updates of the row-sparse update, and only
  the gradient's rows move."""
  import equinox as eqx

  make = {"adam": lambda: lars_optax.mxnet.adam(0.1, lazy_update=True),
          "groupadagrad": lambda: lars_optax.mxnet.create("groupadagrad", learning_rate=0.1),
          "ftrl": lambda: lars_optax.mxnet.create("ftrl")}[name]
  model = _EqxBag.model()
  params = eqx.filter(model, eqx.is_array)
  grads = _EqxBag.grads(model, sparse=True)
  sparse_tx, tx = make(), lars_optax.sparse.dense_updates(make())
  expected_updates, _ = sparse_tx.update(grads, sparse_tx.init(params), params)
  expected = optax.apply_updates(params, expected_updates)
  expected_model = jax.tree.map(np.asarray, expected)  # (the model's buffers are donated)
  before = np.asarray(model.emb.weight)

  @eqx.filter_jit(donate="all-except-first")
  def step(grads, model, state):
    updates, state = tx.update(grads, state, eqx.filter(model, eqx.is_array))
    return eqx.apply_updates(model, updates), updates, state

  new, updates, _ = step(grads, model, tx.init(params))
  assert isinstance(updates.emb.weight, jax.Array) and updates.emb.weight.shape == (12, 4)
  chex.assert_trees_all_close(eqx.filter(new, eqx.is_array), expected_model,
                              rtol=1e-5)  # (eager vs jit: float32 rounding order)
  changed = np.nonzero(np.any(np.asarray(new.emb.weight) != before, axis=1))[0]
  np.testing.assert_array_equal(changed, SPARSE_ROWS)


@pytest.mark.op_by_op
@pytest.mark.parametrize("dense", [False, True], ids=["row_sparse_update", "dense_updates"])
@pytest.mark.parametrize("name", ["adam", "adagrad", "ftrl"])
def test_flax_train_state_apply_gradients_equals_optax_apply_updates(name, dense):
  from flax.training import train_state

  tx = {"adam": lambda: lars_optax.mxnet.adam(0.1, lazy_update=True),
        "adagrad": lambda: lars_optax.mxnet.create("adagrad", learning_rate=0.1),
        "ftrl": lambda: lars_optax.mxnet.create("ftrl")}[name]()
  tx = lars_optax.sparse.dense_updates(tx) if dense else tx
  params = {"emb": jnp.asarray(np.random.default_rng(0).normal(size=(12, 4)), jnp.float32),
            "w": jnp.ones((4,))}
  grads = {"emb": _rows_grad(_table_grad((12, 4))), "w": jnp.full((4,), 0.5)}
  ts = train_state.TrainState.create(apply_fn=None, params=params, tx=tx)
  new = jax.jit(lambda ts, g: ts.apply_gradients(grads=g))(ts, grads)
  updates, _ = tx.update(grads, tx.init(params), params)
  chex.assert_trees_all_close(new.params, optax.apply_updates(params, updates), rtol=1e-6)
  changed = np.nonzero(np.any(np.asarray(new.params["emb"] != params["emb"]), axis=1))[0]
  np.testing.assert_array_equal(changed, SPARSE_ROWS)


@pytest.mark.op_by_op
@pytest.mark.parametrize("dense", [False, True], ids=["row_sparse_update", "dense_updates"])
def test_nnx_optimizer_update_equals_optax_apply_updates(dense):
  from flax import nnx

  class Bag(nnx.Module):
    def __init__(self, rngs):
      self.embed = nnx.Embed(12, 4, rngs=rngs)
      self.out = nnx.Linear(4, 1, rngs=rngs)

  model = Bag(nnx.Rngs(0))
  tx = lars_optax.mxnet.create("groupadagrad", learning_rate=0.1)
  tx = lars_optax.sparse.dense_updates(tx) if dense else tx
  _, params = nnx.split(model, nnx.Param)
  grads = jax.tree.map(jnp.ones_like, params)
  grads["embed"]["embedding"] = nnx.Param(_rows_grad(_table_grad((12, 4))))
  pure = nnx.to_pure_dict(params)
  pure_grads = jax.tree.map(lambda g: g, nnx.to_pure_dict(grads),
                            is_leaf=lars_optax.sparse.is_row_sparse)
  updates, _ = tx.update(pure_grads, tx.init(pure), pure)
  expected = optax.apply_updates(pure, updates)
  optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
  optimizer.update(model, grads)
  chex.assert_trees_all_close(nnx.to_pure_dict(nnx.state(model, nnx.Param)), expected,
                              rtol=1e-6)


# max_rows: optional, and a bound exceeded under jit raises
# --------------------------------------------------------------------------


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_value_and_grad_without_max_rows_holds_every_row(jit):
  params, loss = _linen()
  ids = jnp.arange(40, dtype=jnp.int32).reshape(4, 10) % 50  # 40 distinct ids
  y = jnp.ones(4)
  fn = lars_optax.sparse.value_and_grad(loss, sparse="embedding")
  fn = jax.jit(fn) if jit else fn
  _, grads = fn(params, ids, y)
  assert grads["Embed_0"]["embedding"].data.shape[0] == ids.size
  ref = jax.grad(loss)(params, ids, y)
  np.testing.assert_allclose(grads["Embed_0"]["embedding"].todense(),
                             ref["Embed_0"]["embedding"], rtol=1e-6, atol=1e-8)


def test_value_and_grad_too_many_rows_raises_under_jit():
  params, loss = _linen()
  ids = jnp.arange(20, dtype=jnp.int32).reshape(2, 10)  # 20 distinct rows
  fn = jax.jit(lars_optax.sparse.value_and_grad(loss, sparse="embedding", max_rows=8))
  with pytest.raises(Exception, match=r"max_rows: a lookup of 'Embed_0/embedding' reads 20 "
                     r"distinct rows, more than max_rows=8"):
    jax.block_until_ready(fn(params, ids, jnp.ones(2)))
  # Within the bound: no error.
  jax.block_until_ready(fn(params, ids % 8, jnp.ones(2)))


@pytest.mark.parametrize("max_rows", [0, -3, 2.5, True, "8"])
def test_value_and_grad_bad_max_rows_names_it(max_rows):
  with pytest.raises(ValueError, match="max_rows: expected an integer >= 1 or None"):
    lars_optax.sparse.value_and_grad(lambda p: p, sparse="emb", max_rows=max_rows)


# --------------------------------------------------------------------------
# tree.map walks into a BCOO: caught, with the cause and the replacement
# --------------------------------------------------------------------------


def _two_grads(n=1000):
  params = {"emb": jnp.ones((n, 2)), "w": jnp.ones(2)}
  loss = lambda p, ids: jnp.sum(p["emb"][ids] @ p["w"])
  fn = lars_optax.sparse.value_and_grad(loss, sparse="emb")
  _, g1 = fn(params, jnp.array([1, 500, 900]))
  _, g2 = fn(params, jnp.array([2, 3, 400]))
  return params, fn, g1, g2


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_tree_map_add_of_two_sparse_gradients_raises_naming_tree_add(jit):
  params, _, g1, g2 = _two_grads()
  summed = jax.tree.map(jnp.add, g1, g2)  # rows 1 + 2 = 3, 500 + 3 = 503, ...: silently wrong
  tx = lars_optax.mxnet.adam(0.1, lazy_update=True)
  update = jax.jit(tx.update) if jit else tx.update
  with pytest.raises(Exception, match=r"lazy_update: gradient 'emb': the row indices of this "
                     r"row-sparse BCOO were changed after it was made.*jax.tree.map\(jnp.add, "
                     r"g1, g2\).*lars_optax.sparse.tree_add"):
    jax.block_until_ready(update(summed, tx.init(params), params))


@pytest.mark.op_by_op
def test_tree_map_add_of_a_zero_tree_keeps_the_rows():
  params, _, g1, _ = _two_grads()
  summed = jax.tree.map(jnp.add, g1, optax.tree_utils.tree_zeros_like(g1))
  tx = lars_optax.mxnet.sgd(1.0, lazy_update=True)
  updates, _ = jax.jit(tx.update)(summed, tx.init(params), params)
  chex.assert_trees_all_close(optax.apply_updates(params, updates),
                              optax.apply_updates(params, tx.update(g1, tx.init(params),
                                                                    params)[0]))


def test_float_indices_name_the_cause_and_the_replacement():
  params, _, g1, _ = _two_grads()
  cast = jax.tree.map(lambda x: x.astype(jnp.float32), g1)
  tx = lars_optax.mxnet.adam(0.1, lazy_update=True)
  with pytest.raises(TypeError, match=r"gradient 'emb' is a row-sparse BCOO with indices of "
                     r"dtype float32.*walks into a BCOO.*lars_optax.sparse.clip_by_global_norm"):
    tx.update(cast, tx.init(params), params)


def _apply_step(tx, jit):
  """params, state, grads -> the params after tx's update (jitted or not)."""
  def step(params, state, grads):
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates)
  return jax.jit(step) if jit else step


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_optax_scale_after_the_lazy_optimizer_names_the_fix(jit):
  """chain(adam(lazy_update=True), optax.scale(0.5)) scales the update's row indices too."""
  params, _, g1, _ = _two_grads()
  tx = optax.chain(lars_optax.mxnet.adam(0.1, lazy_update=True), optax.scale(0.5))
  step = _apply_step(tx, jit)
  with pytest.raises(TypeError, match=r"apply_updates: a row-sparse update is a row-sparse BCOO "
                     r"with indices of dtype float32.*"
                     r"lars_optax.sparse.lazy_update\(optax.chain\("):
    step(params, tx.init(params), g1)
  # A BCOO built by hand gets a plain BCOO update, which JAX itself rejects, without a
  # message (docs/troubleshooting.md says so).
  hand_built = {**g1, "emb": BCOO((g1["emb"].data, g1["emb"].indices), shape=g1["emb"].shape)}
  with pytest.raises(AssertionError):
    step(params, tx.init(params), hand_built)


_SCHEDULE = optax.linear_schedule(0.5, 0.1, 10)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("chain", ["sparse.adam+scale_by_learning_rate",
                                   "mxnet.adam(lazy)+scale_by_schedule"])
def test_a_schedule_after_a_row_sparse_optimizer_is_caught_not_moving_row_0(chain, jit):
  """A rate in (0, 1) cast to the int32 indices zeroes them and the digest: caught."""
  params, _, g1, _ = _two_grads()
  if chain.startswith("sparse"):
    tx = optax.chain(lars_optax.sparse.adam(1.0), optax.scale_by_learning_rate(_SCHEDULE))
  else:
    tx = optax.chain(lars_optax.mxnet.adam(0.1, lazy_update=True),
                     optax.scale_by_schedule(_SCHEDULE))
  step = _apply_step(tx, jit)
  with pytest.raises(Exception, match=r"apply_updates: a row-sparse update: the row indices of "
                     r"this row-sparse BCOO were changed after it was made.*optax.scale_by_"
                     r"schedule"):
    jax.block_until_ready(step(params, tx.init(params), g1))


@pytest.mark.op_by_op
def test_a_zero_tree_of_a_row_sparse_update_is_still_a_no_op():
  """optax.tree.zeros_like of an update (apply_if_finite's skip) zeroes its digest too."""
  params, _, g1, _ = _two_grads()
  tx = lars_optax.mxnet.adam(0.1, lazy_update=True)
  updates, _ = tx.update(g1, tx.init(params), params)
  zeros = optax.tree_utils.tree_zeros_like(updates)
  chex.assert_trees_all_equal(jax.jit(optax.apply_updates)(params, zeros), params)
  chex.assert_trees_all_equal(optax.apply_updates(params, zeros), params)


@pytest.mark.op_by_op
def test_lazy_update_around_a_chain_with_a_scale_equals_the_dense_lazy_path():
  params, _, g1, _ = _two_grads()
  tx = lars_optax.sparse.lazy_update(optax.chain(lars_optax.mxnet.adam(0.1), optax.scale(0.5)))
  updates, _ = tx.update(g1, tx.init(params), params)
  dense = jax.tree.map(lambda g: g.todense() if lars_optax.sparse.is_row_sparse(g) else g, g1,
                       is_leaf=lars_optax.sparse.is_row_sparse)
  ref, _ = tx.update(dense, tx.init(params), params)
  chex.assert_trees_all_close(optax.apply_updates(params, updates),
                              optax.apply_updates(params, ref), rtol=1e-6)


def test_bcoo_passed_as_params_names_the_mistake():
  params, _, g1, _ = _two_grads()
  tx = lars_optax.mxnet.adam(0.1, lazy_update=True)
  with pytest.raises(TypeError, match=r"parameter 'emb' is a BCOO; parameters must be dense"):
    tx.update(g1, tx.init(params), g1)


# --------------------------------------------------------------------------
# optax.apply_if_finite around a lazy optimizer
# --------------------------------------------------------------------------


@pytest.mark.op_by_op
@pytest.mark.parametrize("make", ["sparse_value_and_grad", "row_sparse", "hand_built_bcoo"])
def test_apply_if_finite_around_lazy_adam_equals_the_unwrapped_step(make):
  params, fn, _, _ = _two_grads(50)
  if make == "sparse_value_and_grad":
    grads = [fn(params, jnp.array(ids))[1] for ids in ([1, 5, 5], [7, 1, 49], [0, 2, 3])]
  elif make == "hand_built_bcoo":
    grads = [{"emb": _bcoo(np.full((2, 2), 0.5 * k, np.float32), [k, 2 * k], (50, 2)),
              "w": jnp.ones(2)} for k in (1, 2, 3)]
  else:
    grads = [{"emb": lars_optax.sparse.row_sparse(jnp.full((2, 2), 0.5 * k),
                                                  rows=jnp.array([k, 2 * k]), num_rows=50),
              "w": jnp.ones(2)} for k in (1, 2, 3)]
  plain = lars_optax.mxnet.adam(0.1, lazy_update=True)
  guarded = optax.apply_if_finite(lars_optax.mxnet.adam(0.1, lazy_update=True), 3)

  def run(tx, grads):
    state = tx.init(params)
    p = params
    step = jax.jit(lambda p, s, g: tx.update(g, s, p))
    for g in grads:
      updates, state = step(p, state, g)
      p = optax.apply_updates(p, updates)
    return p

  chex.assert_trees_all_close(run(guarded, grads), run(plain, grads), rtol=1e-6)
  # A non-finite gradient is skipped: the params stay as they were.
  bad = dict(grads[0])
  bad["emb"] = type(bad["emb"])((bad["emb"].data.at[0, 0].set(jnp.nan), bad["emb"].indices),
                                shape=(50, 2))
  chex.assert_trees_all_close(run(guarded, [bad]), params)


@pytest.mark.op_by_op
def test_skip_nonfinite_guards_lazy_adam_on_a_hand_built_bcoo():
  """skip_nonfinite guards a plain BCOO gradient as optax.apply_if_finite does."""
  params = {"emb": jnp.ones((5, 2))}
  good = {"emb": _bcoo(np.ones((2, 2), np.float32), [1, 3], (5, 2))}
  bad = {"emb": _bcoo(np.full((2, 2), np.nan, np.float32), [1, 3], (5, 2))}
  plain = lars_optax.mxnet.adam(0.1, lazy_update=True)
  guarded = lars_optax.skip_nonfinite(lars_optax.mxnet.adam(0.1, lazy_update=True))
  state = guarded.init(params)
  updates, state = jax.jit(guarded.update)(bad, state, params)
  chex.assert_trees_all_equal(optax.apply_updates(params, updates), params)
  updates, state = jax.jit(guarded.update)(good, state, params)
  expected, _ = plain.update(good, plain.init(params), params)
  chex.assert_trees_all_close(optax.apply_updates(params, updates),
                              optax.apply_updates(params, expected), rtol=1e-6)


# --------------------------------------------------------------------------
# sparse_value_and_grad takes what jax.value_and_grad takes
# --------------------------------------------------------------------------


def test_value_and_grad_takes_keyword_and_python_arguments():
  params = {"emb": jnp.arange(10.0).reshape(5, 2)}

  def loss(p, ids, *, scale=1.0, mode="sum", train=True):
    x = p["emb"][ids] * scale
    if train:  # a Python bool: not traced
      x = x * 2
    return jnp.sum(x) if mode == "sum" else jnp.mean(x)

  ids = jnp.array([0, 3])
  for kwargs in ({}, {"scale": 0.5, "mode": "mean", "train": False}, {"scale": jnp.float32(3)}):
    value, g = lars_optax.sparse.value_and_grad(loss, sparse="emb")(params, ids, **kwargs)
    ref_value, ref = jax.value_and_grad(loss)(params, ids, **kwargs)
    np.testing.assert_allclose(value, ref_value, rtol=1e-6)
    np.testing.assert_allclose(g["emb"].todense(), ref["emb"], rtol=1e-6)


def test_value_and_grad_python_bool_positional_argument_is_not_traced():
  params = {"emb": jnp.arange(10.0).reshape(5, 2)}
  loss = lambda p, ids, train: jnp.sum(p["emb"][ids]) * (2.0 if train else 1.0)
  _, g = jax.jit(lars_optax.sparse.value_and_grad(loss, sparse="emb"), static_argnums=2)(
      params, jnp.array([1]), True)
  np.testing.assert_allclose(g["emb"].todense()[1], [2.0, 2.0])
  _, g = lars_optax.sparse.value_and_grad(loss, sparse="emb")(params, jnp.array([1]), False)
  np.testing.assert_allclose(g["emb"].todense()[1], [1.0, 1.0])


def test_value_and_grad_argnums():
  params = {"emb": jnp.arange(10.0).reshape(5, 2)}
  loss = lambda ids, p: jnp.sum(p["emb"][ids] ** 2)
  ids = jnp.array([1, 1, 4])
  _, g = lars_optax.sparse.value_and_grad(loss, sparse="emb", argnums=1)(ids, params)
  np.testing.assert_allclose(g["emb"].todense(), jax.grad(loss, argnums=1)(ids, params)["emb"])
  with pytest.raises(TypeError, match="argnums: expected an int"):
    lars_optax.sparse.value_and_grad(loss, sparse="emb", argnums=(0, 1))


def test_value_and_grad_flax_embed_with_a_bfloat16_dtype():
  """nn.Embed(dtype=bfloat16) casts the table, then looks up: a lookup, then a cast."""
  import flax.linen as nn

  class Bag(nn.Module):
    @nn.compact
    def __call__(self, ids):
      x = nn.Embed(50, 4, dtype=jnp.bfloat16)(ids).mean(axis=1)
      return nn.Dense(1)(x.astype(jnp.float32))[:, 0]

  model = Bag()
  params = model.init(jax.random.key(0), IDS)["params"]
  loss = lambda p, ids, y: jnp.mean((model.apply({"params": p}, ids) - y) ** 2)
  value, grads = jax.jit(lars_optax.sparse.value_and_grad(loss, sparse="embedding"))(params, IDS, Y)
  ref_value, ref = jax.value_and_grad(loss)(params, IDS, Y)
  assert grads["Embed_0"]["embedding"].dtype == jnp.float32
  np.testing.assert_allclose(value, ref_value, rtol=1e-6)
  # Equal up to bfloat16 rounding: the dense path sums a repeated id's rows in
  # bfloat16, the sparse one in float32.
  np.testing.assert_allclose(grads["Embed_0"]["embedding"].todense(),
                             ref["Embed_0"]["embedding"], rtol=1e-2, atol=1e-3)
  chex.assert_trees_all_close(grads["Dense_0"], ref["Dense_0"], rtol=1e-6)


@pytest.mark.op_by_op
def test_value_and_grad_string_matches_a_full_path_or_a_last_name():
  params, loss = _linen()
  assert "Embed_0/embedding" in lars_optax.leaf_names(params)["Embed_0"]["embedding"]
  for sparse in ("Embed_0/embedding", "embedding"):
    _, grads = lars_optax.sparse.value_and_grad(loss, sparse=sparse)(params, IDS, Y)
    assert lars_optax.sparse.is_row_sparse(grads["Embed_0"]["embedding"])
    assert not lars_optax.sparse.is_row_sparse(grads["Dense_0"]["kernel"])
  with pytest.raises(ValueError, match=r"sparse: selects no leaf of params \(the string "
                     r"'Embed_0/emb' matches a leaf whose full path .*leaf_names.* or last path "
                     r"component equals it\)"):
    lars_optax.sparse.value_and_grad(loss, sparse="Embed_0/emb")(params, IDS, Y)


@pytest.mark.quick  # (also at the floors: jax 0.7 has lax.pvary, not lax.pcast)
def test_value_and_grad_inside_shard_map_with_check_vma_equals_the_dense_gradient():
  from jax.sharding import Mesh
  from jax.sharding import PartitionSpec as P

  mesh = Mesh(np.array(jax.devices()), ("batch",))
  n_dev = len(jax.devices())
  params, loss = _linen()
  rng = np.random.default_rng(4)
  ids = jnp.asarray(rng.integers(0, 50, (n_dev * 2, 3)), jnp.int32)
  y = jnp.asarray(rng.normal(size=n_dev * 2), jnp.float32)

  def grads(grad_fn):
    def f(p, i, t):
      _, g = grad_fn(p, i, t)
      return jax.tree.map(lambda x: x.todense() if lars_optax.sparse.is_row_sparse(x) else x, g,
                          is_leaf=lars_optax.sparse.is_row_sparse)
    return jax.jit(jax.shard_map(f, mesh=mesh, in_specs=(P(), P("batch"), P("batch")),
                                 out_specs=P()))(params, ids, y)

  chex.assert_trees_all_close(grads(lars_optax.sparse.value_and_grad(loss, sparse="embedding")),
                              grads(jax.value_and_grad(loss)), rtol=1e-5, atol=1e-7)


def test_value_and_grad_refuses_global_ids_on_a_table_split_by_rows_in_shard_map():
  """#37 item 7: each device holds 4 of the 16 rows; global ids past the block would be
  clamped in the lookup and dropped in the gradient (without axis_name, which the
  error names; #53). A replicated table is exact."""
  from jax.sharding import Mesh
  from jax.sharding import PartitionSpec as P

  mesh = Mesh(np.array(jax.devices()[:4]), ("model",))
  params = {"table": jnp.arange(64.0).reshape(16, 4)}
  ids = jnp.array([1, 6, 13])
  grad_fn = lars_optax.sparse.value_and_grad(lambda p, i: jnp.sum(p["table"][i] ** 2),
                                             sparse="table")

  def step(spec):
    return jax.jit(jax.shard_map(lambda p, i: grad_fn(p, i)[1]["table"].data, mesh=mesh,
                                 in_specs=({"table": spec}, P()), out_specs=P("model"),
                                 check_vma=True))(params, ids)

  with pytest.raises(Exception, match=r"sparse: leaf 'table' varies over the mesh axes "
                                      r"\('model',\) inside shard_map .*past this block's 4 "
                                      r"rows.*pass axis_name='model' to sparse.value_and_grad"):
    jax.block_until_ready(step(P("model", None)))
  rows = np.asarray(step(P()))[:3]  # the first device's rows
  np.testing.assert_allclose(rows, 2 * np.asarray(params["table"])[[1, 6, 13]], rtol=1e-6)


@pytest.mark.op_by_op
@pytest.mark.parametrize("name", optimizers.ROW_SPARSE)
@pytest.mark.parametrize("kind", ["row_sparse", "plain-BCOO"])
def test_numpy_params_and_state_take_the_sparse_path_eagerly(name, kind):
  """flax.serialization.from_bytes and checkpoints give numpy arrays; a plain BCOO
  gradient (``jax.experimental.sparse``'s own) gets an update numpy params can take."""
  params = {"emb": np.arange(12.0, dtype=np.float32).reshape(6, 2), "w": np.ones(2, np.float32)}
  emb = lars_optax.sparse.row_sparse(jnp.ones((2, 2)), rows=jnp.array([1, 4]), num_rows=6)
  if kind == "plain-BCOO":
    emb = BCOO((emb.data, emb.indices), shape=emb.shape)
  grads = {"emb": emb, "w": np.full(2, 0.5, np.float32)}
  o = optimizers.BY_NAME[name]  # every optimizer that takes row-sparse gradients
  tx = optimizers.lazy_step(o) if o.lazy else o.make()
  want_u, want_s = tx.update(grads, tx.init(jax.tree.map(jnp.asarray, params)),
                             jax.tree.map(jnp.asarray, params))
  state = jax.tree.map(np.asarray, tx.init(params))  # a restored state: numpy leaves
  updates, _ = tx.update(grads, state, params)
  for apply in (optax.apply_updates, lars_optax.sparse.apply_updates):
    chex.assert_trees_all_close(apply(params, updates),
                                apply(jax.tree.map(jnp.asarray, params), want_u))
  del want_s


def test_row_sparse_rejects_float_rows_naming_them():
  with pytest.raises(TypeError, match=r"^rows: expected integer row indices, got an array "
                                      r"of float32"):
    lars_optax.sparse.row_sparse(jnp.ones((2, 3)), rows=jnp.array([1.0, 2.0]), num_rows=5)
  with pytest.raises(TypeError, match=r"^num_rows: expected an int"):
    lars_optax.sparse.row_sparse(jnp.ones((2, 3)), rows=jnp.array([1, 2]), num_rows=5.0)


def test_sparse_value_and_grad_with_float_ids_fails_as_jax_indexing_does():
  def loss(p, ids):
    return jnp.sum(p["table"][ids])
  params = {"table": jnp.ones((10, 3))}
  with pytest.raises(TypeError, match="Indexer must have integer"):
    lars_optax.sparse.value_and_grad(loss, sparse="table")(params, jnp.array([1.0, 2.0]))


def test_the_lazy_step_traces_its_inner_update_once():
  """The row-wise check's jaxpr is the step itself: the inner update is traced once."""
  calls = []
  inner = optax.adam(0.1)

  def update(updates, state, params=None):
    calls.append(1)
    return inner.update(updates, state, params)

  tx = lars_optax.sparse.lazy_update(optax.GradientTransformation(inner.init, update))
  params = {"emb": jnp.ones((10, 2))}
  grads = {"emb": lars_optax.sparse.row_sparse(jnp.ones((2, 2)), rows=jnp.array([1, 4]),
                                               num_rows=10)}
  state = tx.init(params)
  jax.jit(tx.update).lower(grads, state, params)
  assert len(calls) == 1
