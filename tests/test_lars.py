"""Construction and behaviour tests for lars_optax.lars and lars_optax.tf_lars.

The number-for-number comparisons with MXNet and TensorFlow live in the
reference tests; here: argument checking, tree and dtype handling, schedules,
skipping and the trust-ratio read-out.
"""

import functools
import inspect
import math
import warnings

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import optimizers
from conftest import public, x64

import lars_optax
from lars_optax import MXNetMomentumState, ScaleByLarsTrustRatioState, masks


def _params(dtype=jnp.float32):
  return {"w": jnp.array([3.0, 4.0], dtype), "fc_bias": jnp.array([1.0, -1.0], dtype)}


def _grads(dtype=jnp.float32):
  return {"w": jnp.array([0.6, 0.8], dtype), "fc_bias": jnp.array([0.5, 0.5], dtype)}


def _np_ratio(w, g, eta, wd=0.0, eps=0.0):
  wn, gn = np.linalg.norm(np.asarray(w, np.float64)), np.linalg.norm(np.asarray(g, np.float64))
  if wn > 0 and gn > 0:
    return eta * wn / (gn + wd * wn + eps)
  return 1.0


# The two LARS rules this module checks against the formula (the table's rows carry a wd).
OPTIMIZERS = {
    "lars": lambda **kw: lars_optax.lars(0.1, momentum=0.9, **kw),
    "tf_lars": lambda **kw: lars_optax.tf_lars(0.1, momentum=0.9, **kw),
}


# --------------------------------------------------------------------------
# Hyperparameter checks at construction
# --------------------------------------------------------------------------


@pytest.mark.parametrize("arg, value", [
    ("momentum", -0.1),
    ("momentum", 1.0),
    ("momentum", 1.5),
    ("eta", -1e-3),
    ("epsilon", -1e-8),
    ("wd", -1e-4),
    ("clip_gradient", 0.0),
    ("clip_gradient", -1.0),
    ("rescale_grad", 0.0),
    ("rescale_grad", -0.5),
    ("learning_rate", -0.1),
])
def test_lars_out_of_range(arg, value):
  with pytest.raises(ValueError, match=arg):
    lars_optax.lars(**{arg: value})


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, np.float32("nan")])
@pytest.mark.parametrize("arg", ["learning_rate", "momentum", "eta", "epsilon", "wd",
                                 "rescale_grad", "clip_gradient"])
def test_lars_non_finite(arg, value):
  with pytest.raises(ValueError, match=f"{arg}: must be finite"):
    lars_optax.lars(**{arg: value})


@pytest.mark.parametrize("value", [True, False, "0.1", np.bool_(True), [0.1], np.ones(2), 1j])
@pytest.mark.parametrize("arg", ["learning_rate", "momentum", "eta", "epsilon", "wd",
                                 "rescale_grad", "clip_gradient"])
def test_lars_wrong_type(arg, value):
  with pytest.raises(TypeError, match=arg):
    lars_optax.lars(**{arg: value})


@pytest.mark.parametrize("kwargs", [
    {},
    {"learning_rate": 0.0},
    {"learning_rate": 1, "momentum": 0, "eta": 0, "epsilon": 0, "wd": 0},
    {"momentum": np.float32(0.9), "wd": jnp.float32(1e-4), "clip_gradient": 5},
    {"rescale_grad": 1 / 256, "clip_gradient": None},
    {"learning_rate": jnp.array(0.1)},
])
def test_lars_valid_arguments(kwargs):
  assert isinstance(lars_optax.lars(**kwargs), optax.GradientTransformationExtraArgs)


@pytest.mark.parametrize("arg, value", [
    ("momentum", -0.1),
    ("weight_decay", -1e-4),
    ("eeta", -1e-3),
    ("epsilon", -1e-8),
    ("learning_rate", -0.1),
    ("momentum", math.nan),
    ("weight_decay", math.inf),
    ("eeta", math.nan),
    ("epsilon", math.inf),
])
def test_tf_lars_bad_values(arg, value):
  kwargs = {"learning_rate": 0.1, arg: value}
  with pytest.raises(ValueError, match=arg):
    lars_optax.tf_lars(**kwargs)


@pytest.mark.parametrize("arg, value", [
    ("skip_list", "bias"),
    ("use_nesterov", "yes"),
    ("use_nesterov", 1),
    ("use_nesterov", None),
    ("momentum", True),
    ("weight_decay", "0"),
    ("eeta", None),
    ("learning_rate", "0.1"),
])
def test_tf_lars_wrong_type(arg, value):
  kwargs = {"learning_rate": 0.1, arg: value}
  with pytest.raises(TypeError, match=arg):
    lars_optax.tf_lars(**kwargs)


def test_tf_lars_learning_rate_is_required():
  with pytest.raises(TypeError):
    lars_optax.tf_lars()  # pylint: disable=no-value-for-parameter


@pytest.mark.parametrize("skip", [3, 0.5])
def test_lars_skip_wrong_type(skip):
  with pytest.raises(TypeError, match="skip"):
    lars_optax.lars(skip=skip)


