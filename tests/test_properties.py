"""Properties that hold for all inputs, checked with hypothesis.

* LARS (MXNet's and TF's, with weight decay = epsilon = 0 and no momentum): a
  layer's update does not change when its gradient is multiplied by any
  c > 0, and is multiplied by c when its weights and gradient both are;
* a skipped (masked) leaf gets trust ratio 1 and the plain SGD update;
* Signum/signSGD never move a weight by more than lr plus the decay;
* from a fresh state a zero gradient changes nothing but weight decay;
* ``init`` and ``update`` are pure: the same inputs give the same outputs,
  eagerly and under ``jit``, and the two agree;
* hyperparameters given as numpy, jax or bfloat16 scalars give the update the
  same numbers give as Python floats, on float32, bfloat16 and float16 params,
  with updates and state in the params' dtypes.

Deterministic (``derandomize``, no example database) and small, so CI runs the
same examples every time.
"""

import functools

import chex
import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import lars_optax

SETTINGS = settings(max_examples=40, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow])

SHAPES = {"fc_weight": (2, 3), "fc_bias": (3,), "conv_weight": (2, 1, 2)}


def _array(shape, bound=100.0):
  finite = st.floats(-bound, bound, width=32, allow_subnormal=False)
  return hnp.arrays(np.float32, shape, elements=finite)


def _tree(bound=100.0):
  return st.fixed_dictionaries({k: _array(s, bound) for k, s in SHAPES.items()})


def _norm(x):
  return float(np.linalg.norm(np.asarray(x, np.float64)))


def _jnp(tree):
  return jax.tree.map(jnp.asarray, tree)


def _close(a, b, rtol=1e-5):
  """Element-wise relative closeness, with an absolute floor at the leaf's scale."""
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    scale = max(np.max(np.abs(x), initial=0.0), np.max(np.abs(y), initial=0.0))
    np.testing.assert_allclose(x, y, rtol=rtol, atol=rtol * scale * 1e-2)


# --------------------------------------------------------------------------
# LARS scale invariance
# --------------------------------------------------------------------------

PLAIN_LARS = {
    "lars": lambda lr, eta: lars_optax.lars(lr, momentum=0.0, eta=eta, epsilon=0.0, wd=0.0,
                                            skip=None),
    "tf_lars": lambda lr, eta: lars_optax.tf_lars(lr, momentum=0.0, weight_decay=0.0,
                                                  eeta=eta, epsilon=0.0),
}


def _update(tx, grads, params):
  return tx.update(_jnp(grads), tx.init(_jnp(params)), _jnp(params))[0]


@pytest.mark.op_by_op
@SETTINGS
@given(name=st.sampled_from(sorted(PLAIN_LARS)), params=_tree(), grads=_tree(),
       c=st.floats(1e-2, 1e2), layer=st.sampled_from(sorted(SHAPES)),
       lr=st.floats(1e-3, 1.0), eta=st.floats(1e-3, 1.0))
def test_lars_update_ignores_the_gradient_scale(name, params, grads, c, layer, lr, eta):
  assume(all(_norm(params[k]) > 1e-2 and _norm(grads[k]) > 1e-2 for k in SHAPES))
  tx = PLAIN_LARS[name](lr, eta)
  base = _update(tx, grads, params)
  scaled = _update(tx, {**grads, layer: np.float32(c) * grads[layer]}, params)
  _close(scaled[layer], base[layer])
  for k in SHAPES:  # the other layers are untouched
    if k != layer:
      chex.assert_trees_all_equal(scaled[k], base[k])


@SETTINGS
@given(name=st.sampled_from(sorted(PLAIN_LARS)), params=_tree(), grads=_tree(),
       c=st.floats(1e-2, 1e2), layer=st.sampled_from(sorted(SHAPES)),
       lr=st.floats(1e-3, 1.0), eta=st.floats(1e-3, 1.0))
def test_lars_update_scales_with_weights_and_gradient(name, params, grads, c, layer, lr, eta):
  assume(all(_norm(params[k]) > 1e-2 and _norm(grads[k]) > 1e-2 for k in SHAPES))
  tx = PLAIN_LARS[name](lr, eta)
  base = _update(tx, grads, params)
  c32 = np.float32(c)
  scaled = _update(tx, {**grads, layer: c32 * grads[layer]},
                   {**params, layer: c32 * params[layer]})
  _close(scaled[layer], c32 * np.asarray(base[layer]))


# --------------------------------------------------------------------------
# Masked leaves
# --------------------------------------------------------------------------


# (A drawn mask may exempt exactly the weights, which init reports as a likely inverted
# optax mask: a warning, not a failure, here.)
@pytest.mark.filterwarnings("ignore:skip. exempts every weight:UserWarning")
@SETTINGS
@given(params=_tree(), grads=_tree(), lr=st.floats(1e-3, 1.0), eta=st.floats(1e-4, 1.0),
       skip=st.fixed_dictionaries({k: st.booleans() for k in SHAPES}),
       momentum=st.sampled_from([0.0, 0.9]))
