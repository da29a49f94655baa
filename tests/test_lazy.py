"""Tests for lars_optax.sparse.lazy: the lazy_update wrapper and present_rows.

Covered: absent rows (all-zero gradient rows along axis 0) get a zero update
and keep every params-shaped state buffer (momentum, Adam's mu and nu) while
present rows match the dense inner update and scalar state (the step count)
still advances; with every row present the wrapper is exactly the inner
transformation; the ``lazy_update=True`` arguments of lars_optax.mxnet.adam and
lars_optax.mxnet.sgd; a multi-step comparison with a numpy lazy MXNet Adam; NaN rows,
1-d, 3-d and zero-size leaves; jit; and the argument checks.
"""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lars_optax
from lars_optax.sparse import lazy_update, present_rows

INNERS = {
    "optax_sgd_momentum": lambda: optax.sgd(0.1, momentum=0.9),
    "lars_sgd_momentum": lambda: lars_optax.mxnet.sgd(0.1, momentum=0.9),
    "lars_adam": lambda: lars_optax.mxnet.adam(0.01),
    "optax_adam": lambda: optax.adam(0.01),
}


def _params():
  rng = np.random.default_rng(0)
  return {
      "emb": jnp.asarray(rng.normal(size=(5, 3)), jnp.float32),
      "vec": jnp.asarray(rng.normal(size=(4,)), jnp.float32),
  }


def _grads(rows_emb, rows_vec, seed=1):
  """Random gradients that are zero outside the given rows."""
  rng = np.random.default_rng(seed)
  emb = np.zeros((5, 3), np.float32)
  emb[rows_emb] = rng.normal(size=(len(rows_emb), 3))
  vec = np.zeros((4,), np.float32)
  vec[rows_vec] = rng.normal(size=(len(rows_vec),))
  return {"emb": jnp.asarray(emb), "vec": jnp.asarray(vec)}


def _row_mask(shape, rows):
  mask = np.zeros(shape[0], bool)
  mask[rows] = True
  return mask.reshape((-1,) + (1,) * (len(shape) - 1))


def _params_like_buffers(state, params):
  """The params-shaped subtrees of a state, in the order jax finds them."""
  treedef = jax.tree.structure(params)
  shapes = [p.shape for p in jax.tree.leaves(params)]

  def is_buf(node):
    return (jax.tree.structure(node) == treedef
            and [np.shape(x) for x in jax.tree.leaves(node)] == shapes)

  return [node for node in jax.tree.leaves(state, is_leaf=is_buf) if is_buf(node)]


def _find(state, cls):
  """The first ``cls`` node of a (chained) optimizer state."""
  for node in jax.tree.leaves(state, is_leaf=lambda n: isinstance(n, cls)):
    if isinstance(node, cls):
      return node
  raise AssertionError(f"no {cls.__name__} in the state")


def _adam_state(state):
  return _find(state, optax.ScaleByAdamState)


def _momentum(state):
  return _find(state, lars_optax.MXNetMomentumState).momentum


# --------------------------------------------------------------------------
# present_rows
# --------------------------------------------------------------------------


def test_present_rows():
  g = jnp.array([[0.0, 0.0], [0.0, 1e-30], [2.0, 0.0], [0.0, -0.0]])
  np.testing.assert_array_equal(present_rows(g), [False, True, True, False])
  np.testing.assert_array_equal(present_rows(jnp.array([0.0, 3.0, -0.0])), [False, True, False])
  g3 = jnp.zeros((3, 2, 2)).at[1, 1, 0].set(1.0)
  np.testing.assert_array_equal(present_rows(g3), [False, True, False])


def test_present_rows_nan_is_present():
  g = jnp.array([[0.0, jnp.nan], [0.0, 0.0], [jnp.inf, 0.0]])
  np.testing.assert_array_equal(present_rows(g), [True, False, True])


def test_present_rows_rejects_0d():
  with pytest.raises(ValueError, match="0-d"):
    present_rows(jnp.array(1.0))


