"""adagrad, groupadagrad, rmsprop, adadelta and ftrl (``lars_optax.mxnet._adagrad_family``).

The number-for-number comparison with MXNet is in
``test_reference_mxnet_registry.py``, argument checks in ``test_validation.py``
and dtypes in ``test_dtypes.py``; here: the rules on small hand-made cases,
agreement with optax's own optimizers where the rules coincide, state shapes,
and the edge cases (zero gradients, a zero learning rate, clipping).
"""

import warnings

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lars_optax


def _params(dtype=jnp.float32):
  return {"fc1_weight": jnp.array([[1.0, -2.0, 0.5], [0.5, 3.0, -1.0]], dtype),
          "fc1_bias": jnp.array([0.1, -0.2, 0.0], dtype)}


def _grads(k, dtype=jnp.float32):
  rng = np.random.default_rng(k)
  return jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape), dtype), _params(dtype))


def _run(tx, steps=4, dtype=jnp.float32, jit=True):
  params = _params(dtype)
  state = tx.init(params)
  update = jax.jit(tx.update) if jit else tx.update
  for k in range(steps):
    updates, state = update(_grads(k, dtype), state, params)
    params = optax.apply_updates(params, updates)
  return params, state


def test_adagrad_one_step_by_hand_epsilon_outside_the_root():
  tx = lars_optax.mxnet.adagrad(0.1, epsilon=0.5, wd=0.2, clip_gradient=1.0)
  w = jnp.array([1.0, -2.0, 0.5])
  g = jnp.array([3.0, -0.1, 0.0])
  updates, state = tx.update({"w": g}, tx.init({"w": w}), {"w": w})
  u = np.clip(np.asarray(g), -1, 1) + 0.2 * np.asarray(w)
  np.testing.assert_allclose(updates["w"], -0.1 * u / (np.abs(u) + 0.5), rtol=1e-6)
  np.testing.assert_allclose(optax.tree_utils.tree_get(state, "sum_of_squares")["w"], u**2,
                             rtol=1e-6)


def test_adagrad_differs_from_optax_adagrad_in_epsilon_and_initial_accumulator():
  ours, _ = _run(lars_optax.mxnet.adagrad(0.1, epsilon=1e-7))
  theirs, _ = _run(optax.adagrad(0.1, initial_accumulator_value=0.0, eps=0.0))
  # With h_0 = 0 and a negligible epsilon the two rules meet.
  chex.assert_trees_all_close(ours, theirs, rtol=1e-5)


def test_adagrad_zero_epsilon_and_zero_gradients_give_a_zero_step():
  tx = lars_optax.mxnet.adagrad(0.1, epsilon=0.0)
  params = {"w": jnp.ones(3)}
  updates, _ = tx.update({"w": jnp.zeros(3)}, tx.init(params), params)
  chex.assert_trees_all_equal(updates, {"w": jnp.zeros(3)})


@pytest.mark.parametrize("shape, state_shape", [
    ((4, 3), (4, 1)), ((2, 3, 5), (2, 1, 1)), ((3,), (3,)), ((), ())])
def test_groupadagrad_keeps_one_accumulator_per_row(shape, state_shape):
  tx = lars_optax.mxnet.groupadagrad(0.1)
  params = {"w": jnp.ones(shape)}
  state = tx.init(params)
  assert lars_optax.mxnet.ScaleByGroupAdagradState in {type(s) for s in jax.tree.leaves(
      state, is_leaf=lambda x: isinstance(x, lars_optax.mxnet.ScaleByGroupAdagradState))}
  updates, state = tx.update({"w": jnp.full(shape, 2.0)}, state, params)
  h = optax.tree_utils.tree_get(state, "row_sum_of_squares")["w"]
  assert h.shape == state_shape
  np.testing.assert_allclose(h, 4.0)
  np.testing.assert_allclose(updates["w"], -0.1 * 2.0 / (2.0 + 1e-6), rtol=1e-6)