def test_lars_skip_unknown_preset_lists_the_valid_ones():
  with pytest.raises(ValueError, match=r"skip: unknown preset 'bias'.*flax.*haiku.*mxnet"):
    lars_optax.lars(skip="bias")


@pytest.mark.parametrize("preset,mask", [("mxnet", lars_optax.masks.MXNET_SKIP),
                                         ("flax", lars_optax.masks.FLAX_SKIP),
                                         ("haiku", lars_optax.masks.HAIKU_SKIP)])
def test_lars_skip_preset_names(preset, mask):
  params = {"a": {"bias": jnp.ones(3), "b": jnp.ones(3), "scale": jnp.ones(3)},
            "fc_weight": jnp.ones((3, 3)), "x_gamma": jnp.ones(3)}
  grads = jax.tree.map(lambda p: 0.5 * p, params)
  by_name, by_mask = lars_optax.lars(skip=preset), lars_optax.lars(skip=mask)
  u1, s1 = by_name.update(grads, by_name.init(params), params)
  u2, s2 = by_mask.update(grads, by_mask.init(params), params)
  chex.assert_trees_all_equal(u1, u2)
  chex.assert_trees_all_equal(lars_optax.trust_ratios(s1), lars_optax.trust_ratios(s2))


def test_lars_skip_mismatched_tree_fails_at_init():
  opt = lars_optax.lars(skip={"w": True})
  with pytest.raises(ValueError, match="skip"):
    opt.init(_params())


# --------------------------------------------------------------------------
# Parameter and gradient checks at init / update
# --------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(OPTIMIZERS))
@pytest.mark.parametrize("dtype", [jnp.int32, jnp.uint8, jnp.bool_])  # complex: test_dtypes.py
def test_non_float_params_rejected_at_init(name, dtype):
  opt = OPTIMIZERS[name]()
  params = {"w": jnp.ones((2,)), "layer": {"bad": jnp.ones((2,), dtype)}}
  with pytest.raises(TypeError, match="'layer/bad'"):
    opt.init(params)


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_non_float_params_rejected_at_update(name):
  opt = OPTIMIZERS[name]()
  state = opt.init(_params())
  params = {"w": jnp.ones(2), "fc_bias": jnp.ones(2, jnp.int32)}
  grads = {"w": jnp.ones(2), "fc_bias": jnp.ones(2, jnp.int32)}
  with pytest.raises(TypeError, match="'fc_bias'"):
    opt.update(grads, state, params)


@pytest.mark.parametrize("name", list(OPTIMIZERS))
@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize("grads, match", [
    ({"w": jnp.ones(2)}, r"missing from gradients: \['fc_bias'\]"),
    ({"w": jnp.ones(2), "fc_bias": jnp.ones(2), "extra": jnp.ones(1)},
     r"not in params: \['extra'\]"),
    ({"w": jnp.ones(3), "fc_bias": jnp.ones(2)}, r"gradient 'w' has shape \(3,\)"),
    ({"w": jnp.ones((2, 1)), "fc_bias": jnp.ones(2)}, r"gradient 'w' has shape \(2, 1\)"),
])
def test_mismatched_gradients(name, jit, grads, match):
  opt = OPTIMIZERS[name]()
  params = _params()
  state = opt.init(params)
  update = jax.jit(opt.update) if jit else opt.update
  with pytest.raises(ValueError, match=match):
    update(grads, state, params)


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_mismatched_containers(name):
  opt = OPTIMIZERS[name]()
  params = (jnp.ones(2), jnp.ones(3))
  state = opt.init(params)
  with pytest.raises(ValueError, match="different tree structures"):
    opt.update([jnp.ones(2), jnp.ones(3)], state, params)


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_update_requires_params(name):
  opt = OPTIMIZERS[name]()
  state = opt.init(_params())
  with pytest.raises(ValueError, match="params"):
    opt.update(_grads(), state)


# --------------------------------------------------------------------------
# Learning-rate schedules, checked against hand calculations
# --------------------------------------------------------------------------

# linear_schedule(0.5, 0.1, 4): 0.5 at count 0, 0.4 at count 1.
SCHEDULE = optax.linear_schedule(0.5, 0.1, 4)


