"""Tests for lars_optax.sparse.optax_compat: tree_add, clip_by_global_norm and multi_steps.

Each equals its optax counterpart on the equivalent dense gradients; the
row-sparse buffers of multi_steps do not grow with the table.
"""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lars_optax

N, D = 40, 3


def _params():
  rng = np.random.default_rng(0)
  return {"emb": jnp.asarray(rng.normal(size=(N, D)), jnp.float32),
          "w": jnp.asarray(rng.normal(size=(D,)), jnp.float32)}


def _loss(p, ids):
  return jnp.sum(jnp.tanh(p["emb"][ids] @ p["w"]))


def _batches(n=6, seed=1):
  rng = np.random.default_rng(seed)
  return [jnp.asarray(rng.integers(0, N, (4,)), jnp.int32) for _ in range(n)]


def _dense(tree):
  return jax.tree.map(lambda x: x.todense() if lars_optax.sparse.is_row_sparse(x) else x, tree,
                      is_leaf=lars_optax.sparse.is_row_sparse)


SPARSE_GRAD = lars_optax.sparse.value_and_grad(_loss, sparse="emb")


@pytest.mark.op_by_op
def test_tree_add_equals_the_sum_of_the_dense_gradients():
  params = _params()
  g1, g2 = (SPARSE_GRAD(params, ids)[1] for ids in _batches(2))
  total = lars_optax.sparse.tree_add(g1, g2)
  assert total["emb"].nse == g1["emb"].nse + g2["emb"].nse
  chex.assert_trees_all_close(_dense(total), optax.tree_utils.tree_add(_dense(g1), _dense(g2)),
                              rtol=1e-6)
  # The sum trains the right rows.
  tx = lars_optax.mxnet.sgd(0.1, lazy_update=True)
  updates, _ = jax.jit(tx.update)(total, tx.init(params), params)
  ref, _ = tx.update(_dense(total), tx.init(params), params)
  chex.assert_trees_all_close(optax.apply_updates(params, updates),
                              optax.apply_updates(params, ref), rtol=1e-6)


def test_tree_add_rejects_a_mix_of_sparse_and_dense_naming_the_leaf():
  params = _params()
  g = SPARSE_GRAD(params, _batches(1)[0])[1]
  with pytest.raises(ValueError, match="tree_add: leaf 'emb' is row-sparse in some trees"):
    lars_optax.sparse.tree_add(g, _dense(g))


@pytest.mark.op_by_op
@pytest.mark.parametrize("max_norm", [0.01, 1e3])
def test_clip_by_global_norm_equals_optax_on_dense_gradients(max_norm):
  params = _params()
  ids = jnp.array([3, 3, 7, 1])  # a repeated row: its entries are summed before the norm
  g = SPARSE_GRAD(params, ids)[1]
  clipped, _ = jax.jit(lars_optax.sparse.clip_by_global_norm(max_norm).update)(g,
                                                                               optax.EmptyState())
  ref, _ = optax.clip_by_global_norm(max_norm).update(_dense(g), optax.EmptyState())
  assert lars_optax.sparse.is_row_sparse(clipped["emb"])
  chex.assert_trees_all_close(_dense(clipped), ref, rtol=1e-6)


