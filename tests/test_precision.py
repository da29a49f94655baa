"""Tests for lars_optax.precision: multi_precision, MultiPrecisionState, master_params.

Covered, for float16 and bfloat16 and several inner optimizers: after every
step of a jitted training loop the low-precision params equal the float32
master cast down and keep their dtype, the inner state is float32, and the
master follows the same optimizer run on float32 params; float32 and float64
leaves pass through; the ``multi_precision=True`` arguments equal the wrapper;
trust ratios are readable through it; the argument checks; and a float16 run
whose steps are below float16's resolution, which only moves with the wrapper.
"""

import functools
import json
import pathlib
import warnings

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import as_row_sparse, x64

import lars_optax
from lars_optax import MultiPrecisionState, master_params, multi_precision
from lars_optax._utils import LOW_PRECISION

LOW_DTYPES = [jnp.float16, jnp.bfloat16]

INNERS = {
    "lars": lambda: lars_optax.lars(momentum=0.9, eta=0.1),
    "adam": lambda: lars_optax.mxnet.adam(learning_rate=0.01),
    "sgd": lambda: lars_optax.mxnet.sgd(momentum=0.9),
    "signum": lambda: lars_optax.signum(),
    "optax_adam": lambda: optax.adam(1e-2),
}

# The lars_optax optimizers with a multi_precision argument.
FLAGGED = {
    "lars": lambda **kw: lars_optax.lars(momentum=0.9, eta=0.1, wd=1e-3, **kw),
    "adam": lambda **kw: lars_optax.mxnet.adam(learning_rate=0.01, wd=1e-3, **kw),
    "sgd": lambda **kw: lars_optax.mxnet.sgd(momentum=0.9, wd=1e-3, **kw),
    "signum": lambda **kw: lars_optax.signum(wd_lh=1e-3, **kw),
    "signsgd": lambda **kw: lars_optax.signsgd(**kw),
}

N_STEPS = 10


def _params(dtype, seed=0):
  rng = np.random.default_rng(seed)
  return {
      "w": jnp.asarray(rng.normal(size=(4, 3)), dtype),
      "fc_bias": jnp.asarray(rng.normal(size=(3,)), dtype),
  }


def _grads(params, n_steps=N_STEPS, seed=1):
  rng = np.random.default_rng(seed)
  return [jax.tree.map(lambda p: jnp.asarray(0.5 * rng.normal(size=p.shape), p.dtype), params)
          for _ in range(n_steps)]


def _to_f32(tree):
  return jax.tree.map(lambda x: x.astype(jnp.float32), tree)


@functools.cache
def _jit_step(name, wrapped):
  """One jitted training step (update and apply), compiled once per optimizer."""
  tx = INNERS[name]()
  if wrapped:
    tx = multi_precision(tx)

  @jax.jit
  def step(grads, state, params):
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state, updates

  return tx, step


def _float_leaves(tree):
  return [x for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.floating)]


def test_low_precision_constant():
  assert set(LOW_PRECISION) == {jnp.dtype(jnp.float16), jnp.dtype(jnp.bfloat16)}


# --------------------------------------------------------------------------
# Training loops in float16 and bfloat16
# --------------------------------------------------------------------------


