"""LAMB and LANS (``lars_optax.lamb``, ``lars_optax.lans``) and their building blocks.

MXNet's numbers are checked in ``test_reference_mxnet_registry.py``; here: the
rules written out in numpy, the masks, the logged ratios, the bounds, the
zero-norm fallbacks, sharded params and the comparison with ``optax.lamb``.
"""

import functools
import warnings

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import public
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

import lars_optax
from lars_optax import _utils


def _params():
  rng = np.random.default_rng(0)
  return {"fc1_weight": jnp.asarray(rng.normal(size=(6, 4)), jnp.float32),
          "fc1_bias": jnp.asarray(0.1 * rng.normal(size=(4,)), jnp.float32),
          "bn_gamma": jnp.asarray(1 + 0.1 * rng.normal(size=(4,)), jnp.float32)}


def _grads(k, params=None):
  rng = np.random.default_rng(k + 1)
  params = _params() if params is None else params
  return jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape), p.dtype), params)


def _run(tx, params, steps=3):
  state = tx.init(params)
  step = jax.jit(tx.update)
  for k in range(steps):
    updates, state = step(_grads(k, params), state, params)
    params = optax.apply_updates(params, updates)
  return params, updates, state


def _np_lamb(params, grads_seq, lr, b1, b2, eps, wd, lower=None, upper=None,
             bias_correction=True):
  """LAMB's rule in float64 numpy, leaf by leaf."""
  w = {k: np.asarray(v, np.float64) for k, v in params.items()}
  m = {k: np.zeros_like(v) for k, v in w.items()}
  v = {k: np.zeros_like(x) for k, x in w.items()}
  for t, grads in enumerate(grads_seq, start=1):
    for k in w:
      g = np.asarray(grads[k], np.float64)
      m[k] = b1 * m[k] + (1 - b1) * g
      v[k] = b2 * v[k] + (1 - b2) * g * g
      if bias_correction:
        d = (m[k] / (1 - b1**t)) / (np.sqrt(v[k] / (1 - b2**t)) + eps) + wd * w[k]
      else:
        d = m[k] / (np.sqrt(v[k]) + eps) + wd * w[k]
      r1 = np.linalg.norm(w[k])
      r1 = r1 if lower is None else max(r1, lower)
      r1 = r1 if upper is None else min(r1, upper)
      r2 = np.linalg.norm(d)
      ratio = 1.0 if r1 == 0 or r2 == 0 else r1 / r2
      w[k] = w[k] - lr * ratio * d
  return w


@pytest.mark.parametrize("bias_correction", [True, False])
def test_lamb_matches_the_rule_in_numpy(bias_correction):
  params = _params()
  tx = lars_optax.lamb(0.05, beta1=0.8, beta2=0.99, epsilon=1e-3, wd=0.01, lower_bound=0.5,
                       upper_bound=2.0, bias_correction=bias_correction)
  out, _, _ = _run(tx, params)
  expected = _np_lamb(params, [_grads(k) for k in range(3)], 0.05, 0.8, 0.99, 1e-3, 0.01,
                      0.5, 2.0, bias_correction)
  for k in params:
    np.testing.assert_allclose(out[k], expected[k], rtol=1e-5, atol=1e-7)


def test_lamb_equals_optax_lamb_where_the_rules_coincide():
  """No masks, no bounds, no clipping: MXNet's LAMB is optax.lamb."""
  params = _params()
  ours, _, _ = _run(lars_optax.lamb(0.01, beta1=0.9, beta2=0.999, epsilon=1e-6, wd=0.01), params,
                    steps=4)
  theirs, _, _ = _run(optax.lamb(0.01, 0.9, 0.999, 1e-6, weight_decay=0.01), params, steps=4)
  chex.assert_trees_all_close(ours, theirs, rtol=1e-6, atol=1e-7)


def test_lamb_applies_the_ratio_to_every_leaf_by_default():
  params = _params()
  _, _, state = _run(lars_optax.lamb(0.01), params, steps=1)
  ratios = lars_optax.trust_ratios(state, params)
  assert set(ratios) == set(params)
  assert all(abs(float(r) - 1.0) > 1e-3 for r in ratios.values())