@pytest.mark.skipif(jax.device_count() < 4, reason="needs 4 devices (see conftest.py)")
@pytest.mark.parametrize("split", ["features", "layers"])
def test_clip_by_global_norm_inside_shard_map_takes_the_whole_norm(split):
  """A leaf split across devices counts whole (its param varies over the axis), a
  replicated one once: the one-device clip, whether the split is by features or by the
  layers of a stack (which needs no axis_name for its ratios)."""
  from jax.sharding import Mesh
  from jax.sharding import PartitionSpec as P

  rng = np.random.default_rng(0)
  params = {"kernel": jnp.asarray(rng.normal(size=(4, 3, 2)), jnp.float32),
            "bias": jnp.asarray(rng.normal(size=(3,)), jnp.float32)}
  grads = jax.tree.map(lambda x: 0.5 * x + 0.1, params)
  spec = {"kernel": P(None, None, "x") if split == "features" else P("x"), "bias": P()}
  mesh = Mesh(np.array(jax.devices()[:2]), ("x",))
  clip = lars_optax.sparse.clip_by_global_norm(0.5)
  expected, _ = clip.update(grads, optax.EmptyState(), params)

  @jax.jit
  @functools.partial(jax.shard_map, mesh=mesh, in_specs=(spec, spec), out_specs=spec)
  def sharded(g, p):
    return clip.update(g, optax.EmptyState(), p)[0]

  chex.assert_trees_all_close(sharded(grads, params), expected, rtol=1e-6)
  # Through a porting constructor: timm's LAMB with max_grad_norm, split by features.
  if split == "features":
    make = lambda **kw: lars_optax.porting.timm_lamb(0.1, weight_decay=1e-2,
                                                      max_grad_norm=0.1, **kw)
    whole, tx = make(), make(axis_name="x")
    want, _ = whole.update(grads, whole.init(params), params)

    @jax.jit
    @functools.partial(jax.shard_map, mesh=mesh, in_specs=(spec, spec), out_specs=spec)
    def step(g, p):
      return tx.update(g, tx.init(p), p)[0]

    chex.assert_trees_all_close(step(grads, params), want, rtol=1e-5, atol=1e-8)
  # Params of another tree than the gradients' are named, not a deep pytree error.

  @jax.jit
  @functools.partial(jax.shard_map, mesh=mesh, in_specs=(spec, spec), out_specs=spec)
  def mismatched(g, p):
    return clip.update(g, optax.EmptyState(), {"kernel": p["kernel"]})[0]

  with pytest.raises(ValueError, match=r"^clip_by_global_norm: params must have the gradients'"):
    mismatched(grads, params)


@pytest.mark.skipif(jax.device_count() < 4, reason="needs 4 devices (see conftest.py)")
def test_clip_by_global_norm_without_types_is_global_or_refused():
  """shard_map(check_vma=False): no type says which leaves are split. With axis_name every
  leaf is summed over it (the one-device clip, also through timm's max_grad_norm);
  without it replicated gradients (pmap's pmean) pass and split ones are refused."""
  from jax.sharding import Mesh
  from jax.sharding import PartitionSpec as P

  rng = np.random.default_rng(0)
  params = {"kernel": jnp.asarray(rng.normal(size=(3, 8)), jnp.float32),
            "bias": jnp.asarray(rng.normal(size=(8,)), jnp.float32)}
  grads = jax.tree.map(lambda x: 0.5 * x + 0.1, params)
  split = {"kernel": P(None, "x"), "bias": P("x")}
  mesh = Mesh(np.array(jax.devices()[:4]), ("x",))

  def run(tx, spec):
    @jax.jit
    @functools.partial(jax.shard_map, mesh=mesh, in_specs=(spec, spec), out_specs=spec,
                       check_vma=False)
    def step(g, p):
      return tx.update(g, tx.init(p), p)[0]
    return step(grads, params)

  clip = lars_optax.sparse.clip_by_global_norm(0.5)
  want, _ = clip.update(grads, optax.EmptyState(), params)
  chex.assert_trees_all_close(
      run(lars_optax.sparse.clip_by_global_norm(0.5, axis_name="x"), split), want, rtol=1e-6)
  chex.assert_trees_all_close(run(clip, {"kernel": P(), "bias": P()}), want, rtol=1e-6)
  with pytest.raises(Exception, match=r"clip_by_global_norm: inside shard_map with "
                     r"check_vma=False \(or pmap\) the devices' gradient norms differ"):
    jax.block_until_ready(run(clip, split))
  make = lambda **kw: lars_optax.porting.timm_lamb(0.1, weight_decay=1e-2, max_grad_norm=0.1,
                                                    **kw)
  whole = make()
  want, _ = whole.update(grads, whole.init(params), params)
  chex.assert_trees_all_close(run(make(axis_name="x"), split), want, rtol=1e-5, atol=1e-8)
  # #58 item 13: an axis per split leaf, the others replicated: the global norm is
  # known (it was refused, telling the user to pass the axis_name they had passed).
  mixed, per_leaf = {"kernel": P(None, "x"), "bias": P()}, {"kernel": "x"}
  clip_want, _ = clip.update(grads, optax.EmptyState(), params)
  chex.assert_trees_all_close(
      run(lars_optax.sparse.clip_by_global_norm(0.5, axis_name=per_leaf), mixed), clip_want,
      rtol=1e-6)
  chex.assert_trees_all_close(run(make(axis_name=per_leaf), mixed), want, rtol=1e-5, atol=1e-8)