def test_masked_leaves_get_ratio_one(params, grads, lr, eta, skip, momentum):
  tx = lars_optax.lars(lr, momentum=momentum, eta=eta, skip=skip)
  updates, state = tx.update(_jnp(grads), tx.init(_jnp(params)), _jnp(params))
  ratios = lars_optax.trust_ratios(state, params)
  for k, skipped in skip.items():
    if skipped:
      assert float(ratios[k]) == 1.0
      # The plain (MXNet) SGD step: -lr * g.
      chex.assert_trees_all_equal(updates[k], -(jnp.float32(lr) * grads[k]))
    else:
      assert np.isfinite(float(ratios[k]))


# --------------------------------------------------------------------------
# Sign updates
# --------------------------------------------------------------------------


@SETTINGS
@given(params=_tree(), grads=st.lists(_tree(1e6), min_size=1, max_size=3),
       lr=st.floats(1e-4, 1.0), momentum=st.sampled_from([0.0, 0.5, 0.9, 0.999]),
       wd=st.floats(0.0, 0.1), wd_lh=st.floats(0.0, 0.1),
       clip=st.sampled_from([None, 0.5]), rescale=st.floats(1e-3, 10.0))
def test_sign_update_moves_a_weight_by_at_most_lr_plus_decay(params, grads, lr, momentum, wd,
                                                              wd_lh, clip, rescale):
  tx = lars_optax.signum(lr, momentum=momentum, wd_lh=wd_lh, wd=wd, rescale_grad=rescale,
                         clip_gradient=clip)
  # signum's wd enters the momentum before the sign (it cannot move a weight by
  # more than lr); with momentum 0 (signSGD) both decays are decoupled.
  decay = wd + wd_lh if momentum == 0 else wd_lh
  p = _jnp(params)
  state = tx.init(p)
  for g in grads:
    updates, state = tx.update(_jnp(g), state, p)
    for k in SHAPES:
      bound = lr * (1 + decay * np.abs(np.asarray(p[k], np.float64)))
      assert np.all(np.abs(np.asarray(updates[k], np.float64)) <= bound * (1 + 1e-6) + 1e-12)
    p = optax.apply_updates(p, updates)


# --------------------------------------------------------------------------
# Zero gradients
# --------------------------------------------------------------------------

# (optimizer, its decay on a zero gradient from a fresh state: update = -lr * decay * w)
ZERO_GRAD = {
    "lars": (lambda lr, wd, wd_lh: lars_optax.lars(lr, momentum=0.9, wd=wd), "wd"),
    "tf_lars": (lambda lr, wd, wd_lh: lars_optax.tf_lars(lr, weight_decay=wd), None),
    "signum": (lambda lr, wd, wd_lh: lars_optax.signum(lr, momentum=0.9, wd_lh=wd_lh), "wd_lh"),
    "signsgd": (lambda lr, wd, wd_lh: lars_optax.signsgd(lr, wd_lh=wd_lh, wd=wd), "both"),
    "adam": (lambda lr, wd, wd_lh: lars_optax.mxnet.adam(lr), None),
    "sgd": (lambda lr, wd, wd_lh: lars_optax.mxnet.sgd(lr, momentum=0.9, wd=wd), "wd"),
    "sgd_lazy_mp": (lambda lr, wd, wd_lh: lars_optax.multi_precision(lars_optax.mxnet.sgd(
        lr, momentum=0.9, wd=wd, lazy_update=True)), None),
}


@pytest.mark.op_by_op
@SETTINGS
@given(name=st.sampled_from(sorted(ZERO_GRAD)), params=_tree(), lr=st.floats(1e-3, 1.0),
       wd=st.sampled_from([0.0, 1e-4, 0.1]), wd_lh=st.sampled_from([0.0, 1e-3]))
def test_zero_gradient_changes_nothing_but_weight_decay(name, params, lr, wd, wd_lh):
  make, decay = ZERO_GRAD[name]
  tx = make(lr, wd, wd_lh)
  p = _jnp(params)
  zeros = jax.tree.map(jnp.zeros_like, p)
  updates, _ = tx.update(zeros, tx.init(p), p)
  rate = {"wd": wd, "wd_lh": wd_lh, "both": wd + wd_lh, None: 0.0}[decay]
  if name == "sgd_lazy_mp":
    rate = 0.0  # a zero gradient row is absent: lazy updates skip it, decay included
  for k in SHAPES:
    expected = -lr * rate * np.asarray(params[k], np.float64)
    np.testing.assert_allclose(np.asarray(updates[k], np.float64), expected, rtol=1e-5,
                               atol=1e-30)
    if rate == 0:
      assert not np.any(np.asarray(updates[k]))


# --------------------------------------------------------------------------
# Purity
# --------------------------------------------------------------------------