@pytest.mark.op_by_op
@pytest.mark.parametrize("dtype", LOW_DTYPES, ids=["float16", "bfloat16"])
@pytest.mark.parametrize("name", sorted(INNERS))
def test_params_are_cast_master_and_master_follows_float32_run(name, dtype):
  tx, step = _jit_step(name, True)
  ref_tx, ref_step = _jit_step(name, False)
  params = _params(dtype)
  ref_params = _to_f32(params)
  state, ref_state = tx.init(params), ref_tx.init(ref_params)
  assert isinstance(state, MultiPrecisionState)
  chex.assert_trees_all_equal(master_params(state, params), ref_params)
  for grads in _grads(params):
    params, state, updates = step(grads, state, params)
    ref_params, ref_state, _ = ref_step(_to_f32(grads), ref_state, ref_params)
    master = master_params(state, params)
    # Params keep their low dtype and are exactly the master cast down.
    chex.assert_trees_all_equal_dtypes(params, _params(dtype))
    chex.assert_trees_all_equal(params, jax.tree.map(lambda m: m.astype(dtype), master))
    # The update of a low-precision leaf is float32; master and state are float32.
    assert all(u.dtype == jnp.float32 for u in jax.tree.leaves(updates))
    assert all(m.dtype == jnp.float32 for m in jax.tree.leaves(master))
    assert all(x.dtype == jnp.float32 for x in _float_leaves(state.inner_state))
    # The master trajectory is the float32 run with float32-cast gradients.
    chex.assert_trees_all_close(master, ref_params, rtol=1e-6, atol=1e-7)
    chex.assert_trees_all_close(state.inner_state, ref_state, rtol=1e-6, atol=1e-7)
  # The run did train: the params moved.
  assert not np.allclose(np.asarray(params["w"], np.float32),
                         np.asarray(_params(dtype)["w"], np.float32))


@pytest.mark.parametrize("dtype", LOW_DTYPES, ids=["float16", "bfloat16"])
def test_state_structure(dtype):
  params = _params(dtype)
  state = multi_precision(lars_optax.mxnet.adam()).init(params)
  assert isinstance(state, MultiPrecisionState)
  chex.assert_trees_all_equal(state.master, _to_f32(params))
  chex.assert_trees_all_equal_structs(state.inner_state,
                                      lars_optax.mxnet.adam().init(_to_f32(params)))
  assert all(x.dtype == jnp.float32 for x in _float_leaves(state.inner_state))


@pytest.mark.op_by_op
@pytest.mark.filterwarnings("ignore::lars_optax.LowPrecisionWarning")  # float16 Adam
@pytest.mark.parametrize("name", ["lars", "adam", "sgd"])
def test_float32_and_float64_leaves_pass_through(name):
  with x64():
    rng = np.random.default_rng(2)
    params = {
        "h": jnp.asarray(rng.normal(size=(3, 2)), jnp.float16),
        "b": jnp.asarray(rng.normal(size=(2,)), jnp.bfloat16),
        "s": jnp.asarray(rng.normal(size=(3, 2)), jnp.float32),
        "d": jnp.asarray(rng.normal(size=(4,)), jnp.float64),
    }
    grads = _grads(params, n_steps=3, seed=3)
    tx = multi_precision(INNERS[name]())
    inner = INNERS[name]()
    state = tx.init(params)
    assert isinstance(state.master["s"], optax.MaskedNode)
    assert isinstance(state.master["d"], optax.MaskedNode)
    # (a) inner on the tree with the low leaves cast to float32: every leaf agrees.
    ref_params = {**params, "h": params["h"].astype(jnp.float32),
                  "b": params["b"].astype(jnp.float32)}
    ref_state = inner.init(ref_params)
    # (b) inner on the mixed tree itself: the float32 and float64 leaves agree.
    raw_params, raw_state = params, inner.init(params)
    for g in grads:
      upd, state = tx.update(g, state, params)
      params = optax.apply_updates(params, upd)
      ref_g = {**g, "h": g["h"].astype(jnp.float32), "b": g["b"].astype(jnp.float32)}
      ref_upd, ref_state = inner.update(ref_g, ref_state, ref_params)
      ref_params = optax.apply_updates(ref_params, ref_upd)
      raw_upd, raw_state = inner.update(g, raw_state, raw_params)
      raw_params = optax.apply_updates(raw_params, raw_upd)
      for key in ("s", "d"):
        assert upd[key].dtype == params[key].dtype
        chex.assert_trees_all_equal(upd[key], ref_upd[key])
        chex.assert_trees_all_equal(upd[key], raw_upd[key])
      chex.assert_trees_all_equal(master_params(state, params), ref_params)
      chex.assert_trees_all_equal(state.inner_state, ref_state)
    chex.assert_trees_all_equal_dtypes(
        params, {"h": jnp.float16, "b": jnp.bfloat16, "s": jnp.float32, "d": jnp.float64})
    chex.assert_trees_all_equal(
        {k: params[k] for k in ("s", "d")}, {k: raw_params[k] for k in ("s", "d")})
    # master_params returns the float32/float64 params themselves.
    master = master_params(state, params)
    assert master["s"] is params["s"] and master["d"] is params["d"]
    chex.assert_trees_all_equal_dtypes(
        master, {"h": jnp.float32, "b": jnp.float32, "s": jnp.float32, "d": jnp.float64})


