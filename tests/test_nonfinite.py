"""Non-finite gradients: trust ratios stay finite, and bad steps can be skipped.

Covered: a NaN or an infinity in a gradient never makes a LARS trust ratio NaN
(the ratio of that leaf falls back to 1, the others are untouched);
:func:`lars_optax.skip_nonfinite` around every optimizer (including
``multi_precision``, ``lazy_update`` and a host-side scheduler) leaves the
params and every state buffer bit-for-bit unchanged on a bad step, counts the
skips, and continues exactly as if the bad batch had never been seen;
``optax.apply_if_finite`` does the same for the optimizers without
``multi_precision``; and a training loop with injected NaN batches converges.
"""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lars_optax

NAN, INF = float("nan"), float("inf")

VARIANTS = {
    "lars": lambda: lars_optax.lars(0.1, momentum=0.9, wd=1e-3, eta=0.01),
    "lars_mp": lambda: lars_optax.lars(0.1, momentum=0.9, wd=1e-3, multi_precision=True),
    "tf_lars": lambda: lars_optax.tf_lars(0.1, use_nesterov=True),
    "signum": lambda: lars_optax.signum(0.01, wd_lh=1e-3),
    "signsgd": lambda: lars_optax.signsgd(0.01, wd=1e-3),
    "adam": lambda: lars_optax.mxnet.adam(0.01, wd=1e-3),
    "adam_lazy_mp": lambda: lars_optax.mxnet.adam(0.01, lazy_update=True, multi_precision=True),
    "sgd": lambda: lars_optax.mxnet.sgd(0.1, momentum=0.9, wd=1e-3),
    "sgd_mp": lambda: lars_optax.mxnet.sgd(0.1, momentum=0.9, multi_precision=True),
    "nag": lambda: lars_optax.mxnet.nag(0.1, momentum=0.9, wd=1e-3),
    "dcasgd": lambda: lars_optax.mxnet.dcasgd(0.1, momentum=0.9, lamda=0.5),
    "sgld": lambda: lars_optax.mxnet.sgld(0.01, wd=1e-3, key=1),
    # A Python scheduler (branches on the count) runs on the host under jit.
    "create_sgd_host_scheduler": lambda: lars_optax.mxnet.create(
        "sgd", momentum=0.9, lr_scheduler=lambda n: 0.1 if n < 3 else 0.05),
}
MP = {"lars_mp", "adam_lazy_mp", "sgd_mp"}


def _params(dtype=jnp.float32):
  return {"fc_weight": jnp.arange(1.0, 7.0, dtype=dtype).reshape(2, 3) / 3,
          "fc_bias": jnp.array([0.5, -0.5, 1.0], dtype)}


def _grads(params, k):
  return jax.tree.map(lambda p: (0.1 * (k + 1) * p + 0.05).astype(p.dtype), params)


def _poison(grads, value):
  return {**grads, "fc_weight": grads["fc_weight"].at[1, 2].set(value)}


# --------------------------------------------------------------------------
# Trust ratios
# --------------------------------------------------------------------------


@pytest.mark.parametrize("make", [
    lambda: lars_optax.lars(0.1, momentum=0.9, eta=0.01, skip=None),
    lambda: lars_optax.lars(0.1, eta=0.01, wd=1e-3, skip=None, multi_precision=True),
    lambda: lars_optax.tf_lars(0.1),
    lambda: lars_optax.scale_by_lars_trust_ratio(trust_coefficient=0.01, grad_scale=0.5),
], ids=["lars", "lars_mp", "tf_lars", "scale_by_lars_trust_ratio"])
@pytest.mark.parametrize("bad", [NAN, INF, -INF])
def test_nonfinite_gradient_never_makes_a_trust_ratio_nan(make, bad):
  params = _params()
  tx = make()
  _, clean = tx.update(_grads(params, 0), tx.init(params), params)
  _, state = tx.update(_poison(_grads(params, 0), bad), tx.init(params), params)
  ratios = lars_optax.trust_ratios(state, params)
  clean = lars_optax.trust_ratios(clean, params)
  assert all(np.isfinite(float(r)) for r in ratios.values())
  assert float(ratios["fc_weight"]) == 1.0  # the fallback
  assert float(clean["fc_weight"]) != 1.0
  assert float(ratios["fc_bias"]) == float(clean["fc_bias"])  # other leaves untouched