@pytest.mark.op_by_op
def test_clip_then_lazy_adam_equals_optax_clip_then_dense_lazy_adam():
  params = _params()
  tx = optax.chain(lars_optax.sparse.clip_by_global_norm(0.1), lars_optax.mxnet.adam(0.1,
                                                                                     lazy_update=True))
  ref_tx = optax.chain(optax.clip_by_global_norm(0.1), lars_optax.mxnet.adam(0.1, lazy_update=True))
  p, s = params, tx.init(params)
  rp, rs = params, ref_tx.init(params)
  for ids in _batches(3):
    g = SPARSE_GRAD(p, ids)[1]
    u, s = jax.jit(tx.update)(g, s, p)
    p = optax.apply_updates(p, u)
    ru, rs = ref_tx.update(_dense(SPARSE_GRAD(rp, ids)[1]), rs, rp)
    rp = optax.apply_updates(rp, ru)
  chex.assert_trees_all_close(p, rp, rtol=1e-5, atol=1e-6)


@pytest.mark.op_by_op
@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "row_sparse"])
def test_clip_by_global_norm_takes_a_low_precision_norm_in_float32(dtype, sparse):
  """4,096 entries of 4 have norm 256; their sum of squares (65,536) overflows float16."""
  g = jnp.full((64, 64), 4.0, dtype)
  grad = lars_optax.sparse.row_sparse(g, rows=jnp.arange(64), num_rows=64) if sparse else g
  out, _ = lars_optax.sparse.clip_by_global_norm(1.0).update({"w": grad}, optax.EmptyState())
  values = out["w"].data if sparse else out["w"]
  assert values.dtype == dtype
  np.testing.assert_allclose(np.asarray(values, np.float32), 4.0 / 256, rtol=1e-2)
  big = jnp.full((64, 64), 2000.0, dtype)  # norm 128,000: not even the norm fits float16
  out, _ = lars_optax.sparse.clip_by_global_norm(1.0).update({"w": big}, optax.EmptyState())
  np.testing.assert_allclose(np.asarray(out["w"], np.float32), 1 / 64, rtol=1e-2)


@pytest.mark.parametrize("max_norm", [0, -1.0])
def test_clip_by_global_norm_bad_max_norm(max_norm):
  with pytest.raises(ValueError, match="max_norm"):
    lars_optax.sparse.clip_by_global_norm(max_norm)


@pytest.mark.op_by_op
@pytest.mark.parametrize("k", [1, 3])
def test_multi_steps_equals_optax_multi_steps_on_dense_gradients(k):
  params = _params()
  inner = lambda: lars_optax.mxnet.adam(0.1, lazy_update=True)
  tx = lars_optax.sparse.multi_steps(inner(), every_k_schedule=k, sparse="emb", nse=4)
  ref_tx = optax.MultiSteps(inner(), k).gradient_transformation()
  p, s = params, tx.init(params)
  rp, rs = params, ref_tx.init(params)
  step = jax.jit(tx.update)
  for ids in _batches(6):
    u, s = step(SPARSE_GRAD(p, ids)[1], s, p)
    p = optax.apply_updates(p, u)
    ru, rs = ref_tx.update(_dense(SPARSE_GRAD(rp, ids)[1]), rs, rp)
    rp = optax.apply_updates(rp, ru)
  chex.assert_trees_all_close(p, rp, rtol=1e-5, atol=1e-6)
  assert int(s.gradient_step) == 6 // k


@pytest.mark.op_by_op
def test_multi_steps_dense_only_with_a_schedule_equals_optax():
  params = _params()
  schedule = lambda step: jnp.where(step < 1, 2, 3)
  tx = lars_optax.sparse.multi_steps(optax.sgd(0.1), every_k_schedule=schedule)
  ref_tx = optax.MultiSteps(optax.sgd(0.1), schedule).gradient_transformation()
  p, s, rp, rs = params, tx.init(params), params, ref_tx.init(params)
  for ids in _batches(5):
    u, s = tx.update(jax.grad(_loss)(p, ids), s, p)
    p = optax.apply_updates(p, u)
    ru, rs = ref_tx.update(jax.grad(_loss)(rp, ids), rs, rp)
    rp = optax.apply_updates(rp, ru)
  chex.assert_trees_all_close(p, rp, rtol=1e-6)