def test_groupadagrad_one_step_by_hand():
  tx = lars_optax.mxnet.groupadagrad(0.1, epsilon=0.5, rescale_grad=2.0)
  w = jnp.zeros((2, 2))
  g = jnp.array([[1.0, 0.5], [0.0, 2.0]])
  updates, _ = tx.update({"w": g}, tx.init({"w": w}), {"w": w})
  u = 2.0 * np.asarray(g)
  h = np.mean(u**2, axis=1, keepdims=True)
  np.testing.assert_allclose(updates["w"], -0.1 * u / (np.sqrt(h) + 0.5), rtol=1e-6)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("mp", [False, True], ids=["plain", "multi_precision"])
def test_groupadagrad_row_buffers_keep_the_working_dtype(dtype, mp):
  with warnings.catch_warnings():  # float16 without masters warns at init (tested elsewhere)
    warnings.simplefilter("ignore", lars_optax.LowPrecisionWarning)
    _, state = _run(lars_optax.mxnet.groupadagrad(0.01, multi_precision=mp), dtype=dtype)
  h = optax.tree_utils.tree_get(state, "row_sum_of_squares")
  assert {x.dtype for x in jax.tree.leaves(h)} == {jnp.dtype(jnp.float32 if mp else dtype)}


def test_groupadagrad_weight_decay_is_rejected_by_name():
  with pytest.raises(ValueError, match=r"^wd: 'groupadagrad' does not support this argument"):
    lars_optax.mxnet.create("groupadagrad", wd=0.1)
  lars_optax.mxnet.create("groupadagrad", wd=0.0)  # MXNet's default is accepted


@pytest.mark.parametrize("centered", [False, True])
def test_rmsprop_equals_optax_rmsprop_with_a_constant_learning_rate(centered):
  ours, _ = _run(lars_optax.mxnet.rmsprop(0.01, rho=0.8, momentum=0.7, epsilon=1e-3,
                                    centered=centered))
  theirs, _ = _run(optax.rmsprop(0.01, decay=0.8, eps=1e-3, centered=centered,
                                 momentum=0.7 if centered else None,
                                 eps_in_sqrt=centered))
  chex.assert_trees_all_close(ours, theirs, rtol=1e-5)


def test_rmsprop_momentum_is_used_only_when_centered():
  a, _ = _run(lars_optax.mxnet.rmsprop(0.01, momentum=0.0))
  b, _ = _run(lars_optax.mxnet.rmsprop(0.01, momentum=0.9))
  chex.assert_trees_all_equal(a, b)


@pytest.mark.parametrize("centered", [False, True])
def test_rmsprop_clip_weights_keeps_every_weight_in_the_box(centered):
  params, _ = _run(lars_optax.mxnet.rmsprop(1.0, centered=centered, clip_weights=0.75))
  for leaf in jax.tree.leaves(params):
    assert float(jnp.max(jnp.abs(leaf))) <= 0.75 * (1 + 1e-6)
  # Inside the box nothing changes.
  free, _ = _run(lars_optax.mxnet.rmsprop(1e-3))
  boxed, _ = _run(lars_optax.mxnet.rmsprop(1e-3, clip_weights=100.0))
  chex.assert_trees_all_close(free, boxed, rtol=1e-6)


def test_clip_params_needs_params():
  tx = lars_optax.mxnet.clip_params(1.0)
  with pytest.raises(ValueError, match=r"^clip_params: params are required"):
    tx.update({"w": jnp.ones(2)}, tx.init({"w": jnp.ones(2)}))


def test_adadelta_equals_optax_adadelta():
  ours, _ = _run(lars_optax.mxnet.adadelta(0.5, rho=0.8, epsilon=1e-4))
  theirs, _ = _run(optax.adadelta(0.5, rho=0.8, eps=1e-4))
  chex.assert_trees_all_close(ours, theirs, rtol=1e-6)