def test_all_float32_tree_is_inner():
  params = _params(jnp.float32)
  tx, inner = multi_precision(lars_optax.mxnet.adam(0.01)), lars_optax.mxnet.adam(0.01)
  state, inner_state = tx.init(params), inner.init(params)
  for g in _grads(params, n_steps=2):
    upd, state = tx.update(g, state, params)
    inner_upd, inner_state = inner.update(g, inner_state, params)
    chex.assert_trees_all_equal(upd, inner_upd)
    chex.assert_trees_all_equal(state.inner_state, inner_state)
    params = optax.apply_updates(params, upd)
  chex.assert_trees_all_equal(master_params(state, params), params)


# --------------------------------------------------------------------------
# The multi_precision=True arguments and the trust-ratio read-out
# --------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", LOW_DTYPES, ids=["float16", "bfloat16"])
@pytest.mark.parametrize("name", sorted(FLAGGED))
def test_flag_equals_wrapper(name, dtype):
  flagged, wrapped = FLAGGED[name](multi_precision=True), multi_precision(FLAGGED[name]())
  params_a = params_b = _params(dtype)
  state_a, state_b = flagged.init(params_a), wrapped.init(params_b)
  chex.assert_trees_all_equal(state_a, state_b)
  for g in _grads(params_a, n_steps=3):
    upd_a, state_a = flagged.update(g, state_a, params_a)
    upd_b, state_b = wrapped.update(g, state_b, params_b)
    chex.assert_trees_all_equal(upd_a, upd_b)
    chex.assert_trees_all_equal(state_a, state_b)
    params_a = optax.apply_updates(params_a, upd_a)
    params_b = optax.apply_updates(params_b, upd_b)
  chex.assert_trees_all_equal(params_a, params_b)
  assert isinstance(state_a, MultiPrecisionState)


def test_trust_ratios_through_wrapper():
  params = {"w": jnp.full((2, 2), 1.5, jnp.float16), "fc_bias": jnp.ones((2,), jnp.float16)}
  grads = {"w": jnp.full((2, 2), 0.25, jnp.float16), "fc_bias": jnp.ones((2,), jnp.float16)}
  opt = lars_optax.lars(0.1, momentum=0.9, eta=0.1, multi_precision=True)
  state = opt.init(params)
  upd, state = jax.jit(opt.update)(grads, state, params)
  params = optax.apply_updates(params, upd)
  # ratio = eta * |w| / |g| from the float32 master (which was 1.5 everywhere).
  named = lars_optax.trust_ratios(state, params)
  np.testing.assert_allclose(float(named["w"]), 0.1 * 3.0 / 0.5, rtol=1e-6)
  assert float(named["fc_bias"]) == 1.0  # skipped, as in MXNet
  np.testing.assert_allclose(lars_optax.trust_ratios(state), [1.0, 0.6], rtol=1e-6)
  # The same ratios as the unwrapped optimizer on float32 params.
  ref = lars_optax.lars(0.1, momentum=0.9, eta=0.1)
  p32 = {"w": jnp.full((2, 2), 1.5), "fc_bias": jnp.ones((2,))}
  _, ref_state = ref.update(_to_f32(grads), ref.init(p32), p32)
  chex.assert_trees_all_close(lars_optax.trust_ratios(state), lars_optax.trust_ratios(ref_state),
                              rtol=1e-6)