def test_lars_schedule_and_one_step_by_hand():
  opt = lars_optax.lars(SCHEDULE, momentum=0.9, eta=0.01, wd=0.1, epsilon=0.0)
  params, grads = _params(), _grads()
  state = opt.init(params)
  updates, state = opt.update(grads, state, params)
  # w: ratio = 0.01 * 5 / (1 + 0.1 * 5) = 1/30; u = g + 0.1 w = [0.9, 1.2];
  #    update = -0.5 * u / 30.
  # fc_bias (skipped by MXNET_SKIP, still decayed): update = -0.5 * (g + 0.1 w).
  chex.assert_trees_all_close(updates, {"w": jnp.array([-0.015, -0.02]),
                                        "fc_bias": jnp.array([-0.3, -0.2])}, rtol=1e-6)
  chex.assert_trees_all_close(state[2].momentum, updates)
  chex.assert_trees_all_close(lars_optax.trust_ratios(state), jnp.array([1.0, 1 / 30]),
                              rtol=1e-6)

  # Second step: the learning rate is schedule(1) = 0.4.
  w1 = np.array([3.0, 4.0]) + np.array([-0.015, -0.02])
  b1 = np.array([1.0, -1.0]) + np.array([-0.3, -0.2])
  params = optax.apply_updates(params, updates)
  updates2, state = opt.update(grads, state, params)
  g_w, g_b = np.array([0.6, 0.8]), np.array([0.5, 0.5])
  r = _np_ratio(w1, g_w, 0.01, 0.1)
  expected = {"w": 0.9 * np.array([-0.015, -0.02]) - 0.4 * r * (g_w + 0.1 * w1),
              "fc_bias": 0.9 * np.array([-0.3, -0.2]) - 0.4 * (g_b + 0.1 * b1)}
  chex.assert_trees_all_close(updates2, jax.tree.map(jnp.asarray, expected), rtol=1e-5)


def test_lars_rescale_and_clip_by_hand():
  opt = lars_optax.lars(0.5, eta=0.01, wd=0.1, epsilon=0.0, rescale_grad=0.5,
                        clip_gradient=0.7)
  params = _params()
  grads = {"w": jnp.array([1.2, 1.6]), "fc_bias": jnp.array([1.0, 1.0])}
  updates, state = opt.update(grads, opt.init(params), params)
  # Rescaled w gradient [0.6, 0.8] (norm 1): ratio 1/30 from the unclipped
  # gradient; clipped [0.6, 0.7] + 0.1 w = [0.9, 1.1].
  chex.assert_trees_all_close(updates, {"w": -0.5 / 30 * jnp.array([0.9, 1.1]),
                                        "fc_bias": jnp.array([-0.3, -0.2])}, rtol=1e-6)
  chex.assert_trees_all_close(lars_optax.trust_ratios(state), jnp.array([1.0, 1 / 30]),
                              rtol=1e-6)


@pytest.mark.parametrize("nesterov", [False, True])
def test_tf_lars_schedule_and_one_step_by_hand(nesterov):
  opt = lars_optax.tf_lars(SCHEDULE, momentum=0.9, weight_decay=0.1, eeta=0.01,
                           epsilon=0.0, skip_list=["bias"], use_nesterov=nesterov)
  params, grads = _params(), _grads()
  state = opt.init(params)
  updates, state = opt.update(grads, state, params)
  # w: ratio 1/30 (weight decay only in the ratio); accumulator a = g.
  # Nesterov uses g + 0.9 a = 1.9 g. fc_bias is in skip_list: ratio 1.
  f = 1.9 if nesterov else 1.0
  chex.assert_trees_all_close(updates, {"w": -0.5 * f / 30 * jnp.array([0.6, 0.8]),
                                        "fc_bias": -0.5 * f * jnp.array([0.5, 0.5])},
                              rtol=1e-6)

  # Second step with schedule(1) = 0.4; accumulator 0.9 g + g.
  w1 = np.array([3.0, 4.0]) - 0.5 * f / 30 * np.array([0.6, 0.8])
  params = optax.apply_updates(params, updates)
  updates2, state = opt.update(grads, state, params)
  g_w, g_b = np.array([0.6, 0.8]), np.array([0.5, 0.5])
  a2 = 1.9
  d = (1.0 + 0.9 * a2) if nesterov else a2
  r = _np_ratio(w1, g_w, 0.01, 0.1)
  expected = {"w": -0.4 * r * d * g_w, "fc_bias": -0.4 * d * g_b}
  chex.assert_trees_all_close(updates2, jax.tree.map(jnp.asarray, expected), rtol=1e-5)


@pytest.mark.op_by_op
@pytest.mark.parametrize("factory", [
    lambda lr: lars_optax.lars(lr, momentum=0.9),
    lambda lr: lars_optax.tf_lars(lr, momentum=0.9),
])
def test_schedule_matches_constant_at_step_zero(factory):
  params, grads = _params(), _grads()
  sched = optax.linear_schedule(0.3, 0.0, 10)
  opt_s, opt_c = factory(sched), factory(0.3)
  u_s, _ = jax.jit(opt_s.update)(grads, opt_s.init(params), params)
  u_c, _ = jax.jit(opt_c.update)(grads, opt_c.init(params), params)
  chex.assert_trees_all_close(u_s, u_c, rtol=1e-6)


# --------------------------------------------------------------------------
# skip and trust_ratios
# --------------------------------------------------------------------------


def _mxnet_tree():
  return {
      "fc1_weight": jnp.array([[1.0, 2.0], [3.0, -1.0]]),
      "fc1_bias": jnp.array([0.5, -0.5]),
      "bn_gamma": jnp.array([1.0, 2.0]),
      "bn_beta": jnp.array([0.1, 0.2]),
      "conv_weight": jnp.array([[[2.0]], [[-1.0]]]),
  }