@pytest.mark.op_by_op
@pytest.mark.parametrize("make", [lars_optax.lamb, lars_optax.lans], ids=["lamb", "lans"])
def test_skipped_leaves_have_ratio_exactly_one(make):
  params = _params()
  tx = make(0.01, wd=0.01, skip="mxnet")  # names ending in bias, gamma, beta
  _, updates, state = _run(tx, params, steps=2)
  ratios = lars_optax.trust_ratios(state, params)
  assert float(ratios["fc1_bias"]) == 1.0 and float(ratios["bn_gamma"]) == 1.0
  assert float(ratios["fc1_weight"]) != 1.0
  # The skipped leaves take the step of the unmasked rule with the ratio at 1.
  plain = make(0.01, wd=0.01, skip=None)
  masked_only = make(0.01, wd=0.01, skip=lambda p: jax.tree.map(lambda _: True, p))
  _, updates_all_skipped, _ = _run(masked_only, params, steps=2)
  for k in ("fc1_bias", "bn_gamma"):
    np.testing.assert_array_equal(updates[k], updates_all_skipped[k])
  _, updates_plain, _ = _run(plain, params, steps=2)
  assert not np.allclose(updates["fc1_bias"], updates_plain["fc1_bias"])


@pytest.mark.parametrize("make", [lars_optax.lamb, lars_optax.lans], ids=["lamb", "lans"])
def test_trust_ratios_are_readable_under_jit(make):
  params = _params()
  tx = make(0.01, skip=lars_optax.by_ndim(1))
  state = tx.init(params)
  np.testing.assert_array_equal(lars_optax.trust_ratios(state), np.ones(3))

  @jax.jit
  def step(state):
    _, state = tx.update(_grads(0), state, params)
    return lars_optax.trust_ratios(state)

  vec = step(state)
  assert vec.shape == (3,) and vec.dtype == jnp.float32
  names = [n for n, _ in lars_optax.named_leaves(params)]
  assert [float(r) == 1.0 for r in vec] == [n != "fc1_weight" for n in names]


# (rtol 2e-5 below: 1 - 0.999**t is taken in float32, as MXNet and optax.scale_by_adam
# take it, which is 1.3e-5 off 0.001 at t = 1.)


def test_lamb_bounds_clip_the_weight_norm():
  # One step with g = 1 everywhere: Adam's direction is 1 / (1 + eps) per entry.
  w = jnp.full((4,), 3.0)  # ||w|| = 6
  params, grads = {"w": w}, {"w": jnp.ones(4)}
  u_norm = 2.0 / (1 + 1e-6)
  for lower, upper, r1 in [(None, None, 6.0), (None, 1.5, 1.5), (10.0, None, 10.0),
                           (1.0, 2.0, 2.0), (6.5, 7.0, 6.5)]:
    tx = lars_optax.lamb(1.0, lower_bound=lower, upper_bound=upper)
    _, state = tx.update(grads, tx.init(params), params)
    np.testing.assert_allclose(float(lars_optax.trust_ratios(state)[0]), r1 / u_norm,
                               rtol=2e-5)


def test_lamb_zero_layer_takes_the_plain_step_or_the_lower_bound():
  params = {"w": jnp.zeros((3, 2))}
  grads = {"w": jnp.full((3, 2), 0.5)}
  tx = lars_optax.lamb(0.1)
  updates, state = tx.update(grads, tx.init(params), params)
  assert float(lars_optax.trust_ratios(state)[0]) == 1.0  # ||w|| = 0: MXNet's 1
  np.testing.assert_allclose(updates["w"], -0.1 / (1 + 2e-6), rtol=2e-5)
  tx = lars_optax.lamb(0.1, lower_bound=0.3)
  _, state = tx.update(grads, tx.init(params), params)
  np.testing.assert_allclose(float(lars_optax.trust_ratios(state)[0]),
                             0.3 / (np.sqrt(6) / (1 + 2e-6)), rtol=2e-5)


@pytest.mark.op_by_op
@pytest.mark.parametrize("make", [lars_optax.lamb, lars_optax.lans], ids=["lamb", "lans"])
def test_all_zero_layer_and_gradient_stay_finite(make):
  """A zero-initialised layer with a zero gradient (MXNet's LANS gives NaN here)."""
  params = {"w": jnp.zeros((3, 2)), "v": jnp.ones((2,))}
  grads = {"w": jnp.zeros((3, 2)), "v": jnp.zeros((2,))}
  tx = make(0.1, wd=0.01, lower_bound=0.1)
  state = tx.init(params)
  for _ in range(2):
    updates, state = jax.jit(tx.update)(grads, state, params)
    params = optax.apply_updates(params, updates)
  chex.assert_tree_all_finite((params, updates, state))
  np.testing.assert_array_equal(params["w"], 0.0)