def test_present_rows_zero_size():
  assert present_rows(jnp.zeros((0, 3))).shape == (0,)
  np.testing.assert_array_equal(present_rows(jnp.zeros((2, 0))), [False, False])


# --------------------------------------------------------------------------
# Absent rows keep weights and state; present rows match the dense update
# --------------------------------------------------------------------------


@pytest.mark.op_by_op
@pytest.mark.parametrize("name", sorted(INNERS))
def test_absent_rows_keep_state_present_rows_match_dense(name):
  params = _params()
  inner = INNERS[name]()
  lazy = lazy_update(inner)
  # A first dense step so that every buffer is non-zero.
  g0 = _grads([0, 1, 2, 3, 4], [0, 1, 2, 3], seed=1)
  _, state = lazy.update(g0, lazy.init(params), params)
  _, dense_state0 = inner.update(g0, inner.init(params), params)
  chex.assert_trees_all_equal(state, dense_state0)

  rows = {"emb": [1, 3], "vec": [0, 2]}
  g1 = _grads(rows["emb"], rows["vec"], seed=2)
  upd, new_state = lazy.update(g1, state, params)
  dense_upd, dense_state = inner.update(g1, state, params)

  old_bufs = _params_like_buffers(state, params)
  new_bufs = _params_like_buffers(new_state, params)
  dense_bufs = _params_like_buffers(dense_state, params)
  assert old_bufs, "the inner state should hold params-shaped buffers"
  assert len(new_bufs) == len(old_bufs) == len(dense_bufs)
  for key, p in params.items():
    mask = _row_mask(p.shape, rows[key])
    # Updates: the dense update on present rows, exactly 0 on absent rows.
    np.testing.assert_array_equal(upd[key], np.where(mask, dense_upd[key], 0.0))
    assert np.all(np.asarray(upd[key])[~mask.squeeze()] == 0)
    for old, new, dense in zip(old_bufs, new_bufs, dense_bufs, strict=True):
      np.testing.assert_array_equal(new[key], np.where(mask, dense[key], old[key]))
      # The buffers did change on present rows (so the check above has teeth).
      assert not np.array_equal(np.asarray(new[key])[mask.squeeze()],
                                np.asarray(old[key])[mask.squeeze()])
  # Scalar state (the step counts) advances as in the dense state.
  counts = [x for x in jax.tree.leaves(new_state) if np.ndim(x) == 0]
  chex.assert_trees_all_equal(counts, [x for x in jax.tree.leaves(dense_state) if np.ndim(x) == 0])
  old_counts = [x for x in jax.tree.leaves(state) if np.ndim(x) == 0]
  chex.assert_trees_all_equal(counts, [c + 1 for c in old_counts])
  chex.assert_trees_all_equal_dtypes(new_state, state)


@pytest.mark.parametrize("make", [lars_optax.mxnet.adam, optax.adam], ids=["lars_adam",
                                                                           "optax_adam"])
def test_adam_count_advances_and_moments_kept(make):
  params = _params()
  lazy = lazy_update(make(learning_rate=0.01))
  state = lazy.init(params)
  g = _grads([0], [1])
  for step in range(1, 4):
    _, state = lazy.update(g, state, params)
    adam_state = _adam_state(state)
    assert int(adam_state.count) == step
  # Only row 0 of emb and row 1 of vec ever had a gradient.
  for buf in (adam_state.mu, adam_state.nu):
    np.testing.assert_array_equal(buf["emb"][1:], 0.0)
    assert np.all(np.asarray(buf["emb"][0]) != 0)
    np.testing.assert_array_equal(np.asarray(buf["vec"])[[0, 2, 3]], 0.0)
    assert float(buf["vec"][1]) != 0