def _step_ratios(opt, params):
  grads = jax.tree.map(lambda p: 0.1 * p + 0.05, params)
  _, state = opt.update(grads, opt.init(params), params)
  return state, lars_optax.trust_ratios(state, params)


def test_trust_ratios_vector_and_dict_default_skip():
  params = _mxnet_tree()
  opt = lars_optax.lars(0.1, eta=0.01)
  state, ratios = _step_ratios(opt, params)
  vec = lars_optax.trust_ratios(state)
  assert vec.shape == (len(jax.tree.leaves(params)),)
  assert vec.dtype == jnp.float32
  names = [n for n, _ in lars_optax.named_leaves(params)]
  assert list(ratios) == names
  for i, n in enumerate(names):
    assert float(ratios[n]) == float(vec[i])
  skipped = {"fc1_bias", "bn_gamma", "bn_beta"}
  for n, r in ratios.items():
    if n in skipped:
      assert float(r) == 1.0, n
    else:
      assert float(r) != 1.0, n
  # One entry per leaf in jax.tree.leaves order, each the leaf's own ratio.
  grads = jax.tree.map(lambda p: 0.1 * p + 0.05, params)
  for i, (n, p) in enumerate(lars_optax.named_leaves(params)):
    if n not in skipped:
      np.testing.assert_allclose(vec[i], _np_ratio(p, grads[n], 0.01, eps=1e-8), rtol=1e-5)


def test_trust_ratios_are_one_before_the_first_step():
  params = _mxnet_tree()
  state = lars_optax.lars().init(params)
  chex.assert_trees_all_equal(lars_optax.trust_ratios(state), jnp.ones(5))


def test_skip_none_gives_every_leaf_a_ratio():
  params = _mxnet_tree()
  _, ratios = _step_ratios(lars_optax.lars(0.1, eta=0.01, skip=None), params)
  for n, r in ratios.items():
    assert float(r) != 1.0, n


def test_skip_custom_mask():
  params = _mxnet_tree()
  mask = lars_optax.by_suffix("weight") & lars_optax.by_ndim(2)
  _, ratios = _step_ratios(lars_optax.lars(0.1, eta=0.01, skip=mask), params)
  assert float(ratios["fc1_weight"]) == 1.0
  for n in ("fc1_bias", "bn_gamma", "bn_beta", "conv_weight"):
    assert float(ratios[n]) != 1.0, n


def test_skip_bool_pytree():
  params = _mxnet_tree()
  skip = {"fc1_weight": False, "fc1_bias": False, "bn_gamma": True, "bn_beta": False,
          "conv_weight": True}
  _, ratios = _step_ratios(lars_optax.lars(0.1, eta=0.01, skip=skip), params)
  for n, s in skip.items():
    assert (float(ratios[n]) == 1.0) == s, n


def test_skip_plain_callable():
  params = _mxnet_tree()
  skip = lambda p: jax.tree.map(lambda x: x.ndim == 1, p)
  _, ratios = _step_ratios(lars_optax.lars(0.1, eta=0.01, skip=skip), params)
  for n, p in params.items():
    assert (float(ratios[n]) == 1.0) == (p.ndim == 1), n


def test_skipped_leaf_update_does_not_depend_on_eta():
  params, grads = _mxnet_tree(), jax.tree.map(jnp.ones_like, _mxnet_tree())
  a = lars_optax.lars(0.1, eta=0.01)
  b = lars_optax.lars(0.1, eta=0.5)
  u_a, _ = a.update(grads, a.init(params), params)
  u_b, _ = b.update(grads, b.init(params), params)
  for n in ("fc1_bias", "bn_gamma", "bn_beta"):
    chex.assert_trees_all_equal(u_a[n], u_b[n])
    chex.assert_trees_all_close(u_a[n], -0.1 * grads[n])


def test_tf_lars_skip_list_ratios():
  params = {"dense/kernel": jnp.ones((2, 2)), "dense/bias": jnp.ones(2),
            "batch_normalization/gamma": jnp.ones(2)}
  opt = lars_optax.tf_lars(0.1, skip_list=["batch_normalization", "bias"])
  _, ratios = _step_ratios(opt, params)
  assert float(ratios["dense/bias"]) == 1.0
  assert float(ratios["batch_normalization/gamma"]) == 1.0
  assert float(ratios["dense/kernel"]) != 1.0
  # Without skip_list nothing is skipped.
  _, ratios = _step_ratios(lars_optax.tf_lars(0.1), params)
  assert all(float(r) != 1.0 for r in ratios.values())


def test_trust_ratios_under_jit_and_in_a_chain():
  params = _mxnet_tree()
  opt = optax.chain(optax.clip_by_global_norm(10.0), lars_optax.lars(0.1, eta=0.01))
  state = opt.init(params)
  grads = jax.tree.map(jnp.ones_like, params)

  @jax.jit
  def step(state):
    _, state = opt.update(grads, state, params)
    return lars_optax.trust_ratios(state)

  vec = step(state)
  assert vec.shape == (5,)