def _ftrl_by_hand(w, g, z, n, lr, lamda1, beta, wd):
  new_n = n + g**2
  z = z + g - (np.sqrt(new_n) - np.sqrt(n)) / lr * w
  w = -np.sign(z) * np.maximum(np.abs(z) - lamda1, 0) / ((beta + np.sqrt(new_n)) / lr + wd)
  return w, z, new_n


def test_ftrl_two_steps_by_hand():
  tx = lars_optax.mxnet.ftrl(0.3, lamda1=0.2, beta=0.5, wd=0.1, rescale_grad=0.5)
  w = jnp.array([1.0, -2.0, 0.5, 0.0])
  params = {"w": w}
  state = tx.init(params)
  ref_w, z, n = np.asarray(w, np.float64), np.zeros(4), np.zeros(4)
  for g in ([3.0, -0.1, 0.0, 0.2], [-1.0, 0.4, 0.0, 2.0]):
    updates, state = tx.update({"w": jnp.array(g)}, state, params)
    params = optax.apply_updates(params, updates)
    ref_w, z, n = _ftrl_by_hand(ref_w, 0.5 * np.array(g), z, n, 0.3, 0.2, 0.5, 0.1)
    np.testing.assert_allclose(params["w"], ref_w, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(optax.tree_utils.tree_get(state, "z")["w"], z, rtol=1e-6)


def test_ftrl_lamda1_makes_weights_exactly_zero():
  params, _ = _run(lars_optax.mxnet.ftrl(0.1, lamda1=1e3))  # |z| stays below 1e3 here
  for leaf in jax.tree.leaves(params):
    assert not np.any(np.asarray(leaf))


def test_ftrl_lr_mult_zero_freezes_a_leaf_and_its_state():
  params, state = _run(lars_optax.mxnet.ftrl(0.1, lr_mult={"fc1_bias": 0.0}))
  chex.assert_trees_all_equal(params["fc1_bias"], _params()["fc1_bias"])
  assert not np.any(np.asarray(optax.tree_utils.tree_get(state, "n")["fc1_bias"]))


def test_ftrl_zero_beta_and_zero_gradients_stay_finite():
  tx = lars_optax.mxnet.ftrl(0.1, beta=0.0)
  params = {"w": jnp.ones(3)}
  updates, _ = tx.update({"w": jnp.zeros(3)}, tx.init(params), params)
  chex.assert_trees_all_equal(updates, {"w": -jnp.ones(3)})  # w_1 = 0: nothing seen yet


def test_ftrl_schedule_is_called_with_the_count():
  seen = []

  def schedule(count):
    seen.append(count)
    return 0.1

  tx = lars_optax.mxnet.ftrl(schedule)
  _run(tx, steps=2, jit=False)
  assert [int(c) for c in seen] == [0, 1]


@pytest.mark.parametrize("centered", [False, True])
def test_state_buffers_can_be_donated(centered):
  for tx in (lars_optax.mxnet.ftrl(), lars_optax.mxnet.adadelta(),
             lars_optax.mxnet.rmsprop(centered=centered)):
    step = jax.jit(lambda p, s, g, tx=tx: tx.update(g, s, p), donate_argnums=(1,))
    params = _params()
    updates, state = step(params, tx.init(params), _grads(0))
    updates, _ = step(params, state, _grads(1))
    chex.assert_tree_all_finite(updates)


NAMES = {"adagrad": lars_optax.mxnet.adagrad, "groupadagrad": lars_optax.mxnet.groupadagrad,
         "rmsprop": lars_optax.mxnet.rmsprop, "adadelta": lars_optax.mxnet.adadelta,
         "ftrl": lars_optax.mxnet.ftrl}


@pytest.mark.op_by_op
@pytest.mark.parametrize("name", sorted(NAMES))
def test_create_matches_the_function(name):
  kwargs = {"learning_rate": 0.05, "rescale_grad": 0.5, "clip_gradient": 1.0,
            "lr_mult": {"fc1_bias": 2.0}}
  a, _ = _run(lars_optax.mxnet.create(name, **kwargs))
  b, _ = _run(NAMES[name](**kwargs))
  chex.assert_trees_all_equal(a, b)


@pytest.mark.parametrize("name", sorted(NAMES))
def test_jit_and_eager_agree(name):
  a, _ = _run(NAMES[name](), jit=True)
  b, _ = _run(NAMES[name](), jit=False)
  chex.assert_trees_all_close(a, b, rtol=1e-6)


# --------------------------------------------------------------------------
# Row-sparse (BCOO) gradients: adagrad, groupadagrad and ftrl take them as MXNet does
# --------------------------------------------------------------------------

ROW_SPARSE = {"adagrad": lars_optax.mxnet.adagrad, "groupadagrad": lars_optax.mxnet.groupadagrad,
              "ftrl": lars_optax.mxnet.ftrl}
# (rows of each step's gradient of the 8 x 3 table; repeated rows are summed)
SPARSE_STEPS = [[1, 4, 1], [0, 4], [7], [2, 2, 5]]


def _table():
  rng = np.random.default_rng(3)
  return {"emb": jnp.asarray(rng.normal(size=(8, 3)), jnp.float32),
          "fc1_bias": jnp.asarray(rng.normal(size=(3,)), jnp.float32)}


def _run_rows(tx, sparse):
  params = _table()
  state = tx.init(params)
  update = jax.jit(tx.update)
  rng = np.random.default_rng(4)
  for rows in SPARSE_STEPS:
    values = jnp.asarray(rng.normal(size=(len(rows), 3)), jnp.float32)
    emb = lars_optax.sparse.row_sparse(values, rows=jnp.asarray(rows), num_rows=8)
    grads = {"emb": emb if sparse else emb.todense(),
             "fc1_bias": jnp.asarray(rng.normal(size=(3,)), jnp.float32)}
    updates, state = update(grads, state, params)
    if sparse:
      assert isinstance(updates["emb"], lars_optax.sparse.RowSparseUpdate)
    params = optax.apply_updates(params, updates)
  return params, state


@pytest.mark.op_by_op
@pytest.mark.parametrize("make", [
    lambda: lars_optax.mxnet.adagrad(0.1, clip_gradient=1.0, wd=0.01, wd_mult={"emb": 0.0}),
    lambda: lars_optax.mxnet.create("adagrad", learning_rate=0.1, epsilon=0.1),
    lambda: lars_optax.mxnet.groupadagrad(0.1, rescale_grad=0.5, lr_mult={"emb": 2.0}),
    lambda: lars_optax.mxnet.create("groupadagrad", learning_rate=0.1),
], ids=["adagrad", "create_adagrad", "groupadagrad", "create_groupadagrad"])
def test_adagrad_bcoo_step_equals_the_dense_step(make):
  """A dense leaf beside the table (with weight decay) gets its dense step."""
  p_sparse, s_sparse = _run_rows(make(), sparse=True)
  p_dense, s_dense = _run_rows(make(), sparse=False)
  chex.assert_trees_all_close(p_sparse, p_dense, rtol=1e-6, atol=1e-7)
  chex.assert_trees_all_close(s_sparse, s_dense, rtol=1e-6, atol=1e-7)
  # Rows 3 and 6 never appear: untouched.
  np.testing.assert_array_equal(p_sparse["emb"][np.array([3, 6])],
                                _table()["emb"][np.array([3, 6])])


@pytest.mark.op_by_op
def test_ftrl_bcoo_step_updates_only_the_rows_in_the_gradient():
  """MXNet's row-sparse FTRL: an absent row keeps its weight, z and n; a present
  row gets what the dense step on the same gradient gives it."""
  params = _table()
  tx = lars_optax.mxnet.create("ftrl", learning_rate=0.05, lamda1=0.02, wd=0.01)
  state = tx.init(params)
  g = lars_optax.sparse.row_sparse(jnp.ones((2, 3)), rows=jnp.array([1, 5]), num_rows=8)
  grads = {"emb": g, "fc1_bias": jnp.ones(3)}
  updates, new_state = jax.jit(tx.update)(grads, state, params)
  dense_updates, dense_state = tx.update({**grads, "emb": g.todense()}, state, params)
  new = optax.apply_updates(params, updates)["emb"]
  dense = optax.apply_updates(params, dense_updates)["emb"]
  present, absent = np.array([1, 5]), np.array([0, 2, 3, 4, 6, 7])
  np.testing.assert_allclose(new[present], dense[present], rtol=1e-6)
  np.testing.assert_array_equal(new[absent], params["emb"][absent])
  assert not np.allclose(dense[absent], params["emb"][absent])  # (the dense step rewrites them)
  for buf in ("z", "n"):
    ours = optax.tree_utils.tree_get(new_state, buf)["emb"]
    np.testing.assert_allclose(ours, optax.tree_utils.tree_get(dense_state, buf)["emb"],
                               rtol=1e-6)
  chex.assert_trees_all_close(optax.apply_updates(params, updates)["fc1_bias"],
                              optax.apply_updates(params, dense_updates)["fc1_bias"])


@pytest.mark.parametrize("name", sorted(ROW_SPARSE))
def test_bcoo_step_has_no_table_sized_temporary(name):
  n, d, k = 100_000, 32, 64
  params = {"emb": jnp.zeros((n, d))}
  tx = ROW_SPARSE[name]()
  state = tx.init(params)
  grads = {"emb": lars_optax.sparse.row_sparse(jnp.ones((k, d)), rows=jnp.arange(k) * 7,
                                               num_rows=n)}

  def step(params, state, grads):
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  compiled = jax.jit(step, donate_argnums=(0, 1)).lower(params, state, grads).compile()
  mem = compiled.memory_analysis()
  table = n * d * 4
  assert mem.temp_size_in_bytes < table // 20, (mem.temp_size_in_bytes, table)
  # The table and every buffer are updated in place.
  buffers = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(state))
  assert mem.alias_size_in_bytes >= table + buffers - 64