def test_all_absent_gives_zero_update_and_unchanged_buffers():
  params = _params()
  lazy = lazy_update(lars_optax.mxnet.sgd(0.1, momentum=0.9))
  _, state = lazy.update(_grads([0, 1, 2, 3, 4], [0, 1, 2, 3]), lazy.init(params), params)
  zeros = jax.tree.map(jnp.zeros_like, params)
  upd, new_state = lazy.update(zeros, state, params)
  chex.assert_trees_all_equal(upd, zeros)
  chex.assert_trees_all_equal(_momentum(new_state), _momentum(state))
  counter = lars_optax.MXNetMomentumState
  assert int(_find(new_state, counter).count) == int(_find(state, counter).count) + 1


@pytest.mark.parametrize("name", sorted(INNERS))
def test_all_rows_present_is_exactly_inner(name):
  params = _params()
  inner = INNERS[name]()
  lazy = lazy_update(inner)
  s_lazy, s_inner = lazy.init(params), inner.init(params)
  chex.assert_trees_all_equal(s_lazy, s_inner)
  for seed in range(3):
    g = _grads([0, 1, 2, 3, 4], [0, 1, 2, 3], seed=seed)
    u_lazy, s_lazy = lazy.update(g, s_lazy, params)
    u_inner, s_inner = inner.update(g, s_inner, params)
    chex.assert_trees_all_equal(u_lazy, u_inner)
    chex.assert_trees_all_equal(s_lazy, s_inner)
    params = optax.apply_updates(params, u_inner)


# --------------------------------------------------------------------------
# The lazy_update=True arguments
# --------------------------------------------------------------------------


@pytest.mark.parametrize("flag, wrapped", [
    (lambda: lars_optax.mxnet.adam(0.01, wd=0.1, lazy_update=True),
     lambda: lazy_update(lars_optax.mxnet.adam(0.01, wd=0.1))),
    (lambda: lars_optax.mxnet.sgd(0.1, momentum=0.9, lazy_update=True),
     lambda: lazy_update(lars_optax.mxnet.sgd(0.1, momentum=0.9))),
], ids=["adam", "sgd"])
def test_lazy_update_flag_equals_wrapper(flag, wrapped):
  a, b = flag(), wrapped()
  params = _params()
  pa = pb = params
  sa, sb = a.init(params), b.init(params)
  for step, (re, rv) in enumerate([([0, 2], [1]), ([2, 4], [1, 3]), ([], [0])]):
    g = _grads(re, rv, seed=step)
    ua, sa = a.update(g, sa, pa)
    ub, sb = b.update(g, sb, pb)
    chex.assert_trees_all_equal(ua, ub)
    chex.assert_trees_all_equal(sa, sb)
    pa, pb = optax.apply_updates(pa, ua), optax.apply_updates(pb, ub)
  # Rows 1 and 3 of emb never had a gradient: with wd they would have decayed
  # had the update been dense.
  np.testing.assert_array_equal(np.asarray(pa["emb"])[[1, 3]], np.asarray(params["emb"])[[1, 3]])


# --------------------------------------------------------------------------
# Multi-step comparison with a numpy lazy MXNet Adam
# --------------------------------------------------------------------------


def _np_lazy_adam(w, grads, lr, b1, b2, eps, wd):
  w = np.asarray(w, np.float64).copy()
  m, v = np.zeros_like(w), np.zeros_like(w)
  for t, g in enumerate(grads, start=1):
    g = np.asarray(g, np.float64)
    for r in range(w.shape[0]):
      if not np.any(g[r] != 0):
        continue
      u = g[r] + wd * w[r]
      m[r] = b1 * m[r] + (1 - b1) * u
      v[r] = b2 * v[r] + (1 - b2) * u * u
      w[r] -= lr * np.sqrt(1 - b2**t) / (1 - b1**t) * m[r] / (np.sqrt(v[r]) + eps)
  return w, m, v