def test_trust_ratios_without_lars_state():
  params = _params()
  with pytest.raises(ValueError, match="ScaleByLarsTrustRatioState"):
    lars_optax.trust_ratios(optax.sgd(0.1, momentum=0.9).init(params))
  with pytest.raises(ValueError, match="state"):
    lars_optax.trust_ratios(optax.EmptyState(), params)


def test_trust_ratios_wrong_params():
  params = _params()
  state = lars_optax.lars().init(params)
  with pytest.raises(ValueError, match="params"):
    lars_optax.trust_ratios(state, {"w": jnp.ones(2)})


# --------------------------------------------------------------------------
# dtypes
# --------------------------------------------------------------------------

# LARS's own dtype paths (schedules, Nesterov, skip_list), which the table's rows leave out.
DTYPE_OPTIMIZERS = {
    "lars": lambda: lars_optax.lars(0.1, momentum=0.9, wd=1e-4, clip_gradient=1.0,
                                    rescale_grad=0.5, skip=lars_optax.by_suffix("bias")),
    "lars_schedule": lambda: lars_optax.lars(optax.linear_schedule(0.1, 0.01, 10),
                                             momentum=0.9, wd=1e-4),
    "tf_lars": lambda: lars_optax.tf_lars(0.1, momentum=0.9, skip_list=["bias"]),
    "tf_lars_nesterov_schedule": lambda: lars_optax.tf_lars(
        optax.cosine_decay_schedule(0.1, 10), momentum=0.9, use_nesterov=True),
}


def _check_dtypes_after_two_jitted_steps(opt, dtype, ratio_dtype):
  params = {"w": jnp.arange(1.0, 7.0).reshape(2, 3).astype(dtype),
            "fc_bias": jnp.array([0.5, -0.5, 1.0], dtype)}
  state = opt.init(params)

  @jax.jit
  def step(params, state):
    grads = jax.tree.map(lambda p: 0.1 * p + jnp.asarray(0.01, p.dtype), params)
    updates, state = opt.update(grads, state, params)
    return optax.apply_updates(params, updates), updates, state

  new_params, updates, state = step(params, state)
  new_params, updates, state = step(new_params, state)
  expected = {"w": jnp.dtype(dtype), "fc_bias": jnp.dtype(dtype)}
  assert jax.tree.map(lambda x: x.dtype, new_params) == expected
  assert jax.tree.map(lambda x: x.dtype, updates) == expected
  lars_state = state[1]  # state[0] is check_inputs' empty state
  assert isinstance(lars_state, ScaleByLarsTrustRatioState)
  assert lars_state.trust_ratio.dtype == ratio_dtype
  # The momentum buffer: MXNet's in the second element, TF's the trace.
  if isinstance(state[2], MXNetMomentumState):
    buf = state[2].momentum
  else:
    buf = lars_state.inner_state.trace
  assert jax.tree.map(lambda x: x.dtype, buf) == expected
  assert all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves(new_params))
  # (The LARS steps are far below a bfloat16/float16 ulp of these weights, so
  # check the updates rather than the new weights.)
  assert bool(jnp.all(updates["w"] != 0)) and bool(jnp.all(jnp.isfinite(updates["w"])))


@pytest.mark.op_by_op
@pytest.mark.parametrize("name", list(DTYPE_OPTIMIZERS))
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.float16])
def test_dtype_preserved(name, dtype):
  _check_dtypes_after_two_jitted_steps(DTYPE_OPTIMIZERS[name](), dtype, jnp.float32)


@pytest.mark.parametrize("name", list(DTYPE_OPTIMIZERS))
@pytest.mark.parametrize("dtype, ratio_dtype", [(jnp.float64, jnp.float64),
                                                (jnp.float32, jnp.float32)])
def test_dtype_preserved_x64(name, dtype, ratio_dtype):
  with x64():
    _check_dtypes_after_two_jitted_steps(DTYPE_OPTIMIZERS[name](), dtype, ratio_dtype)


# --------------------------------------------------------------------------
# Degenerate trees
# --------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_empty_params(name):
  opt = OPTIMIZERS[name]()
  state = opt.init({})
  updates, state = jax.jit(opt.update)({}, state, {})
  assert updates == {}
  assert lars_optax.trust_ratios(state).shape == (0,)
  assert lars_optax.trust_ratios(state, {}) == {}
  updates, _ = jax.jit(opt.update)({}, state, {})
  assert updates == {}


