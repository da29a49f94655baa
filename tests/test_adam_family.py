"""adamw, adamax, nadam, adabelief and ftml: the behaviours MXNet's numbers alone do not pin.

The numbers themselves are checked against MXNet 2.0.0b1 in
``test_reference_mxnet_registry.py``; here each test states one rule of the
chains (where weight decay and epsilon enter, what the state holds) on small
trees, against the formula written out in float64.
"""

import math
import warnings

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lars_optax

NAMES = ["adamw", "adamax", "nadam", "adabelief", "ftml"]


def _step(tx, params, grads, state=None):
  state = tx.init(params) if state is None else state
  updates, state = tx.update(grads, state, params)
  return updates, state


@pytest.mark.parametrize("name", NAMES)
def test_create_builds_the_same_chain_as_the_constructor(name):
  kwargs = {"learning_rate": 0.01, "beta1": 0.8, "wd": 0.01, "clip_gradient": 0.5}
  params = {"w": jnp.array([1.0, -2.0, 3.0]), "b": jnp.array([0.5])}
  grads = {"w": jnp.array([0.3, -0.2, 0.9]), "b": jnp.array([-1.0])}
  a, _ = _step(lars_optax.create(name, **kwargs), params, grads)
  b, _ = _step(getattr(lars_optax, name)(**kwargs), params, grads)
  chex.assert_trees_all_equal(a, b)


def test_moments_then_bias_correction_is_scale_by_mxnet_adam():
  params = {"w": jnp.linspace(-1.0, 1.0, 6)}
  chain = optax.chain(lars_optax.scale_by_adam_moments(0.8, 0.95, 1e-3),
                      lars_optax.scale_by_bias_correction(0.8, 0.95, initial_count=4))
  ref = lars_optax.scale_by_mxnet_adam(0.8, 0.95, 1e-3, initial_count=4)
  s1, s2 = chain.init(params), ref.init(params)
  for k in range(3):
    grads = {"w": jnp.sin(jnp.arange(6.0) + k)}
    u1, s1 = chain.update(grads, s1, params)
    u2, s2 = ref.update(grads, s2, params)
    chex.assert_trees_all_close(u1, u2, rtol=1e-6)


def test_bias_correction_counts_from_initial_count():
  tx = lars_optax.scale_by_bias_correction(0.9, 0.999, initial_count=9)
  u, state = _step(tx, {"w": jnp.ones(2)}, {"w": jnp.ones(2)})
  np.testing.assert_allclose(u["w"], math.sqrt(1 - 0.999**10) / (1 - 0.9**10), rtol=1e-6)
  assert int(state.count) == 1


def test_bias_correction_without_b2_is_one_over_one_minus_b1_pow_t():
  tx = lars_optax.scale_by_bias_correction(0.9, None)
  u, _ = _step(tx, {"w": jnp.ones(2)}, {"w": jnp.ones(2)})
  np.testing.assert_allclose(u["w"], 1 / (1 - 0.9), rtol=1e-6)


@pytest.mark.parametrize("correct_bias", [True, False])
def test_adamw_decay_is_decoupled_and_scaled_by_the_bias_corrected_rate(correct_bias):
  # A zero gradient leaves m = 0: the whole step is the decay, -eta_t * wd * w.
  lr, wd, b1, b2 = 0.1, 0.5, 0.9, 0.99
  w = jnp.array([2.0, -4.0])
  tx = lars_optax.adamw(lr, b1, b2, wd=wd, correct_bias=correct_bias)
  u, _ = _step(tx, {"w": w}, {"w": jnp.zeros(2)})
  eta = lr * (math.sqrt(1 - b2) / (1 - b1) if correct_bias else 1.0)
  np.testing.assert_allclose(u["w"], -eta * wd * np.asarray(w), rtol=1e-6)


def test_adamw_weight_decay_never_enters_the_moments():
  tx = lars_optax.adamw(0.1, wd=0.5)
  params = {"w": jnp.array([2.0, -4.0])}
  _, state = _step(tx, params, {"w": jnp.zeros(2)})
  chex.assert_trees_all_equal(optax.tree_utils.tree_get(state, "mu"), {"w": jnp.zeros(2)})