def test_matches_numpy_lazy_mxnet_adam():
  lr, b1, b2, eps, wd = 0.01, 0.9, 0.999, 1e-8, 0.01
  rng = np.random.default_rng(3)
  w0 = rng.normal(size=(6, 4)).astype(np.float32)
  present = [[0, 1, 2, 3, 4], [1, 3], [0], [1, 3, 4], [], [3], [0, 1, 3], [1]]  # row 5 never
  grads = []
  for rows in present:
    g = np.zeros((6, 4), np.float32)
    g[rows] = rng.normal(size=(len(rows), 4))
    grads.append(g)
  opt = lars_optax.mxnet.adam(lr, beta1=b1, beta2=b2, epsilon=eps, wd=wd, lazy_update=True)
  step = jax.jit(lambda g, s, p: opt.update(g, s, p))
  params = {"emb": jnp.asarray(w0)}
  state = opt.init(params)
  for g in grads:
    upd, state = step({"emb": jnp.asarray(g)}, state, params)
    params = optax.apply_updates(params, upd)
  w, m, v = _np_lazy_adam(w0, grads, lr, b1, b2, eps, wd)
  adam_state = _adam_state(state)
  assert int(adam_state.count) == len(grads)
  np.testing.assert_allclose(params["emb"], w, rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(adam_state.mu["emb"], m, rtol=1e-5, atol=1e-8)
  np.testing.assert_allclose(adam_state.nu["emb"], v, rtol=1e-5, atol=1e-10)
  np.testing.assert_array_equal(params["emb"][5], w0[5])


# --------------------------------------------------------------------------
# NaN rows, leaf ranks, zero-size leaves, jit
# --------------------------------------------------------------------------


def test_nan_makes_a_row_present():
  params = {"w": jnp.ones((3, 2))}
  lazy = lazy_update(lars_optax.mxnet.sgd(0.1, momentum=0.9))
  g = {"w": jnp.array([[0.0, 0.0], [jnp.nan, 0.0], [0.0, 0.0]])}
  upd, state = lazy.update(g, lazy.init(params), params)
  assert np.all(np.isnan(np.asarray(upd["w"])[1, 0]))
  np.testing.assert_array_equal(np.asarray(upd["w"])[[0, 2]], 0.0)
  assert np.isnan(np.asarray(_momentum(state)["w"])[1, 0])
  np.testing.assert_array_equal(np.asarray(_momentum(state)["w"])[[0, 2]], 0.0)


def test_1d_leaf_each_element_is_a_row():
  params = {"b": jnp.arange(1.0, 6.0)}
  lazy = lazy_update(lars_optax.mxnet.adam(0.1))
  g = {"b": jnp.array([0.0, 1.0, 0.0, -2.0, 0.0])}
  upd, state = lazy.update(g, lazy.init(params), params)
  present = np.array([False, True, False, True, False])
  assert np.all(np.asarray(upd["b"])[present] != 0)
  np.testing.assert_array_equal(np.asarray(upd["b"])[~present], 0.0)
  np.testing.assert_array_equal(np.asarray(_adam_state(state).mu["b"])[~present], 0.0)


def test_3d_leaf_rows_over_axis_0():
  rng = np.random.default_rng(4)
  params = {"k": jnp.asarray(rng.normal(size=(4, 2, 3)), jnp.float32)}
  inner = optax.adam(0.1)
  lazy = lazy_update(inner)
  dense_g = jnp.asarray(rng.normal(size=(4, 2, 3)), jnp.float32)
  _, state = lazy.update({"k": dense_g}, lazy.init(params), params)
  # Row 2 has a single non-zero entry: the whole row is present.
  g = np.zeros((4, 2, 3), np.float32)
  g[0] = rng.normal(size=(2, 3))
  g[2, 1, 2] = 0.5
  g = {"k": jnp.asarray(g)}
  upd, new_state = lazy.update(g, state, params)
  dense_upd, dense_state = inner.update(g, state, params)
  mask = _row_mask((4, 2, 3), [0, 2])
  np.testing.assert_array_equal(upd["k"], np.where(mask, dense_upd["k"], 0.0))
  for buf in ("mu", "nu"):
    new, dense, old = (getattr(_adam_state(s), buf)["k"] for s in (new_state, dense_state, state))
    np.testing.assert_array_equal(new, np.where(mask, dense, old))
  assert np.all(np.asarray(upd["k"])[2] != 0)  # the zero entries of row 2 move too


def test_zero_size_leaf():
  params = {"empty": jnp.zeros((0, 3)), "w": jnp.ones((2, 3))}
  lazy = lazy_update(lars_optax.mxnet.adam(0.1))
  g = {"empty": jnp.zeros((0, 3)), "w": jnp.array([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]])}
  upd, state = jax.jit(lazy.update)(g, lazy.init(params), params)
  assert upd["empty"].shape == (0, 3)
  assert np.all(np.asarray(upd["w"])[0] != 0)
  np.testing.assert_array_equal(upd["w"][1], 0.0)
  assert int(_adam_state(state).count) == 1