def test_master_params_under_jit_and_in_a_chain():
  params = _params(jnp.float16)
  tx = optax.chain(optax.clip(1.0), multi_precision(lars_optax.mxnet.sgd(0.1)))
  state = tx.init(params)
  upd, state = tx.update(_grads(params, n_steps=1)[0], state, params)
  params = optax.apply_updates(params, upd)
  master = jax.jit(master_params)(state, params)
  chex.assert_trees_all_equal(params, jax.tree.map(lambda m: m.astype(jnp.float16), master))
  chex.assert_trees_all_equal(master, state[1].master)


# --------------------------------------------------------------------------
# Argument checks
# --------------------------------------------------------------------------


@pytest.mark.parametrize("state", [
    lars_optax.mxnet.sgd(momentum=0.9).init({"w": jnp.ones(2)}),
    optax.EmptyState(),
    (),
], ids=["sgd_state", "empty_state", "tuple"])
def test_master_params_without_state_raises(state):
  with pytest.raises(ValueError, match="MultiPrecisionState"):
    master_params(state, {"w": jnp.ones(2)})


@pytest.mark.parametrize("dtype", [jnp.int32, jnp.bool_])
def test_non_float_params_raise(dtype):
  tx = multi_precision(lars_optax.mxnet.sgd())
  params = {"w": jnp.ones((2,), jnp.float16), "step_counter": jnp.zeros((2,), dtype)}
  with pytest.raises(TypeError, match="step_counter"):
    tx.init(params)


def test_mismatched_grads_raise():
  tx = multi_precision(lars_optax.mxnet.sgd(momentum=0.9))
  params = {"w": jnp.ones((2, 2), jnp.float16), "b": jnp.ones((2,), jnp.float16)}
  state = tx.init(params)
  with pytest.raises(ValueError, match="'b'"):  # a leaf missing from the gradients
    tx.update({"w": jnp.ones((2, 2), jnp.float16)}, state, params)
  with pytest.raises(ValueError, match="'w'"):  # a gradient of the wrong shape
    tx.update({"w": jnp.ones((2, 3), jnp.float16), "b": jnp.ones((2,), jnp.float16)},
              state, params)
  with pytest.raises(ValueError, match="params"):  # no params
    tx.update({"w": jnp.ones((2, 2), jnp.float16), "b": jnp.ones((2,), jnp.float16)}, state)


@pytest.mark.parametrize("inner", [None, "sgd", lars_optax.mxnet.sgd, lambda g, s, p: (g, s)])
def test_non_transformation_inner_raises(inner):
  with pytest.raises(TypeError, match="inner"):
    multi_precision(inner)


@pytest.mark.parametrize("fn", [lars_optax.lars, lars_optax.mxnet.adam, lars_optax.mxnet.sgd,
                                lars_optax.signum, lars_optax.signsgd])
def test_flag_must_be_bool(fn):
  with pytest.raises(TypeError, match="multi_precision"):
    fn(multi_precision="yes")


# --------------------------------------------------------------------------
# Why the wrapper exists: steps below float16's resolution
# --------------------------------------------------------------------------


def test_tiny_float16_steps_only_accumulate_with_master():
  """sgd with lr 1e-4 and gradients 0.1: each step is 1e-5, below float16's
  half-spacing near 1.0 (2**-12 ~ 2.4e-4), so float16 weights never move on
  their own; the float32 master accumulates the steps and, once it has moved
  by more than half a float16 spacing, so does the float16 weight."""
  params = {"w": jnp.ones((4,), jnp.float16)}
  grads = {"w": jnp.full((4,), 0.1, jnp.float16)}
  n_steps = 60

  def train(tx):
    @jax.jit
    def run(params):
      def body(carry, _):
        p, s = carry
        upd, s = tx.update(grads, s, p)
        return (optax.apply_updates(p, upd), s), p["w"][0]
      (p, s), history = jax.lax.scan(body, (params, tx.init(params)), None, length=n_steps)
      return p, s, history
    return run(params)

  plain_params, _, plain_history = train(lars_optax.mxnet.sgd(1e-4))
  np.testing.assert_array_equal(plain_history, 1.0)
  np.testing.assert_array_equal(plain_params["w"], 1.0)  # stuck

  mp_params, mp_state, mp_history = train(lars_optax.mxnet.sgd(1e-4, multi_precision=True))
  master = master_params(mp_state, mp_params)["w"]
  np.testing.assert_allclose(master, 1.0 - n_steps * 1e-5, rtol=1e-5)
  assert mp_params["w"].dtype == jnp.float16
  chex.assert_trees_all_equal(mp_params["w"], master.astype(jnp.float16))
  assert np.all(np.asarray(mp_params["w"], np.float32) < 1.0)  # it moved
  # It moved when the master crossed 1 - 2**-12: each step is 1e-4 * f16(0.1)
  # = 9.998e-6, so after 25 steps (history[i] is the weight after i steps).
  first_move = int(np.argmax(np.asarray(mp_history, np.float32) < 1.0))
  assert first_move == 25