@pytest.mark.op_by_op
def test_multi_steps_should_skip_update_fn_equals_optax_with_a_nan_batch():
  # optax's skip_not_finite: the NaN call is skipped (not counted), as in optax.
  params = _params()
  tx = lars_optax.sparse.multi_steps(optax.sgd(0.1), every_k_schedule=2,
                                     should_skip_update_fn=optax.skip_not_finite)
  ref_tx = optax.MultiSteps(optax.sgd(0.1), 2,
                            should_skip_update_fn=optax.skip_not_finite).gradient_transformation()
  p, s, rp, rs = params, tx.init(params), params, ref_tx.init(params)
  assert set(ref_tx.init(params)._fields) == set(s._fields)
  step = jax.jit(tx.update)
  for i, ids in enumerate(_batches(5)):
    g, rg = jax.grad(_loss)(p, ids), jax.grad(_loss)(rp, ids)
    if i == 2:
      g = jax.tree.map(lambda x: x * jnp.nan, g)
      rg = jax.tree.map(lambda x: x * jnp.nan, rg)
    u, s = step(g, s, p)
    p = optax.apply_updates(p, u)
    ru, rs = ref_tx.update(rg, rs, rp)
    rp = optax.apply_updates(rp, ru)
  chex.assert_trees_all_close(p, rp, rtol=1e-6)
  chex.assert_trees_all_equal(s.skip_state, rs.skip_state)
  assert int(s.gradient_step) == int(rs.gradient_step) == 2


def test_multi_steps_memory_does_not_grow_with_the_table():
  def temp_bytes(n):
    params = {"emb": jnp.zeros((n, 16)), "w": jnp.zeros(16)}
    tx = lars_optax.sparse.multi_steps(lars_optax.mxnet.adam(0.1, lazy_update=True),
                                       every_k_schedule=4, sparse="emb", nse=64)
    g = {"emb": lars_optax.sparse.row_sparse(jnp.ones((64, 16)), rows=jnp.arange(64), num_rows=n),
         "w": jnp.ones(16)}

    def step(params, state, g):
      u, state = tx.update(g, state, params)
      return optax.apply_updates(params, u), state

    compiled = jax.jit(step, donate_argnums=(0, 1)).lower(params, tx.init(params), g).compile()
    return compiled.memory_analysis().temp_size_in_bytes

  small, large = temp_bytes(10_000), temp_bytes(200_000)
  assert large < small + 200_000 * 16 * 4 // 20, (small, large)


@pytest.mark.parametrize("kwargs, match", [
    ({"every_k_schedule": 0}, "every_k_schedule: expected an int >= 1"),
    ({"every_k_schedule": True}, "every_k_schedule: expected an int >= 1"),
    ({"every_k_schedule": 2, "sparse": "emb"}, "nse: expected an int >= 1"),
    ({"every_k_schedule": lambda s: 2, "sparse": "emb", "nse": 4}, "needs a fixed k"),
])
def test_multi_steps_bad_arguments(kwargs, match):
  with pytest.raises(ValueError, match=match):
    lars_optax.sparse.multi_steps(optax.sgd(0.1), **kwargs)


def test_multi_steps_sparse_leaf_not_named_raises():
  params = _params()
  tx = lars_optax.sparse.multi_steps(optax.sgd(0.1), every_k_schedule=2)
  with pytest.raises(ValueError, match=r"multi_steps: gradient 'emb' is row-sparse; name it in "
                     "`sparse`"):
    tx.update(SPARSE_GRAD(params, _batches(1)[0])[1], tx.init(params), params)


# (The Equinox examples of apply_updates and dense_updates are doctests: tests/test_docstrings.py.)


# --------------------------------------------------------------------------
# dense_updates: arrays for code that maps over the updates first
# --------------------------------------------------------------------------


def _updates_first(params, updates):
  """How eqx.apply_updates (and many hand-written loops) apply: over the updates."""
  return jax.tree.map(lambda u, p: p + u, updates, params)