def test_adamw_wd_mult_and_lr_mult_multiply_the_decay():
  w = {"a": jnp.array([1.0]), "b": jnp.array([1.0])}
  tx = lars_optax.adamw(0.1, wd=0.5, correct_bias=False, lr_mult={"a": 2.0},
                        wd_mult={"b": 3.0})
  u, _ = _step(tx, w, {"a": jnp.zeros(1), "b": jnp.zeros(1)})
  np.testing.assert_allclose([u["a"][0], u["b"][0]], [-0.1 * 2 * 0.5, -0.1 * 0.5 * 3], rtol=1e-6)


def test_adamax_adds_epsilon_after_the_maximum():
  # optax.scale_by_adamax would give m / max(b2 v, |g| + eps); MXNet: m / (max(b2 v, |g|) + eps).
  b1, eps = 0.9, 0.5
  tx = lars_optax.scale_by_mxnet_adamax(b1, 0.999, eps)
  u, _ = _step(tx, {"w": jnp.ones(1)}, {"w": jnp.array([2.0])})
  np.testing.assert_allclose(u["w"], (1 - b1) * 2.0 / (2.0 + eps), rtol=1e-6)


@pytest.mark.parametrize("name", ["adamw", "adamax", "nadam", "adabelief"])
def test_zero_gradient_with_zero_epsilon_gives_a_zero_step_not_nan(name):
  tx = getattr(lars_optax, name)(0.1, epsilon=0.0)
  params = {"w": jnp.ones(3)}
  with jax.debug_nans(True):
    u, _ = _step(tx, params, {"w": jnp.zeros(3)})
  chex.assert_trees_all_equal(u, {"w": jnp.zeros(3)})


def test_adabelief_adds_weight_decay_before_clipping():
  # g = 0, wd * w = 10 is clipped to 0.5: m = (1 - b1) * 0.5.
  tx = lars_optax.adabelief(0.1, wd=1.0, clip_gradient=0.5)
  _, state = _step(tx, {"w": jnp.array([10.0])}, {"w": jnp.zeros(1)})
  np.testing.assert_allclose(optax.tree_utils.tree_get(state, "mu")["w"], [0.05], rtol=1e-6)


def test_adabelief_deviation_is_from_the_new_mean_and_epsilon_enters_twice():
  b1, b2, eps, g = 0.9, 0.99, 1e-3, 2.0
  tx = lars_optax.scale_by_mxnet_belief(b1, b2, eps)
  u, state = _step(tx, {"w": jnp.ones(1)}, {"w": jnp.array([g])})
  m = (1 - b1) * g
  s = (1 - b2) * (g - m) ** 2 + eps
  np.testing.assert_allclose(state.nu["w"], [s], rtol=1e-6)
  np.testing.assert_allclose(u["w"], [m / (math.sqrt(s) + eps)], rtol=1e-6)


def _mu(t, b1, psi):
  return b1 * (1 - 0.5 * 0.96 ** (t * psi))


@pytest.mark.parametrize("begin", [0, 7])
def test_nadam_keeps_the_momentum_schedule_product_per_step(begin):
  b1, psi = 0.9, 0.05
  tx = lars_optax.scale_by_mxnet_nadam(b1, schedule_decay=psi, initial_count=begin)
  params = {"w": jnp.ones(2)}
  state = tx.init(params)
  for _ in range(3):
    _, state = tx.update({"w": jnp.ones(2)}, state, params)
  expected = math.prod(_mu(t, b1, psi) for t in range(begin + 1, begin + 4))
  np.testing.assert_allclose(float(state.m_schedule), expected, rtol=1e-6)


def test_nadam_step_of_a_leaf_does_not_depend_on_the_other_leaves():
  # MXNet multiplies its schedule once per parameter; here one leaf or three give one step.
  one = {"w": jnp.array([1.0, 2.0])}
  three = {"w": one["w"], "x": jnp.ones(4), "y": jnp.ones(1)}
  tx = lars_optax.nadam(0.01)
  s1, s3 = tx.init(one), tx.init(three)
  for k in range(3):
    g = {"w": jnp.array([0.5, -1.0]) * (k + 1), "x": jnp.ones(4), "y": jnp.ones(1)}
    u1, s1 = tx.update({"w": g["w"]}, s1, one)
    u3, s3 = tx.update(g, s3, three)
    chex.assert_trees_all_close(u1["w"], u3["w"], rtol=1e-6)