PURE = {
    "lars": lambda: lars_optax.lars(0.1, momentum=0.9, wd=1e-3, eta=0.01, rescale_grad=0.5,
                                    clip_gradient=10.0),
    "tf_lars": lambda: lars_optax.tf_lars(0.1, use_nesterov=True, skip_list=["bias"]),
    "signum": lambda: lars_optax.signum(0.01, wd=1e-3, wd_lh=1e-3),
    "signsgd": lambda: lars_optax.signsgd(0.01, wd=1e-3),
    "adam": lambda: lars_optax.mxnet.adam(optax.cosine_decay_schedule(0.01, 10), wd=1e-3),
    "sgd_lazy_mp": lambda: lars_optax.multi_precision(lars_optax.mxnet.sgd(0.1, momentum=0.9,
                                                                     lazy_update=True)),
    "skip_nonfinite_lars": lambda: lars_optax.skip_nonfinite(lars_optax.lars(0.1, momentum=0.9)),
}


@functools.cache
def _pure(name):
  tx = PURE[name]()
  return tx, jax.jit(tx.init), jax.jit(tx.update)


@settings(SETTINGS, max_examples=20)
@given(name=st.sampled_from(sorted(PURE)), params=_tree(),
       grads=st.lists(_tree(), min_size=2, max_size=2))
def test_init_and_update_are_pure(name, params, grads):
  tx, init, update = _pure(name)
  p = _jnp(params)
  chex.assert_trees_all_equal(tx.init(p), tx.init(p))
  chex.assert_trees_all_equal(init(p), tx.init(p))
  s_eager = s_jit = tx.init(p)
  for g in map(_jnp, grads):
    out1 = tx.update(g, s_eager, p)
    out2 = tx.update(g, s_eager, p)
    chex.assert_trees_all_equal(out1, out2)
    jit1 = update(g, s_jit, p)
    jit2 = update(g, s_jit, p)
    chex.assert_trees_all_equal(jit1, jit2)
    # Adam's sqrt and division fuse differently under jit: a few float32 roundings
    # (1.7e-5 relative seen on a 1e-6 step), within Adam's tolerance against MXNet.
    _close(jit1, out1, rtol=1e-4 if name == "adam" else 1e-5)
    s_eager, s_jit = out1[1], jit1[1]
  chex.assert_trees_all_equal(p, _jnp(params))  # inputs are not modified


# --------------------------------------------------------------------------
# Typed hyperparameters and low-precision params
# --------------------------------------------------------------------------

SCALAR_TYPES = {"python": float, "np_float32": np.float32, "np_float64": np.float64,
                "jnp_float32": jnp.float32, "jnp_bfloat16": jnp.bfloat16}

TYPED = {
    "lars": lambda lr, mu, wd: lars_optax.lars(lr, momentum=mu, wd=wd, eta=0.01, skip=None),
    "tf_lars": lambda lr, mu, wd: lars_optax.tf_lars(lr, momentum=mu, weight_decay=wd),
    "signum": lambda lr, mu, wd: lars_optax.signum(lr, momentum=mu, wd=wd, wd_lh=wd),
    "adam": lambda lr, mu, wd: lars_optax.mxnet.adam(lr, beta1=mu, wd=wd),
    "sgd": lambda lr, mu, wd: lars_optax.mxnet.sgd(lr, momentum=mu, wd=wd),
}


@pytest.mark.op_by_op
@pytest.mark.filterwarnings("ignore::lars_optax.LowPrecisionWarning")  # float16 Adam
@settings(SETTINGS, max_examples=25)
@given(name=st.sampled_from(sorted(TYPED)), kind=st.sampled_from(sorted(SCALAR_TYPES)),
       dtype=st.sampled_from(["float32", "bfloat16", "float16"]), params=_tree(10.0),
       grads=_tree(10.0), lr=st.floats(1e-3, 1.0), momentum=st.sampled_from([0.0, 0.5, 0.9]),
       wd=st.sampled_from([0.0, 1e-3]))
def test_typed_hyperparameters_give_the_python_float_update_in_the_param_dtype(
    name, kind, dtype, params, grads, lr, momentum, wd):
  to = SCALAR_TYPES[kind]
  p = jax.tree.map(lambda x: jnp.asarray(x, dtype), params)
  g = jax.tree.map(lambda x: jnp.asarray(x, dtype), grads)
  typed = TYPED[name](to(lr), to(momentum), to(wd))
  plain = TYPED[name](*(float(np.asarray(to(x), np.float64)) for x in (lr, momentum, wd)))
  state_t, state_p = typed.init(p), plain.init(p)
  for _ in range(2):
    u_t, state_t = typed.update(g, state_t, p)
    u_p, state_p = plain.update(g, state_p, p)
    assert {x.dtype for x in jax.tree.leaves(u_t)} == {jnp.dtype(dtype)}
    # (Buffers in the param dtype; trust ratios in float32. A JAX zero keeps a
    # buffer a Python zero leaves out, so the structures may differ.)
    allowed = {jnp.dtype(dtype)} | ({jnp.dtype(jnp.float32)} if "lars" in name else set())
    assert {x.dtype for x in jax.tree.leaves(state_t)
            if jnp.issubdtype(x.dtype, jnp.floating)} <= allowed
    tol = 1e-6 if dtype == "float32" else 2e-2
    for a, b in zip(jax.tree.leaves(u_t), jax.tree.leaves(u_p)):
      a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
      np.testing.assert_allclose(a, b, rtol=tol, atol=tol * float(np.max(np.abs(b), initial=0)))