@pytest.mark.parametrize("bad", [NAN, INF])
def test_nonfinite_weight_gives_ratio_one(bad):
  params = {**_params(), "fc_weight": _params()["fc_weight"].at[0, 0].set(bad)}
  tx = lars_optax.lars(0.1, skip=None)
  _, state = tx.update(_grads(_params(), 0), tx.init(params), params)
  assert float(lars_optax.trust_ratios(state, params)["fc_weight"]) == 1.0


# --------------------------------------------------------------------------
# Skipping bad steps
# --------------------------------------------------------------------------


def _jit_step(tx):
  @jax.jit
  def step(params, state, grads):
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  return step


def _run(tx, grads_seq, dtype=jnp.float32, step=None):
  """Jitted steps from ``_params(dtype)``; the params and state after each one."""
  params = _params(dtype)
  state = tx.init(params)
  step = step or _jit_step(tx)
  out = []
  for grads in grads_seq:
    params, state = step(params, state, grads)
    out.append((params, state))
  return out


def _check_skipping(tx, name, bad):
  dtype = jnp.bfloat16 if name in MP else jnp.float32
  p = _params(dtype)
  g0, g1, g2 = (_grads(p, k) for k in range(3))
  step = _jit_step(tx)
  (p0, s0), (p1, s1), (p2, s2) = _run(tx, [g0, _poison(g1, bad), g2], dtype, step)
  # The bad step changes neither the params nor any state buffer.
  chex.assert_trees_all_equal(p1, p0)
  chex.assert_trees_all_equal(s1.inner_state, s0.inner_state)
  assert (int(s1.notfinite_count), bool(s1.last_finite), int(s1.total_notfinite)) == (1, False, 1)
  assert (int(s2.notfinite_count), bool(s2.last_finite), int(s2.total_notfinite)) == (0, True, 1)
  # ... and the next step is the one the run without the bad batch takes.
  (q0, _), (q1, r1) = _run(tx, [g0, g2], dtype, step)
  chex.assert_trees_all_equal(q0, p0)
  chex.assert_trees_all_equal((p2, s2.inner_state), (q1, r1.inner_state))
  chex.assert_tree_all_finite(p2)


@pytest.mark.op_by_op
@pytest.mark.parametrize("name, bad", [(name, NAN) for name in sorted(VARIANTS)]
                         + [("lars", INF), ("adam", -INF), ("sgd_mp", INF)])
def test_skip_nonfinite_leaves_params_and_state_unchanged(name, bad):
  _check_skipping(lars_optax.skip_nonfinite(VARIANTS[name]()), name, bad)


@pytest.mark.op_by_op
@pytest.mark.parametrize("name", sorted(set(VARIANTS) - MP))
def test_optax_apply_if_finite_composes_without_multi_precision(name):
  _check_skipping(optax.apply_if_finite(VARIANTS[name](), max_consecutive_errors=100),
                  name, NAN)


def test_skip_nonfinite_never_gives_up_by_default():
  tx = lars_optax.skip_nonfinite(lars_optax.mxnet.sgd(0.1, momentum=0.9))
  p = _params()
  steps = _run(tx, [_poison(_grads(p, k), NAN) for k in range(5)])
  chex.assert_trees_all_equal(steps[-1][0], p)
  assert int(steps[-1][1].total_notfinite) == 5 and int(steps[-1][1].notfinite_count) == 5


def test_skip_nonfinite_max_consecutive_errors_gives_up_like_optax():
  tx = lars_optax.skip_nonfinite(lars_optax.mxnet.sgd(0.1), max_consecutive_errors=1)
  p = _params()
  (p0, _), (p1, s1) = _run(tx, [_poison(_grads(p, k), NAN) for k in range(2)])
  chex.assert_trees_all_equal(p0, p)  # the first is skipped
  assert np.isnan(np.asarray(p1["fc_weight"])).any()  # the second is applied
  assert int(s1.total_notfinite) == 2