# --------------------------------------------------------------------------
# float16 without master weights: every rule that keeps squares warns at init
# --------------------------------------------------------------------------

# Rules whose state keeps squared gradients in the params' dtype. In float16 the
# second moment of the Adam family and of LAMB/LANS underflows; the sums and
# averages of RMSProp, AdaGrad, GroupAdaGrad, AdaDelta and FTRL overflow once
# |g| > 256, and the weight freezes.
_KEEPS_SQUARES = {"adabelief", "adadelta", "adagrad", "adam", "adamw", "ftml", "ftrl",
                  "groupadagrad", "lamb", "lans", "nadam", "rmsprop"}
# No squared gradient in the state: momentum, signs, max |g| (Adamax), the
# previous weight (DCASGD), noise (SGLD), the LARS trust ratio.
_NO_SQUARES = {"adamax", "dcasgd", "lars", "nag", "sgd", "sgld", "signsgd", "signum"}
_OVERFLOWS = ["adadelta", "adagrad", "ftrl", "groupadagrad", "rmsprop"]


def _low_precision_warnings(tx, params):
  with warnings.catch_warnings(record=True) as record:
    warnings.simplefilter("always")
    tx.init(params)
  return [str(r.message) for r in record
          if issubclass(r.category, lars_optax.LowPrecisionWarning)]


@pytest.mark.parametrize("name", lars_optax.mxnet.registered())
def test_float16_without_master_weights_warns_for_every_rule_that_keeps_squares(name):
  assert name in _KEEPS_SQUARES | _NO_SQUARES, (
      f"{name!r} is new: add it to _KEEPS_SQUARES or _NO_SQUARES (does its state keep "
      "squared gradients in the params' dtype?)")
  params = {"w": jnp.ones((2, 3), jnp.float16), "b": jnp.ones(3, jnp.float16)}
  found = _low_precision_warnings(lars_optax.mxnet.create(name), params)
  if name in _KEEPS_SQUARES:
    assert len(found) == 1, (name, found)
    expected = "parameter 'b' (and 1 more) is float16 and there are no float32 master weights"
    assert expected in found[0], found[0]
    assert "multi_precision=True" in found[0]
  else:
    assert found == [], (name, found)
  # Where the squares are safe: float32 master weights, or bfloat16's range.
  assert _low_precision_warnings(lars_optax.mxnet.create(name, multi_precision=True), params) == []
  bf16 = jax.tree.map(lambda p: p.astype(jnp.bfloat16), params)
  assert _low_precision_warnings(lars_optax.mxnet.create(name), bf16) == []


@pytest.mark.parametrize("make, warns", [
    (lambda: lars_optax.sparse.adam(1e-2), True),
    (lambda: lars_optax.sparse.adamw(1e-2), True),
    (lambda: lars_optax.sparse.sgd(0.1, momentum=0.9), False),
], ids=["sparse.adam", "sparse.adamw", "sparse.sgd"])
def test_float16_without_master_weights_warns_for_the_dense_exact_adams(make, warns):
  params = {"w": jnp.ones((2, 3), jnp.float16), "b": jnp.ones(3, jnp.float16)}
  found = _low_precision_warnings(make(), params)
  assert len(found) == int(warns), found
  if warns:
    assert "parameter 'b' (and 1 more) is float16" in found[0], found[0]
  assert _low_precision_warnings(lars_optax.multi_precision(make()), params) == []