@pytest.mark.parametrize("kwargs", [{"wd": 0.1}, {"wd": 0.1, "wd_mult": {"fc1_bias": 0.0}}])
def test_adagrad_bcoo_with_weight_decay_names_the_leaf(kwargs):
  params = _table()
  tx = lars_optax.mxnet.create("adagrad", **kwargs)
  grads = {"emb": lars_optax.sparse.row_sparse(jnp.ones((1, 3)), rows=jnp.array([2]), num_rows=8),
           "fc1_bias": jnp.ones(3)}
  with pytest.raises(ValueError, match=(
      r"wd: gradient 'emb' is row-sparse \(a BCOO\), but its weight decay is 0.1 .*"
      r"wd_mult=\{'emb': 0.0\}")):
    tx.update(grads, tx.init(params), params)


@pytest.mark.op_by_op
def test_groupadagrad_row_mean_of_float16_squares_is_taken_in_float32():
  """A row of 100 entries of 100: each square (1e4) fits float16, their sum (1e6) does not."""
  params = {"w": jnp.zeros((2, 100), jnp.float16)}
  tx = lars_optax.mxnet.groupadagrad(0.1)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", lars_optax.LowPrecisionWarning)
    state = tx.init(params)
  updates, state = tx.update({"w": jnp.full((2, 100), 100.0, jnp.float16)}, state, params)
  assert bool(jnp.all(jnp.isfinite(updates["w"])))
  np.testing.assert_allclose(np.asarray(updates["w"], np.float32), -0.1, rtol=1e-2)