def test_nadam_first_step_matches_the_formula():
  b1, b2, eps, psi, g = 0.9, 0.999, 1e-8, 0.004, 0.3
  tx = lars_optax.scale_by_mxnet_nadam(b1, b2, eps, psi)
  u, _ = _step(tx, {"w": jnp.ones(1)}, {"w": jnp.array([g])})
  mu1, mu2 = _mu(1, b1, psi), _mu(2, b1, psi)
  m, v = (1 - b1) * g, (1 - b2) * g * g
  num = mu2 * m / (1 - mu1 * mu2) + (1 - mu1) * g / (1 - mu1)
  np.testing.assert_allclose(u["w"], [num / (math.sqrt(v / (1 - b2)) + eps)], rtol=1e-5)


def _ftml_ref(lr, b1, b2, eps, w, grads):
  """FTML in float64, as the rule is written (w_t = -z_t / d_t)."""
  d = v = z = 0.0
  for t, g in enumerate(grads, 1):
    v = b2 * v + (1 - b2) * g * g
    d_new = (1 - b1**t) / lr * (math.sqrt(v / (1 - b2**t)) + eps)
    z = b1 * z + (1 - b1) * g - (d_new - b1 * d) * w
    d, w = d_new, -z / d_new
  return w


def test_ftml_sets_the_weight_to_minus_z_over_d():
  lr, b1, b2, eps = 0.05, 0.6, 0.99, 1e-4
  grads = [0.3, -1.2, 0.0, 0.7]
  tx = lars_optax.ftml(lr, b1, b2, eps)
  params = {"w": jnp.array([1.5], jnp.float32)}
  state = tx.init(params)
  for g in grads:
    u, state = tx.update({"w": jnp.array([g], jnp.float32)}, state, params)
    params = optax.apply_updates(params, u)
  np.testing.assert_allclose(params["w"], [_ftml_ref(lr, b1, b2, eps, 1.5, grads)], rtol=1e-5)


def test_ftml_lr_mult_enters_d():
  base = lars_optax.ftml(0.02)
  mult = lars_optax.ftml(0.01, lr_mult={"w": 2.0})
  params = {"w": jnp.array([1.0, -1.0])}
  sb, sm = base.init(params), mult.init(params)
  for k in range(3):
    g = {"w": jnp.array([0.2, 0.4]) * (k - 1)}
    ub, sb = base.update(g, sb, params)
    um, sm = mult.update(g, sm, params)
    chex.assert_trees_all_close(ub, um, rtol=1e-6)


def test_ftml_takes_a_schedule_called_with_the_update_count():
  seen = []

  def sched(n):
    seen.append(n)
    return 0.01 * (n + 1)

  tx = lars_optax.ftml(sched)
  params = {"w": jnp.ones(2)}
  state = tx.init(params)
  for _ in range(2):
    _, state = tx.update({"w": jnp.ones(2)}, state, params)
  assert [int(n) for n in seen] == [0, 1]


def test_ftml_with_zero_epsilon_and_no_gradient_leaves_the_weight():
  tx = lars_optax.ftml(0.01, epsilon=0.0)
  with jax.debug_nans(True):
    u, _ = _step(tx, {"w": jnp.ones(2)}, {"w": jnp.zeros(2)})
  chex.assert_trees_all_equal(u, {"w": jnp.zeros(2)})


def test_ftml_update_needs_params():
  tx = lars_optax.scale_by_ftml(0.01)
  with pytest.raises(ValueError, match=r"^scale_by_ftml: update needs params"):
    tx.update({"w": jnp.ones(1)}, tx.init({"w": jnp.ones(1)}))


@pytest.mark.parametrize("name", ["adamw", "nadam", "adabelief", "ftml"])
def test_float16_without_master_weights_warns(name):
  with pytest.warns(lars_optax.LowPrecisionWarning, match="float16"):
    getattr(lars_optax, name)().init({"w": jnp.ones(2, jnp.float16)})


def test_adamax_on_float16_does_not_warn():
  # Its second buffer is max |g|, not a square: nothing underflows early.
  with warnings.catch_warnings():
    warnings.simplefilter("error", lars_optax.LowPrecisionWarning)
    lars_optax.adamax().init({"w": jnp.ones(2, jnp.float16)})