@pytest.mark.filterwarnings("ignore::lars_optax.LowPrecisionWarning")
@pytest.mark.parametrize("name", _OVERFLOWS)
def test_float16_squares_overflow_and_freeze_the_weight_without_master_weights(name):
  """Why those rules warn: a gradient of 300 squares to inf in float16 (its
  largest value is 65504). Without master weights the weight then never moves
  again (FTRL's turns NaN); with them it trains on."""
  params = {"w": jnp.ones(3, jnp.float16)}
  grads = [jnp.full(3, g, jnp.float16) for g in (300.0, 1.0, 1.0, 1.0)]

  def run(tx):
    p, s = params, tx.init(params)
    history = []
    for g in grads:
      u, s = tx.update({"w": g}, s, p)
      p = optax.apply_updates(p, u)
      history.append(np.asarray(p["w"], np.float32))
    return history

  plain = run(lars_optax.mxnet.create(name))
  after_overflow = plain[1:]
  assert all(np.array_equal(h, plain[0]) for h in after_overflow) or not np.all(
      np.isfinite(plain[-1])), (name, plain)
  master = run(lars_optax.mxnet.create(name, multi_precision=True))
  assert np.all(np.isfinite(master[-1])), (name, master)
  assert not np.array_equal(master[-1], master[0]), (name, master)


# --------------------------------------------------------------------------
# lazy_update with multi_precision (MXNet's SGD asserts they exclude each other)
# --------------------------------------------------------------------------

@pytest.mark.parametrize("make", [
    lambda: lars_optax.mxnet.sgd(0.1, momentum=0.9, lazy_update=True, multi_precision=True),
    lambda: lars_optax.mxnet.create("sgd", momentum=0.9, lazy_update=True, multi_precision=True),
], ids=["sgd", "create_sgd"])
def test_sgd_lazy_update_with_multi_precision_raises_at_construction(make):
  with pytest.raises(ValueError, match=r"^lazy_update: sgd takes lazy_update=True or "
                                       r"multi_precision=True, not both, as MXNet's SGD "
                                       r"asserts\."):
    make()


MXNET_OPTIMIZERS = json.loads(
    (pathlib.Path(__file__).parent / "reference" / "mxnet_optimizers.json").read_text())


def test_adam_lazy_update_with_multi_precision_takes_row_sparse_gradients_as_mxnet():
  """MXNet 2.0's Adam takes lazy_update and multi_precision together (its SGD and
  LARS assert against it): float16 row_sparse gradients update the float32
  master's present rows. Fed as BCOOs, we match its weights, masters and moments."""
  (case,) = [c for c in MXNET_OPTIMIZERS["cases"] if c["name"] == "adam_lazy_mp_f16"]
  tx = lars_optax.mxnet.create("adam", **case["kwargs"])
  params = {k: jnp.asarray(np.asarray(v), jnp.float16) for k, v in case["params"].items()}
  state = tx.init(params)

  @jax.jit
  def step(params, state, grads):
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  for t, grads in enumerate(case["grads"]):
    sparse = {k: as_row_sparse(g, np.float16) for k, g in grads.items()}
    params, state = step(params, state, sparse)
    masters = master_params(state, params)
    mu, nu = optax.tree_utils.tree_get(state, "mu"), optax.tree_utils.tree_get(state, "nu")
    for k, w in case["weights"][t].items():
      assert params[k].dtype == jnp.float16
      # float16: one ulp where MXNet's float32 master rounds the other way.
      np.testing.assert_allclose(np.asarray(params[k], np.float32), w, rtol=1e-3, atol=1e-3)
      ref = case["states"][t][k]
      for ours, theirs in ((masters[k], ref["master"]), (mu[k], ref["mean"]),
                           (nu[k], ref["var"])):
        theirs = np.asarray(theirs)
        scale = max(np.abs(theirs).max(), 1e-30)
        assert np.abs(np.asarray(ours) - theirs).max() / scale < 3e-5, (t, k)