@pytest.mark.parametrize("kind", ["bcoo", "row_sparse"])
@pytest.mark.parametrize("name", ["adam", "sgd", "groupadagrad"])
def test_dense_updates_step_equals_the_row_sparse_step_without_a_table_sized_temporary(
    name, kind):
  """Inside one jit, XLA folds ``params + densified update`` into a scatter-add of the
  rows into the donated params: no table-sized temporary, params and state in place."""
  from jax.experimental.sparse import BCOO

  n, d, k = 100_000, 32, 64
  make = {"adam": lambda: lars_optax.mxnet.adam(0.1, lazy_update=True),
          "sgd": lambda: lars_optax.mxnet.sgd(0.1, momentum=0.9, lazy_update=True),
          "groupadagrad": lambda: lars_optax.mxnet.create("groupadagrad", learning_rate=0.1)}[name]
  rows = jnp.asarray(np.arange(k) * 7 % n, jnp.int32)
  values = jnp.asarray(np.random.default_rng(0).normal(size=(k, d)), jnp.float32)
  grads = {"emb": (BCOO((values, rows[:, None]), shape=(n, d)) if kind == "bcoo"
                   else lars_optax.sparse.row_sparse(values, rows=rows, num_rows=n))}
  params = {"emb": jnp.asarray(np.random.default_rng(1).normal(size=(n, d)), jnp.float32)}
  sparse_tx, tx = make(), lars_optax.sparse.dense_updates(make())

  def step(params, state, grads):
    updates, state = tx.update(grads, state, params)
    return _updates_first(params, updates), state

  state = tx.init(params)
  compiled = jax.jit(step, donate_argnums=(0, 1)).lower(params, state, grads).compile()
  mem = compiled.memory_analysis()
  table = n * d * 4
  assert mem.temp_size_in_bytes < table // 20, (mem.temp_size_in_bytes, table)
  buffers = sum(x.nbytes for x in jax.tree.leaves((params, state)) if x.shape[:1] == (n,))
  assert mem.alias_size_in_bytes >= buffers

  expected_updates, expected_state = jax.jit(sparse_tx.update)(grads, sparse_tx.init(params),
                                                               params)
  expected = jax.tree.map(np.asarray, (optax.apply_updates(params, expected_updates),
                                       expected_state))
  new = compiled(params, state, grads)
  chex.assert_trees_all_close(new, expected, rtol=1e-6)


def test_dense_updates_leaves_dense_gradients_and_the_state_alone():
  params = _params()
  grads = jax.tree.map(lambda x: jnp.full_like(x, 0.5), params)
  inner = lars_optax.mxnet.adam(0.1)
  tx = lars_optax.sparse.dense_updates(lars_optax.mxnet.adam(0.1))
  chex.assert_trees_all_equal(tx.init(params), inner.init(params))
  chex.assert_trees_all_equal(tx.update(grads, tx.init(params), params),
                              inner.update(grads, inner.init(params), params))


def test_dense_updates_rejects_what_is_not_a_transformation():
  with pytest.raises(TypeError, match=r"dense_updates: `inner` must be an optax "
                                      r"GradientTransformation, got str"):
    lars_optax.sparse.dense_updates("adam")


@pytest.mark.op_by_op
def test_dense_updates_under_multi_precision_keeps_the_float32_update():
  """A float16 table with float32 masters: the dense update is float32, and applying it
  with optax.apply_updates equals applying the row-sparse one (float16 kept)."""
  params = {"emb": jnp.asarray(np.random.default_rng(0).normal(size=(6, 3)), jnp.float16)}
  grads = {"emb": lars_optax.sparse.row_sparse(jnp.ones((2, 3), jnp.float16),
                                               rows=jnp.array([1, 4]), num_rows=6)}
  make = lambda: lars_optax.mxnet.adam(0.1, lazy_update=True, multi_precision=True)
  sparse_tx, tx = make(), lars_optax.sparse.dense_updates(make())
  updates, _ = jax.jit(tx.update)(grads, tx.init(params), params)
  expected, _ = jax.jit(sparse_tx.update)(grads, sparse_tx.init(params), params)
  assert updates["emb"].dtype == jnp.float32
  new = optax.apply_updates(params, updates)
  assert new["emb"].dtype == jnp.float16
  chex.assert_trees_all_equal(new, optax.apply_updates(params, expected))
  assert _updates_first(params, updates)["emb"].dtype == jnp.float32  # as eqx.apply_updates