@pytest.mark.op_by_op
def test_trust_ratios_and_masters_found_through_the_wrapper():
  tx = lars_optax.skip_nonfinite(lars_optax.lars(0.1, eta=0.01, multi_precision=True))
  params = _params(jnp.float16)
  updates, state = tx.update(_grads(params, 0), tx.init(params), params)
  assert lars_optax.trust_ratios(state).shape == (2,)
  masters = lars_optax.master_params(state, optax.apply_updates(params, updates))
  assert masters["fc_weight"].dtype == jnp.float32


def test_skip_nonfinite_empty_tree_and_extra_args():
  tx = lars_optax.skip_nonfinite(lars_optax.tf_lars(0.1))
  assert tx.update({}, tx.init({}), {})[0] == {}
  params = _params()
  updates, _ = tx.update(_grads(params, 0), tx.init(params), params, value=jnp.array(1.0))
  chex.assert_tree_all_finite(updates)


@pytest.mark.parametrize("make, dtype", [
    (lambda: lars_optax.lars(0.5, momentum=0.9, eta=0.05, skip="mxnet"), jnp.float32),
    (lambda: lars_optax.mxnet.adam(0.05), jnp.float32),
    (lambda: lars_optax.mxnet.sgd(0.1, momentum=0.9, multi_precision=True), jnp.bfloat16),
], ids=["lars", "adam", "sgd_mp_bfloat16"])
def test_training_loop_survives_injected_nan_batches(make, dtype):
  """Linear regression; every third batch holds a NaN input, so its gradient is NaN."""
  rng = np.random.default_rng(0)
  w_true = rng.normal(size=(4, 1)).astype(np.float32)
  batches = []
  for i in range(60):
    x = rng.normal(size=(16, 4)).astype(np.float32)
    y = x @ w_true + 0.5
    if i % 3 == 2:
      x[rng.integers(16), rng.integers(4)] = np.nan
    batches.append((jnp.asarray(x), jnp.asarray(y)))

  def loss(params, x, y):
    pred = x @ params["fc_weight"].astype(jnp.float32) + params["fc_bias"].astype(jnp.float32)
    return jnp.mean((pred - y) ** 2)

  tx = lars_optax.skip_nonfinite(make())

  @jax.jit
  def step(params, state, x, y):
    grads = jax.grad(loss)(params, x, y)
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  def train(batches):
    params = {"fc_weight": jnp.full((4, 1), 0.1, dtype), "fc_bias": jnp.zeros((1,), dtype)}
    state = tx.init(params)
    for x, y in batches:
      params, state = step(params, state, x, y)
    return params, state

  params, state = train(batches)
  assert int(state.total_notfinite) == 20
  chex.assert_tree_all_finite(params)
  x, y = batches[0]
  assert float(loss(params, x, y)) < 0.05 * float(
      loss({"fc_weight": jnp.full((4, 1), 0.1), "fc_bias": jnp.zeros((1,))}, x, y))
  # The same as training on the clean batches only.
  clean, _ = train([b for i, b in enumerate(batches) if i % 3 != 2])
  chex.assert_trees_all_equal(params, clean)


# --------------------------------------------------------------------------
# What the optimizer uses, signed zeros, and no internal NaN
# --------------------------------------------------------------------------


@pytest.mark.parametrize("make", [
    lambda: lars_optax.mxnet.sgd(0.1, momentum=0.9),
    lambda: lars_optax.signum(0.01),  # sign(inf) is finite: only the cast gradient shows it
    lambda: lars_optax.lars(0.1, momentum=0.9),
], ids=["sgd", "signum", "lars"])
def test_skip_nonfinite_counts_a_gradient_that_overflows_the_param_dtype(make):
  # 1e5 is finite in float32 and inf once cast to the float16 param's dtype.
  tx = lars_optax.skip_nonfinite(make())
  params = {"w": jnp.ones(3, jnp.float16)}
  state = tx.init(params)
  for step in (tx.update, jax.jit(tx.update)):
    updates, new_state = step({"w": jnp.array([1.0, 1e5, 1.0], jnp.float32)}, state, params)
    assert int(new_state.total_notfinite) == 1
    chex.assert_trees_all_equal(optax.apply_updates(params, updates), params)
    chex.assert_trees_all_equal(new_state.inner_state, state.inner_state)