def test_scalar_leaf():
  opt = lars_optax.lars(0.5, eta=0.1, epsilon=0.0, skip=None)
  params, grads = {"s": jnp.array(2.0)}, {"s": jnp.array(0.5)}
  updates, state = jax.jit(opt.update)(grads, opt.init(params), params)
  # ratio = 0.1 * 2 / 0.5 = 0.4; update = -0.5 * 0.4 * 0.5.
  chex.assert_trees_all_close(updates, {"s": jnp.array(-0.1)}, rtol=1e-6)
  chex.assert_shape(updates["s"], ())
  chex.assert_trees_all_close(lars_optax.trust_ratios(state), jnp.array([0.4]), rtol=1e-6)


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_scalar_leaf_tf_lars_and_lars(name):
  opt = OPTIMIZERS[name]()
  params = {"s": jnp.array(2.0), "w": jnp.ones((2, 2))}
  updates, _ = jax.jit(opt.update)({"s": jnp.array(0.5), "w": jnp.ones((2, 2))},
                                   opt.init(params), params)
  chex.assert_shape(updates["s"], ())


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_zero_size_leaf(name):
  opt = OPTIMIZERS[name](**({"skip": None} if name == "lars" else {}))
  params = {"empty": jnp.zeros((0, 3)), "w": jnp.array([3.0, 4.0])}
  grads = {"empty": jnp.zeros((0, 3)), "w": jnp.array([0.6, 0.8])}
  state = opt.init(params)
  updates, state = jax.jit(opt.update)(grads, state, params)
  chex.assert_shape(updates["empty"], (0, 3))
  ratios = lars_optax.trust_ratios(state, params)
  assert float(ratios["empty"]) == 1.0
  assert float(ratios["w"]) != 1.0
  new_params = optax.apply_updates(params, updates)
  chex.assert_shape(new_params["empty"], (0, 3))


# --------------------------------------------------------------------------
# optax protocol
# --------------------------------------------------------------------------


@pytest.mark.op_by_op
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_extra_args(name):
  opt = OPTIMIZERS[name]()
  assert isinstance(opt, optax.GradientTransformationExtraArgs)
  params, grads = _params(), _grads()
  # Directly and inside a chain with a plain transformation.
  u_ref, _ = opt.update(grads, opt.init(params), params)
  u_direct, _ = opt.update(grads, opt.init(params), params, value=jnp.array(1.0))
  chex.assert_trees_all_close(u_direct, u_ref)
  chained = optax.chain(optax.clip_by_global_norm(100.0), opt, optax.scale(1.0))
  assert isinstance(chained, optax.GradientTransformationExtraArgs)
  state = chained.init(params)
  u, state = jax.jit(chained.update)(grads, state, params, value=jnp.array(1.0))
  chex.assert_trees_all_close(u, u_ref)
  u, _ = chained.update(grads, state, params, value=1.0, other_extra="x")
  chex.assert_tree_all_finite(u)


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_inside_optax_masked(name):
  opt = optax.masked(OPTIMIZERS[name](), {"w": True, "fc_bias": False})
  params, grads = _params(), _grads()
  updates, state = opt.update(grads, opt.init(params), params)
  chex.assert_trees_all_equal(updates["fc_bias"], grads["fc_bias"])
  vec = lars_optax.trust_ratios(state)  # leaf order: fc_bias (routed elsewhere: -1), w
  assert vec.shape == (2,) and float(vec[0]) == -1.0 and float(vec[1]) > 0
  assert sorted(lars_optax.trust_ratios(state, params)) == ["w"]


def test_tf_lars_with_inject_hyperparams():
  opt = optax.inject_hyperparams(lars_optax.tf_lars)(learning_rate=0.1, momentum=0.9)
  params, grads = _params(), _grads()
  state = opt.init(params)
  u, state = jax.jit(opt.update)(grads, state, params)
  ref = lars_optax.tf_lars(0.1, momentum=0.9)
  u_ref, _ = ref.update(grads, ref.init(params), params)
  chex.assert_trees_all_close(u, u_ref, rtol=1e-6)
  assert lars_optax.trust_ratios(state).shape == (2,)


def test_lars_with_inject_hyperparams_workaround():
  # Works when the Mask default and the arguments used in Python `if`s are static.
  opt = optax.inject_hyperparams(
      lars_optax.lars, static_args=("skip", "momentum", "wd", "rescale_grad"))(
          learning_rate=0.1, momentum=0.9)
  params, grads = _params(), _grads()
  u, _ = jax.jit(opt.update)(grads, opt.init(params), params)
  ref = lars_optax.lars(0.1, momentum=0.9)
  u_ref, _ = ref.update(grads, ref.init(params), params)
  chex.assert_trees_all_close(u, u_ref, rtol=1e-6)


def test_lars_with_inject_hyperparams():
  """Injected (traced) momentum, wd and rescale_grad, and the default skip preset."""
  opt = optax.inject_hyperparams(lars_optax.lars)(
      learning_rate=0.1, momentum=0.9, wd=1e-3, rescale_grad=0.5)
  params, grads = _params(), _grads()
  state = opt.init(params)
  step = jax.jit(opt.update)
  ref = lars_optax.lars(0.1, momentum=0.9, wd=1e-3, rescale_grad=0.5)
  ref_state = ref.init(params)
  for _ in range(2):
    u, state = step(grads, state, params)
    u_ref, ref_state = ref.update(grads, ref_state, params)
    chex.assert_trees_all_close(u, u_ref, rtol=1e-6)