def _np_lans_step(w, g, m, v, t, lr, b1, b2, eps, wd):
  """One LANS step (MXNet's fused kernel) in float64 numpy."""
  n = np.linalg.norm(g)
  gh = g / n if n > 0 else np.zeros_like(g)
  m = b1 * m + (1 - b1) * gh
  v = b2 * v + (1 - b2) * gh * gh
  d = np.sqrt(v / (1 - b2**t)) + eps
  cm = (m / (1 - b1**t)) / d + wd * w
  cg = gh / d + wd * w
  r1 = np.linalg.norm(w)

  def ratio(c):
    r2 = np.linalg.norm(c)
    return 1.0 if r1 == 0 or r2 == 0 else r1 / r2

  return w - lr * (b1 * ratio(cm) * cm + (1 - b1) * ratio(cg) * cg), m, v


def test_lans_matches_the_rule_in_numpy_through_a_zero_gradient_step():
  params = {"w": jnp.asarray(np.random.default_rng(0).normal(size=(5, 3)), jnp.float32)}
  grads_seq = [_grads(0, params), {"w": jnp.zeros((5, 3))}, _grads(2, params)]
  tx = lars_optax.lans(0.05, beta1=0.8, beta2=0.99, epsilon=1e-3, wd=0.02)
  state, p = tx.init(params), params
  w = np.asarray(params["w"], np.float64)
  m, v = np.zeros_like(w), np.zeros_like(w)
  for t, grads in enumerate(grads_seq, start=1):
    updates, state = jax.jit(tx.update)(grads, state, p)
    p = optax.apply_updates(p, updates)
    w, m, v = _np_lans_step(w, np.asarray(grads["w"], np.float64), m, v, t, 0.05, 0.8,
                            0.99, 1e-3, 0.02)
    np.testing.assert_allclose(p["w"], w, rtol=1e-5, atol=1e-7)


@pytest.mark.op_by_op
def test_lans_rescale_grad_cancels():
  params = _params()
  a, _, _ = _run(lars_optax.lans(0.01, rescale_grad=1.0), params)
  b, _, _ = _run(lars_optax.lans(0.01, rescale_grad=0.125), params)
  chex.assert_trees_all_close(a, b, rtol=1e-6)


def test_lans_state_holds_both_ratios():
  params = _params()
  _, _, state = _run(lars_optax.lans(0.01, wd=0.01), params, steps=2)
  lans_state = _utils.find_state(state, lars_optax.ScaleByLansState)
  np.testing.assert_array_equal(lars_optax.trust_ratios(state), lans_state.trust_ratio)
  assert not np.allclose(lans_state.trust_ratio, lans_state.grad_trust_ratio)


def test_normalize_per_leaf_gives_unit_norms_and_keeps_zero_leaves():
  tx = lars_optax.normalize_per_leaf()
  updates = {"a": jnp.arange(6.0).reshape(2, 3), "b": jnp.zeros(3, jnp.bfloat16)}
  out, _ = tx.update(updates, tx.init(updates))
  np.testing.assert_allclose(float(jnp.linalg.norm(out["a"])), 1.0, rtol=1e-6)
  assert out["b"].dtype == jnp.bfloat16
  np.testing.assert_array_equal(out["b"], 0)


def test_lamb_ratio_falls_back_to_one_for_non_finite_norms():
  params = {"w": jnp.ones(3)}
  tx = lars_optax.scale_by_lamb_trust_ratio()
  _, state = tx.update({"w": jnp.array([1.0, jnp.inf, 0.0])}, tx.init(params), params)
  assert float(lars_optax.trust_ratios(state)[0]) == 1.0


@pytest.mark.parametrize("bias_correction", [True, False])
@pytest.mark.parametrize("name", ["lamb", "lans"])
def test_float16_without_master_weights_warns(name, bias_correction):
  params = {"fc1_weight": jnp.ones((2, 2), jnp.float16)}
  kwargs = {"bias_correction": bias_correction} if name == "lamb" else {}
  with pytest.warns(lars_optax.LowPrecisionWarning,
                    match="'fc1_weight' is float16 and there are no float32 master weights"):
    public(name)(**kwargs).init(params)
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    public(name)(multi_precision=True, **kwargs).init(params)
    public(name)(**kwargs).init({"w": jnp.ones(2, jnp.bfloat16)})