def test_skip_nonfinite_applies_that_gradient_under_multi_precision():
  # The float32 master takes 1e5 as it is: nothing overflows, nothing is skipped.
  tx = lars_optax.skip_nonfinite(lars_optax.mxnet.sgd(1e-6, multi_precision=True))
  params = {"w": jnp.ones(3, jnp.float16)}
  updates, state = tx.update({"w": jnp.array([1.0, 1e5, 1.0])}, tx.init(params), params)
  assert int(state.total_notfinite) == 0
  np.testing.assert_allclose(np.asarray(updates["w"], np.float32)[1], -0.1, rtol=1e-2)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("name", ["sgd", "lars_mp", "adam"])
def test_skipped_step_keeps_negative_zero_bit_for_bit(name, jit):
  tx = lars_optax.skip_nonfinite(VARIANTS[name]())
  dtype = jnp.bfloat16 if name in MP else jnp.float32
  params = {"fc_weight": jnp.array([[-0.0, 0.0, -1.5], [2.0, -0.0, 3.0]], dtype),
            "fc_bias": jnp.array([-0.0, 0.5, -0.0], dtype)}
  grads = _poison(_grads(params, 0), NAN)
  update = jax.jit(tx.update) if jit else tx.update
  apply = jax.jit(optax.apply_updates) if jit else optax.apply_updates
  updates, state = update(grads, tx.init(params), params)
  assert int(state.total_notfinite) == 1
  new = apply(params, updates)
  for a, b in zip(jax.tree.leaves(new), jax.tree.leaves(params)):
    np.testing.assert_array_equal(np.asarray(a).view(np.uint16 if a.itemsize == 2 else np.uint32),
                                  np.asarray(b).view(np.uint16 if b.itemsize == 2 else np.uint32))


ZERO_LAYER = {
    **VARIANTS,
    "tf_lars_plain": lambda: lars_optax.tf_lars(0.1, momentum=0.0, weight_decay=0.0),
    "lars_skip_none": lambda: lars_optax.lars(0.1, momentum=0.9, wd=1e-3, skip=None),
    "adam_epsilon_0": lambda: lars_optax.mxnet.adam(0.01, epsilon=0.0),
    "signum_jnp_momentum": lambda: lars_optax.signum(0.01, momentum=jnp.float32(0.9)),
    "skip_nonfinite_lars": lambda: lars_optax.skip_nonfinite(lars_optax.lars(0.1, skip=None)),
}


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("name", sorted(ZERO_LAYER))
def test_zero_layer_with_zero_gradient_forms_no_nan(name, jit):
  """jax_debug_nans raises on any NaN computed, even one masked out afterwards."""
  tx = ZERO_LAYER[name]()
  params = jax.tree.map(jnp.zeros_like, _params())
  update = jax.jit(tx.update) if jit else tx.update
  with jax.debug_nans(True):
    state = tx.init(params)
    for _ in range(2):
      updates, state = update(jax.tree.map(jnp.zeros_like, params), state, params)
  chex.assert_tree_all_finite((updates, state))


# --------------------------------------------------------------------------
# A NaN gradient shows in the update, in every registered optimizer.
# --------------------------------------------------------------------------

_LAYER_WISE = {"lars", "lamb", "lans"}