def test_single_array_params():
  """A bare array (not a dict) as the params tree."""
  params = jnp.ones((3, 2))
  lazy = lazy_update(lars_optax.mxnet.adam(0.1))
  g = jnp.array([[0.0, 0.0], [1.0, 2.0], [0.0, 0.0]])
  upd, state = lazy.update(g, lazy.init(params), params)
  np.testing.assert_array_equal(np.asarray(upd)[[0, 2]], 0.0)
  assert np.all(np.asarray(upd)[1] != 0)
  np.testing.assert_array_equal(np.asarray(_adam_state(state).mu)[[0, 2]], 0.0)
  assert int(_adam_state(state).count) == 1


@pytest.mark.parametrize("name", ["lars_adam", "lars_sgd_momentum"])
def test_jit_matches_eager(name):
  params = _params()
  lazy = lazy_update(INNERS[name]())
  step = jax.jit(lazy.update)
  s_eager = s_jit = lazy.init(params)
  p_eager = p_jit = params
  for seed, (re, rv) in enumerate([([0, 1, 2, 3, 4], [0, 1, 2, 3]), ([1], [2]), ([3, 4], [])]):
    g = _grads(re, rv, seed=seed)
    u_eager, s_eager = lazy.update(g, s_eager, p_eager)
    u_jit, s_jit = step(g, s_jit, p_jit)
    chex.assert_trees_all_close(u_jit, u_eager, rtol=1e-6, atol=1e-7)
    chex.assert_trees_all_close(s_jit, s_eager, rtol=1e-6, atol=1e-7)
    p_eager = optax.apply_updates(p_eager, u_eager)
    p_jit = optax.apply_updates(p_jit, u_jit)
    # Rows without a gradient keep their weights exactly, under jit too.
    mask = _row_mask((5, 3), re)
    np.testing.assert_array_equal(np.asarray(u_jit["emb"])[~mask.squeeze()], 0.0)


def test_scalars_excluded_with_masked_or_partition():
  """The 0-d error message's advice: keep scalars out with optax.masked / partition."""
  params = {"w": jnp.ones((3, 2)), "scale": jnp.array(1.0)}
  g = {"w": jnp.array([[0.0, 0.0], [1.0, 2.0], [0.0, 0.0]]), "scale": jnp.array(0.5)}
  dense = lars_optax.mxnet.adam(0.1)
  for tx in [
      optax.chain(optax.masked(lazy_update(lars_optax.mxnet.adam(0.1)), {"w": True,
                                                                         "scale": False}),
                  optax.masked(lars_optax.mxnet.adam(0.1), {"w": False, "scale": True})),
      optax.partition({"lazy": lazy_update(lars_optax.mxnet.adam(0.1)),
                       "dense": lars_optax.mxnet.adam(0.1)},
                      {"w": "lazy", "scale": "dense"}),
  ]:
    upd, _ = tx.update(g, tx.init(params), params)
    dense_upd, _ = dense.update(g, dense.init(params), params)
    np.testing.assert_array_equal(np.asarray(upd["w"])[[0, 2]], 0.0)
    chex.assert_trees_all_equal(upd["w"][1], dense_upd["w"][1])
    chex.assert_trees_all_equal(upd["scale"], dense_upd["scale"])