def test_lars_without_momentum_keeps_no_buffer():
  opt = lars_optax.lars(0.1, momentum=0.0)
  params, grads = _params(), _grads()
  state = opt.init(params)
  assert isinstance(state[2], MXNetMomentumState)
  assert state[2].momentum is None
  updates, state = jax.jit(opt.update)(grads, state, params)
  assert state[2].momentum is None
  assert int(state[2].count) == 1
  # No momentum: plain -lr * ratio * g.
  chex.assert_trees_all_close(updates["fc_bias"], -0.1 * grads["fc_bias"])


def test_lars_with_momentum_keeps_a_buffer():
  opt = lars_optax.lars(0.1, momentum=0.5)
  params = _params()
  state = opt.init(params)
  chex.assert_trees_all_equal(state[2].momentum, jax.tree.map(jnp.zeros_like, params))


@pytest.mark.parametrize("skip_list", [[3], ["bias", ""]])
def test_tf_lars_skip_list_entries_are_named(skip_list):
  with pytest.raises(TypeError, match="skip_list"):
    lars_optax.tf_lars(0.1, skip_list=skip_list)


def test_tf_lars_accepts_numpy_bool_nesterov():
  opt = lars_optax.tf_lars(0.1, use_nesterov=np.bool_(True))
  params = {"w": jnp.ones(3)}
  opt.update({"w": jnp.ones(3)}, opt.init(params), params)


# --------------------------------------------------------------------------
# The default skip preset warns on another framework's names
# --------------------------------------------------------------------------


def _framework_params(kind):
  if kind == "flax":
    return {"Dense_0": {"kernel": jnp.ones((3, 2)), "bias": jnp.ones(2)},
            "LayerNorm_0": {"scale": jnp.ones(2), "bias": jnp.ones(2)}}
  if kind == "haiku":
    return {"linear": {"w": jnp.ones((3, 2)), "b": jnp.ones(2)},
            "layer_norm": {"scale": jnp.ones(2), "offset": jnp.ones(2)}}
  if kind == "equinox":
    return {"linear": {"weight": jnp.ones((2, 3)), "bias": jnp.ones(2)},
            "norm": {"weight": jnp.ones(2), "bias": jnp.ones(2)}}
  return {"fc1_weight": jnp.ones((3, 2)), "fc1_bias": jnp.ones(2),
          "bn0_gamma": jnp.ones(2), "bn0_beta": jnp.ones(2)}


@pytest.mark.parametrize("kind, missed", [
    ("flax", "LayerNorm_0/scale"), ("haiku", "layer_norm/offset"), ("equinox", "norm/weight")])
def test_default_skip_warns_on_another_frameworks_names(kind, missed):
  with pytest.warns(UserWarning, match=rf"^skip: the default preset 'mxnet' .*{missed}.*"
                                       rf"pass skip='{kind}'"):
    lars_optax.lars(0.1).init(_framework_params(kind))


@pytest.mark.parametrize("kind", ["flax", "haiku", "equinox"])
def test_explicit_skip_does_not_warn(kind):
  params = _framework_params(kind)
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    lars_optax.lars(0.1, skip="mxnet").init(params)
    lars_optax.lars(0.1, skip=kind).init(params)
    lars_optax.mxnet.create("lars", skip=kind).init(params)


def test_default_skip_keeps_mxnets_rule_silently_on_mxnet_names():
  params = _framework_params("mxnet")
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    state = lars_optax.lars(0.1).init(params)
  tx = lars_optax.lars(0.1)
  _, state = tx.update(params, state, params)
  ratios = lars_optax.trust_ratios(state, params)
  assert [n for n, r in ratios.items() if float(r) == 1.0] == ["bn0_beta", "bn0_gamma",
                                                               "fc1_bias"]


def test_default_skip_is_still_mxnets_preset():
  params = _framework_params("flax")
  with pytest.warns(UserWarning):
    tx = lars_optax.lars(0.1)
    state = tx.init(params)
  _, state = tx.update(params, state, params)
  ratios = lars_optax.trust_ratios(state, params)
  assert float(ratios["LayerNorm_0/scale"]) != 1.0  # adapted, as MXNet's rule says
  assert float(ratios["LayerNorm_0/bias"]) == 1.0


def test_default_skip_does_not_warn_on_flat_names():
  params = {"w": jnp.ones((3, 2)), "b": jnp.ones(2), "scale": jnp.ones(2)}
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    lars_optax.lars(0.1).init(params)


# --------------------------------------------------------------------------
# wd_skip: leaves without weight decay (lars, lamb, lans)
# --------------------------------------------------------------------------


def _flax_params():
  k = jax.random.split(jax.random.key(0), 5)
  return {"Dense_0": {"kernel": jax.random.normal(k[0], (4, 3)),
                      "bias": jax.random.normal(k[1], (3,))},
          "LayerNorm_0": {"scale": 1.0 + 0.1 * jax.random.normal(k[2], (3,))},
          "Dense_1": {"kernel": jax.random.normal(k[3], (3, 2)),
                      "bias": jax.random.normal(k[4], (2,))}}