@pytest.mark.parametrize("name", lars_optax.mxnet.registered())
def test_nan_gradient_element_shows_in_the_update_of_every_registered_optimizer(name):
  """One NaN gradient element gives a non-finite update there (in that leaf for the
  layer-wise rules), never a silent zero step that freezes the weight for good."""
  rng = np.random.default_rng(0)
  params = {"w": jnp.asarray(rng.normal(size=(3, 4)), jnp.float32),
            "v": jnp.asarray(rng.normal(size=(4,)), jnp.float32)}
  grads = jax.tree.map(lambda p: 0.1 * p + 0.05, params)
  tx = lars_optax.mxnet.create(name)
  state = tx.init(params)
  _, state = tx.update(grads, state, params)  # one clean step first: state is not fresh
  bad = {"w": grads["w"].at[1, 2].set(jnp.nan), "v": grads["v"]}
  updates, state = tx.update(bad, state, params)
  if name in _LAYER_WISE:
    assert not np.all(np.isfinite(updates["w"])), name
  else:
    assert not np.isfinite(updates["w"][1, 2]), name
  if name in _STATISTICS:  # the NaN in the state stays visible, not a silent zero step
    updates, _ = tx.update(grads, state, params)
    assert not np.isfinite(updates["w"][1, 2]), name


# Rules whose state keeps gradient statistics (where the old zero-step froze the weight).
_STATISTICS = {"adam", "adamw", "nadam", "adamax", "adabelief", "ftml", "lamb", "lans",
               "adagrad", "groupadagrad", "ftrl", "rmsprop", "adadelta"}


def test_skip_nonfinite_ignores_a_nan_in_a_row_sparse_padding_slot():
  """The padding slot (row == num_rows) is not in the array; the optimizer ignores it."""
  params = {"emb": jnp.ones((4, 2))}
  tx = lars_optax.skip_nonfinite(lars_optax.mxnet.adam(0.1, lazy_update=True))
  state = tx.init(params)
  values = jnp.array([[1.0, 1.0], [jnp.nan, jnp.nan]])
  padded = lars_optax.sparse.row_sparse(values, rows=jnp.array([1, 4]),
                                        num_rows=4)  # slot 2 is padding
  updates, state = tx.update({"emb": padded}, state, params)
  assert int(state.total_notfinite) == 0 and bool(state.last_finite)
  new = optax.apply_updates(params, updates)
  assert bool(jnp.all(jnp.isfinite(new["emb"]))) and float(new["emb"][1, 0]) != 1.0
  used = lars_optax.sparse.row_sparse(values, rows=jnp.array([1, 2]),
                                      num_rows=4)  # the NaN is on row 2: skipped
  _, state = tx.update({"emb": used}, state, params)
  assert int(state.total_notfinite) == 1 and not bool(state.last_finite)


@pytest.mark.parametrize("where", ["dense_leaf", "row_sparse_leaf"])
def test_skip_nonfinite_casts_beside_a_row_sparse_leaf(where):
  """A float32 gradient of 1e5 is inf for a float16 weight, also when a row-sparse
  leaf is in the tree (the cast used to give up on the whole tree)."""
  tx = lars_optax.skip_nonfinite(lars_optax.mxnet.sgd(0.1, lazy_update=True))
  params = {"emb": jnp.ones((4, 2), jnp.float16), "w": jnp.ones(3, jnp.float16)}
  state = tx.init(params)
  big = 1e5 if where == "row_sparse_leaf" else 1.0
  grads = {"emb": lars_optax.sparse.row_sparse(jnp.array([[1.0, big]], jnp.float32),
                                               rows=jnp.array([1]), num_rows=4),
           "w": jnp.array([1.0, 1e5 if where == "dense_leaf" else 1.0, 1.0], jnp.float32)}
  for step in (tx.update, jax.jit(tx.update)):
    updates, new_state = step(grads, state, params)
    assert int(new_state.total_notfinite) == 1
    chex.assert_trees_all_equal(optax.apply_updates(params, updates), params)


# --------------------------------------------------------------------------
# Inside shard_map: every device takes the same branch
# --------------------------------------------------------------------------


def _shard_map_step(tx, check_vma, axis_name="x"):
  """One step of tx inside shard_map over 4 devices: "w" split by rows, "r" replicated."""
  import functools

  from jax.sharding import Mesh
  from jax.sharding import PartitionSpec as P

  spec = {"w": P(axis_name), "r": P()}

  @jax.jit
  @functools.partial(jax.shard_map, mesh=Mesh(np.array(jax.devices()[:4]), (axis_name,)),
                     in_specs=(spec, spec), out_specs=(spec, P()), check_vma=check_vma)
  def step(params, grads):
    updates, state = tx.update(grads, tx.init(params), params)
    return optax.apply_updates(params, updates), state.total_notfinite

  return step