@pytest.mark.op_by_op
def test_multi_precision_row_sparse_update_equals_the_dense_one():
  """Repeated rows, padding and a dense leaf beside: the update is row-sparse, and
  equals the same step on the dense gradient (weights, masters and state)."""
  tx = lars_optax.mxnet.adam(0.05, wd=1e-2, lazy_update=True, multi_precision=True)
  rng = np.random.default_rng(0)
  params = {"emb": jnp.asarray(rng.normal(size=(10, 3)), jnp.float16),
            "w": jnp.asarray(rng.normal(size=(3,)), jnp.bfloat16)}
  # Eighths, so that float16 sums the repeated row 2 exactly in todense() too.
  rows = lars_optax.sparse.row_sparse(jnp.asarray(rng.integers(-8, 9, size=(5, 3)) / 8,
                                                  jnp.float16),
                               rows=jnp.array([2, 7, 2, 10, 0]), num_rows=10)  # 10 = padding
  grads = {"emb": rows, "w": jnp.ones((3,), jnp.bfloat16)}
  dense = {"emb": rows.todense(), "w": grads["w"]}
  state = tx.init(params)
  for _ in range(3):
    updates, s_sparse = jax.jit(tx.update)(grads, state, params)
    assert isinstance(updates["emb"], lars_optax.sparse.RowSparseUpdate)
    d_updates, s_dense = tx.update(dense, state, params)
    new = optax.apply_updates(params, updates)
    chex.assert_trees_all_equal(new, optax.apply_updates(params, d_updates))
    chex.assert_trees_all_close(s_sparse, s_dense, rtol=1e-5)  # float32 rounding order
    changed = np.nonzero(np.any(np.asarray(new["emb"] != params["emb"]), axis=1))[0]
    assert set(changed) <= {0, 2, 7}
    params, state = new, s_sparse


def test_multi_precision_row_sparse_under_skip_nonfinite():
  """(optax.apply_if_finite fails on any multi_precision update: its zero tree has
  the gradients' float16 dtype, the update is float32; skip_nonfinite is the guard.)"""
  tx = lars_optax.skip_nonfinite(lars_optax.mxnet.adam(0.1, lazy_update=True, multi_precision=True))
  params = {"emb": jnp.ones((4, 2), jnp.float16)}
  state = tx.init(params)
  good = {"emb": lars_optax.sparse.row_sparse(jnp.ones((1, 2), jnp.float16), rows=jnp.array([1]),
                                              num_rows=4)}
  bad = {"emb": lars_optax.sparse.row_sparse(jnp.full((1, 2), jnp.nan, jnp.float16),
                                      rows=jnp.array([1]), num_rows=4)}
  updates, state = jax.jit(tx.update)(bad, state, params)
  chex.assert_trees_all_equal(optax.apply_updates(params, updates), params)
  updates, state = jax.jit(tx.update)(good, state, params)
  np.testing.assert_allclose(np.asarray(optax.apply_updates(params, updates)["emb"], np.float32),
                             [[1, 1], [0.9, 0.9], [1, 1], [1, 1]], rtol=1e-3)


def test_multi_precision_around_an_optimizer_that_cannot_take_a_bcoo_names_the_leaf():
  tx = multi_precision(optax.adam(1e-3))
  params = {"emb": jnp.ones((6, 3), jnp.float16)}
  grads = {"emb": lars_optax.sparse.row_sparse(jnp.ones((2, 3), jnp.float16),
                                               rows=jnp.array([1, 4]), num_rows=6)}
  with pytest.raises(ValueError, match=r"^multi_precision: gradient 'emb' is row-sparse \(a "
                                       r"BCOO\), and the wrapped optimizer failed on it"):
    tx.update(grads, tx.init(params), params)