# Every optimizer that takes wd_skip, from the table (tests/optimizers.py), with a weight
# decay that shows in a few steps (and lars's skip=None: wd_skip alone decides).
WD_SKIP_OPTIMIZERS = {
    o.name: functools.partial(o.make, wd=0.1, **({"skip": None} if o.name == "lars" else {}))
    for o in optimizers.TABLE if "wd_skip" in inspect.signature(o.fn).parameters}


def _train(tx, params, steps=3):
  state = tx.init(params)
  for i in range(steps):
    grads = jax.tree.map(
        lambda p, i=i: jnp.cos(p * (i + 1.0)) + 0.1 * p, params)
    updates, state = tx.update(grads, state, params)
    params = optax.apply_updates(params, updates)
  return params


@pytest.mark.parametrize("name", list(WD_SKIP_OPTIMIZERS))
@pytest.mark.parametrize("wd_skip, wd_mult, same_as", [
    ("flax", None, [("flax", 0.0)]),
    (masks.by_leaf_name("bias"), None, [(masks.by_leaf_name("bias"), 0.0)]),
    ({"Dense_0": {"kernel": False, "bias": True}, "LayerNorm_0": {"scale": True},
      "Dense_1": {"kernel": False, "bias": False}}, None,
     {"Dense_0/bias": 0.0, "LayerNorm_0/scale": 0.0}),
    # With wd_mult as well, wd_skip wins: its leaves get 0 whatever wd_mult says.
    (masks.by_leaf_name("bias"), {"Dense_0/kernel": 0.5, "Dense_1/bias": 2.0},
     {"Dense_0/kernel": 0.5, "Dense_0/bias": 0.0, "Dense_1/bias": 0.0}),
    ("flax", [(masks.by_ndim(1), 3.0)], [("flax", 0.0), (masks.by_ndim(1), 3.0)]),
])
def test_wd_skip_equals_wd_mult_zero_on_its_leaves(name, wd_skip, wd_mult, same_as):
  make = WD_SKIP_OPTIMIZERS[name]
  params = _flax_params()
  got = _train(make(wd_skip=wd_skip, wd_mult=wd_mult), params)
  chex.assert_trees_all_close(got, _train(make(wd_mult=same_as), params), rtol=1e-6)
  # ... and it changes something: the skipped leaves decay without it.
  plain = _train(make(wd_mult=wd_mult), params)
  assert not np.allclose(got["Dense_0"]["bias"], plain["Dense_0"]["bias"])


@pytest.mark.parametrize("name", list(WD_SKIP_OPTIMIZERS))
def test_wd_skip_judges_one_layer_of_a_stacked_leaf(name):
  make = WD_SKIP_OPTIMIZERS[name]
  k = jax.random.split(jax.random.key(1), 2)
  params = {"blocks": {"kernel": jax.random.normal(k[0], (3, 4, 4)),
                       "bias": jax.random.normal(k[1], (3, 4))}}
  stacked = masks.by_substring("blocks")
  got = _train(make(wd_skip=masks.by_ndim(1), stacked=stacked), params)
  want = _train(make(wd_mult=[(masks.by_ndim(1), 0.0)], stacked=stacked), params)
  chex.assert_trees_all_close(got, want, rtol=1e-6)


@pytest.mark.parametrize("name", list(WD_SKIP_OPTIMIZERS))
def test_create_passes_wd_skip(name):
  params = _flax_params()
  kw = {"learning_rate": 0.05, "wd": 0.1, "skip": "flax", "wd_skip": "flax"}
  got = _train(lars_optax.mxnet.create(name, **kw), params)
  chex.assert_trees_all_close(got, _train(public(name)(**kw), params))


def test_create_rejects_wd_skip_where_the_optimizer_has_none():
  with pytest.raises(ValueError, match=r"^wd_skip: not an argument of 'adam'"):
    lars_optax.mxnet.create("adam", wd=0.1, wd_skip="flax")


@pytest.mark.parametrize("name", list(WD_SKIP_OPTIMIZERS))
@pytest.mark.parametrize("wd_skip, error, match", [
    ("flaxx", ValueError, "^wd_skip: unknown preset 'flaxx'"),
    (3, TypeError, "^wd_skip: expected a mask"),
    (["bias"], TypeError, "^wd_skip: expected a mask"),
])
def test_wd_skip_rejects_what_skip_rejects(name, wd_skip, error, match):
  with pytest.raises(error, match=match):
    WD_SKIP_OPTIMIZERS[name](wd_skip=wd_skip)


@pytest.mark.parametrize("name", list(WD_SKIP_OPTIMIZERS))
def test_wd_skip_names_that_match_no_leaf_raise_at_init(name):
  tx = WD_SKIP_OPTIMIZERS[name](wd_skip=masks.by_leaf_name("bais"))
  with pytest.raises(ValueError,
                     match=r"^wd_skip: no parameter name has the last component 'bais'"):
    tx.init(_flax_params())