SHARD_PARAMS = {"w": jnp.arange(32.0).reshape(8, 4) / 10, "r": jnp.array([1.0, -2.0, 3.0])}


@pytest.mark.skipif(jax.device_count() < 4, reason="needs 4 devices (see conftest.py)")
@pytest.mark.parametrize("check_vma", [True, False], ids=["check_vma", "no_check_vma"])
@pytest.mark.parametrize("inner", ["sgd", "lamb_axis_name"])
def test_skip_nonfinite_inside_shard_map_skips_on_every_device(inner, check_vma):
  """A NaN in one block skips the step everywhere: no block takes it, the replicated leaf's
  copies stay equal, no device waits alone in LAMB's psum; finite steps equal one device."""
  make = {"sgd": lambda **kw: optax.sgd(0.1, momentum=0.9),
          "lamb_axis_name": lambda **kw: lars_optax.lamb(0.01, wd=1e-3, **kw)}[inner]
  kw = {"axis_name": "x"} if inner == "lamb_axis_name" else {}
  step = _shard_map_step(lars_optax.skip_nonfinite(make(**kw)), check_vma)
  bad = {"w": jnp.ones((8, 4)).at[5, 1].set(NAN), "r": jnp.ones(3)}  # in the third block
  params, skipped = step(SHARD_PARAMS, bad)
  chex.assert_trees_all_equal(params, SHARD_PARAMS)
  assert int(skipped) == 1
  good = jax.tree.map(lambda x: 0.3 * x + 0.1, SHARD_PARAMS)
  params, skipped = step(SHARD_PARAMS, good)
  one = lars_optax.skip_nonfinite(make())
  want = optax.apply_updates(SHARD_PARAMS, one.update(good, one.init(SHARD_PARAMS),
                                                      SHARD_PARAMS)[0])
  chex.assert_trees_all_close(params, want, rtol=1e-5, atol=1e-7)
  assert int(skipped) == 0


@pytest.mark.skipif(jax.device_count() < 4, reason="needs 4 devices (see conftest.py)")
def test_skip_nonfinite_axis_name_is_checked_and_named():
  with pytest.raises(TypeError, match=r"^axis_name: expected None or the name of a mesh axis"):
    lars_optax.skip_nonfinite(optax.sgd(0.1), axis_name=3)
  tx = lars_optax.skip_nonfinite(optax.sgd(0.1), axis_name="model")
  with pytest.raises(ValueError, match=r"axis_name: 'model' is not bound here"):
    tx.update(SHARD_PARAMS, tx.init(SHARD_PARAMS), SHARD_PARAMS)
  step = _shard_map_step(lars_optax.skip_nonfinite(optax.sgd(0.1), axis_name="x"), True)
  params, skipped = step(SHARD_PARAMS, {"w": jnp.ones((8, 4)).at[0, 0].set(INF),
                                        "r": jnp.ones(3)})
  chex.assert_trees_all_equal(params, SHARD_PARAMS)
  assert int(skipped) == 1


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_a_skip_that_the_full_count_cannot_count_is_an_error(jit):
  """total_notfinite saturates at 2**31 - 1 (a restored or hand-set count): a skip then
  would go uncounted; it is an error naming the reset."""
  tx = lars_optax.skip_nonfinite(optax.sgd(0.1))
  params = {"w": jnp.ones(3)}
  state = tx.init(params)._replace(total_notfinite=jnp.asarray(2**31 - 1, jnp.int32))
  update = jax.jit(tx.update) if jit else tx.update
  _, kept = update({"w": jnp.ones(3)}, state, params)  # a finite step: nothing to count
  assert int(kept.total_notfinite) == 2**31 - 1
  with pytest.raises(Exception, match=r"skip_nonfinite: total_notfinite is 2147483647.*"
                     r"state._replace\(total_notfinite="):
    jax.block_until_ready(update({"w": jnp.array([1.0, NAN, 0.0])}, state, params))