def test_with_multi_precision_keeps_master_rows():
  """lazy_update=True with multi_precision=True: absent rows keep weight and master."""
  params = {"emb": jnp.ones((3, 2), jnp.float16), "b": jnp.ones((2,), jnp.float32)}
  # (sgd's flags exclude each other, as MXNet's SGD asserts; the wrapper composes)
  opt = lars_optax.multi_precision(lars_optax.mxnet.sgd(0.1, momentum=0.9, lazy_update=True))
  step = jax.jit(opt.update)
  state = opt.init(params)
  p = params
  for g_emb in [[[1.0, 1.0], [1.0, 1.0], [1.0, 1.0]], [[1.0, 1.0], [0.0, 0.0], [0.0, 0.0]],
                [[1.0, 1.0], [0.0, 0.0], [0.0, 0.0]]]:
    g = {"emb": jnp.asarray(g_emb, jnp.float16), "b": jnp.ones((2,))}
    upd, state = step(g, state, p)
    p = optax.apply_updates(p, upd)
  master = lars_optax.master_params(state, p)
  chex.assert_trees_all_equal(p["emb"], master["emb"].astype(jnp.float16))
  # Rows 1 and 2 moved at the first step only (by -0.1); row 0 kept moving.
  np.testing.assert_allclose(master["emb"][1:], 0.9, rtol=1e-6)
  assert float(master["emb"][0, 0]) < 0.5


# --------------------------------------------------------------------------
# Argument checks
# --------------------------------------------------------------------------


def test_0d_leaf_raises_at_init():
  lazy = lazy_update(lars_optax.mxnet.adam())
  with pytest.raises(ValueError, match=r"lazy_update.*'scale'"):
    lazy.init({"w": jnp.ones((2, 2)), "scale": jnp.array(1.0)})


def test_0d_leaf_raises_at_update():
  lazy = lazy_update(optax.sgd(0.1))
  params = {"w": jnp.ones((2, 2)), "scale": jnp.array(1.0)}
  state = optax.sgd(0.1).init(params)  # an init that does not check the ranks
  with pytest.raises(ValueError, match=r"lazy_update.*'scale'"):
    lazy.update({"w": jnp.ones((2, 2)), "scale": jnp.array(1.0)}, state, params)


@pytest.mark.parametrize("inner", [None, "adam", optax.adam, lambda g, s, p: (g, s)])
def test_non_transformation_inner_raises(inner):
  with pytest.raises(TypeError, match="inner"):
    lazy_update(inner)


@pytest.mark.parametrize("mixed", [False, True], ids=["all_float16", "with_float32_leaf"])
def test_lazy_around_multi_precision_keeps_absent_masters(mixed):
  """lazy_update(multi_precision(...)): masters of absent rows stay put.

  With a float32 leaf in the tree the master tree holds a MaskedNode there; it
  must still be recognised as a params-shaped buffer.
  """
  p = {"w": jnp.ones((2, 1), jnp.float16)}
  if mixed:
    p["b"] = jnp.ones((1,), jnp.float32)
  tx = lars_optax.sparse.lazy_update(lars_optax.multi_precision(lars_optax.mxnet.sgd(0.1,
                                                                                     momentum=0.9)))
  s = tx.init(p)
  for rows in ([1.0, 1.0], [1.0, 0.0], [1.0, 0.0]):
    g = {k: jnp.ones_like(x) for k, x in p.items()}
    g["w"] = jnp.array(rows, jnp.float16)[:, None]
    u, s = tx.update(g, s, p)
    p = optax.apply_updates(p, u)
  master = lars_optax.master_params(s, p)
  np.testing.assert_allclose(master["w"][1, 0], 0.9, rtol=1e-6)
  assert p["w"][1, 0] == master["w"][1, 0].astype(jnp.float16)


# --------------------------------------------------------------------------
# Row-sparse (BCOO) gradients: every state leaf with the rows first is gathered
# --------------------------------------------------------------------------