@pytest.mark.op_by_op
@pytest.mark.filterwarnings("ignore::lars_optax.LowPrecisionWarning")
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("make", [lars_optax.lamb, lars_optax.lans], ids=["lamb", "lans"])
def test_trust_ratios_are_float32_for_low_precision_params(make, dtype):
  params = {"w": jnp.ones((4, 4), dtype)}
  tx = make(0.01, multi_precision=False)
  _, state = tx.update({"w": jnp.ones((4, 4), dtype)}, tx.init(params), params)
  assert lars_optax.trust_ratios(state).dtype == jnp.float32


@pytest.mark.op_by_op
@pytest.mark.parametrize("make", [lars_optax.lamb, lars_optax.lans], ids=["lamb", "lans"])
def test_lr_mult_and_wd_mult_by_name(make):
  params = _params()
  base, _, _ = _run(make(0.01, wd=0.05), params, steps=1)
  out, _, _ = _run(make(0.01, wd=0.05, lr_mult={"fc1_bias": 0.0},
                        wd_mult={"fc1_weight": 0.0}), params, steps=1)
  np.testing.assert_array_equal(out["fc1_bias"], params["fc1_bias"])
  assert not np.allclose(out["fc1_weight"], base["fc1_weight"])
  np.testing.assert_allclose(out["bn_gamma"], base["bn_gamma"], rtol=1e-6)


@pytest.mark.op_by_op
@pytest.mark.parametrize("name", ["lamb", "lans"])
def test_create_builds_them_with_mxnet_arguments(name):
  params = _params()
  kwargs = {"learning_rate": 0.01, "wd": 0.01, "lower_bound": 0.1, "upper_bound": 5.0,
            "use_fused_step": True, "aggregate_num": 4}
  a, _, _ = _run(lars_optax.mxnet.create(name, **kwargs), params, steps=2)
  del kwargs["use_fused_step"], kwargs["aggregate_num"]
  b, _, _ = _run(public(name)(**kwargs), params, steps=2)
  chex.assert_trees_all_equal(a, b)


# --------------------------------------------------------------------------
# Sharded params: axis_name
# --------------------------------------------------------------------------

@pytest.mark.skipif(jax.device_count() < 4, reason="needs 4 devices (see conftest.py)")
@pytest.mark.parametrize("make", [
    lambda **kw: lars_optax.lamb(0.1, wd=1e-2, lower_bound=0.1, **kw),
    lambda **kw: lars_optax.lans(0.1, wd=1e-2, skip="mxnet", **kw),
], ids=["lamb", "lans"])
def test_shard_map_axis_name_equals_the_unsharded_step(make):
  params = {"fc1_weight": _params()["fc1_weight"].T, "fc1_bias": _params()["fc1_bias"]}
  grads = jax.tree.map(lambda p: 0.2 * p + 0.05, params)
  whole = make()
  expected, state = whole.update(grads, whole.init(params), params)
  split = make(axis_name="model")
  spec = {"fc1_weight": P(None, "model"), "fc1_bias": P("model")}
  mesh = Mesh(np.array(jax.devices()[:2]), ("model",))

  @jax.jit
  @functools.partial(jax.shard_map, mesh=mesh, in_specs=(spec, spec), out_specs=(spec, P()))
  def step(p, g):
    updates, s = split.update(g, split.init(p), p)
    return updates, lars_optax.trust_ratios(s)

  updates, ratios = step(params, grads)
  chex.assert_trees_all_close(updates, expected, rtol=1e-5, atol=1e-8)
  np.testing.assert_allclose(ratios, lars_optax.trust_ratios(state), rtol=1e-5)


@pytest.mark.op_by_op
@pytest.mark.parametrize("bias_correction", [True, False])
def test_lamb_epsilon_zero_on_zero_gradient_entries_is_a_zero_step(bias_correction):
  """MXNet's and optax's LAMB divide 0 by 0 there and put NaN into the weight."""
  params = {"w": jnp.ones((2, 3))}
  grads = {"w": jnp.array([[1.0, 0.0, -2.0], [0.0, 3.0, 0.5]])}
  tx = lars_optax.lamb(0.1, epsilon=0.0, bias_correction=bias_correction)
  updates, _ = jax.jit(tx.update)(grads, tx.init(params), params)
  chex.assert_tree_all_finite(updates)
  np.testing.assert_array_equal(updates["w"] == 0, grads["w"] == 0)
  theirs, _ = optax.lamb(0.1, eps=0.0).update(grads, optax.lamb(0.1, eps=0.0).init(params),
                                               params)
  assert not np.isfinite(np.asarray(theirs["w"])).all()