def _table_and_bcoo(rows, width, seed=2):
  rng = np.random.default_rng(seed)
  params = {"emb": jnp.asarray(rng.normal(size=(6, width)), jnp.float32)}
  values = jnp.asarray(rng.normal(size=(len(rows), width)), jnp.float32)
  grads = {"emb": lars_optax.sparse.row_sparse(values, rows=jnp.asarray(rows), num_rows=6)}
  return params, grads


@pytest.mark.op_by_op
@pytest.mark.parametrize("width", [1, 4])
@pytest.mark.parametrize("name", ["groupadagrad", "adagrad", "ftrl"])
def test_bcoo_step_gathers_state_leaves_with_other_trailing_axes(name, width):
  """GroupAdaGrad's (rows, 1) accumulator is gathered for rows of any width."""
  params, grads = _table_and_bcoo([4, 0, 4], width)
  tx = lazy_update(lars_optax.mxnet.create(name))
  state = tx.init(params)
  for _ in range(2):
    updates, state = jax.jit(tx.update)(grads, state, params)
    params_sparse = optax.apply_updates(params, updates)
  dense = {"emb": grads["emb"].todense()}
  state_d = tx.init(params)
  for _ in range(2):
    updates_d, state_d = tx.update(dense, state_d, params)
  chex.assert_trees_all_close(params_sparse, optax.apply_updates(params, updates_d),
                              rtol=1e-6, atol=1e-7)
  chex.assert_trees_all_close(state, state_d, rtol=1e-6, atol=1e-7)


def test_bcoo_step_gathers_an_unknown_state_of_rows_by_one():
  """A state type lars_optax does not list, with a (rows, 1) leaf per param."""
  from typing import NamedTuple

  class RowAcc(NamedTuple):
    acc: dict

  def init(params):
    return RowAcc(jax.tree.map(lambda p: jnp.zeros((p.shape[0], 1), p.dtype), params))

  def update(updates, state, params=None):
    del params
    acc = jax.tree.map(lambda a, g: a + jnp.sum(g * g, axis=1, keepdims=True), state.acc,
                       updates)
    return jax.tree.map(lambda g, a: -g / jnp.sqrt(a + 1.0), updates, acc), RowAcc(acc)

  params, grads = _table_and_bcoo([1, 3], 3)
  tx = lazy_update(optax.GradientTransformation(init, update))
  _, state = jax.jit(tx.update)(grads, tx.init(params), params)
  expected = np.zeros((6, 1), np.float32)
  expected[[1, 3], 0] = np.sum(np.asarray(grads["emb"].data) ** 2, axis=1)
  np.testing.assert_allclose(state.acc["emb"], expected, rtol=1e-6)


class _ColumnsFirst:
  """A rule that keeps its accumulator transposed, (columns, rows): not gatherable."""

  @staticmethod
  def tx():
    def init(params):
      return {"acc_t": [jnp.zeros_like(p).T for p in jax.tree.leaves(params)]}

    def update(updates, state, params=None):
      del params
      g = jax.tree.leaves(updates)[0]
      acc = state["acc_t"][0] + (g * g).T
      u = jax.tree.map(lambda x: x / (1.0 + acc.T), updates)
      return u, {"acc_t": [acc]}

    return optax.GradientTransformation(init, update)


@pytest.mark.op_by_op
@pytest.mark.parametrize("rows", [[0, 3], [2]], ids=["broadcast_error", "broadcasts_silently"])
def test_bcoo_step_names_a_state_leaf_it_cannot_gather(rows):
  params, grads = _table_and_bcoo(rows, 3)
  tx = lazy_update(_ColumnsFirst.tx())
  with pytest.raises(ValueError, match=(
      r"lazy_update: on the gathered rows of the row-sparse gradient 'emb', .*"
      r"not gathered with them: state\['acc_t'\]\[0\] \(shape \(3, 6\)\)\. "
      r"A state leaf is gathered when its leading axis is the param's rows")):
    tx.update(grads, tx.init(params), params)
