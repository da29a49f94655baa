"""The Adam family (``lars_optax.mxnet._adam_family``): adam, scale_by_mxnet_adam and the relatives.

adamw, adamax, nadam, adabelief and ftml: the behaviours MXNet's numbers alone do not pin.

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
from conftest import mxnet_grads as _grads
from conftest import mxnet_params as _params
from conftest import mxnet_run as _run
from conftest import public

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
  a, _ = _step(lars_optax.mxnet.create(name, **kwargs), params, grads)
  b, _ = _step(public(name)(**kwargs), params, grads)
  chex.assert_trees_all_equal(a, b)


def test_moments_then_bias_correction_is_scale_by_mxnet_adam():
  params = {"w": jnp.linspace(-1.0, 1.0, 6)}
  chain = optax.chain(lars_optax.mxnet.scale_by_adam_moments(0.8, b2=0.95, eps=1e-3),
                      lars_optax.mxnet.scale_by_bias_correction(0.8, b2=0.95, initial_count=4))
  ref = lars_optax.mxnet.scale_by_mxnet_adam(0.8, b2=0.95, eps=1e-3, initial_count=4)
  s1, s2 = chain.init(params), ref.init(params)
  for k in range(3):
    grads = {"w": jnp.sin(jnp.arange(6.0) + k)}
    u1, s1 = chain.update(grads, s1, params)
    u2, s2 = ref.update(grads, s2, params)
    chex.assert_trees_all_close(u1, u2, rtol=1e-6)


def test_bias_correction_counts_from_initial_count():
  tx = lars_optax.mxnet.scale_by_bias_correction(0.9, b2=0.999, initial_count=9)
  u, state = _step(tx, {"w": jnp.ones(2)}, {"w": jnp.ones(2)})
  np.testing.assert_allclose(u["w"], math.sqrt(1 - 0.999**10) / (1 - 0.9**10), rtol=1e-6)
  assert int(state.count) == 1


def test_bias_correction_without_b2_is_one_over_one_minus_b1_pow_t():
  tx = lars_optax.mxnet.scale_by_bias_correction(0.9, b2=None)
  u, _ = _step(tx, {"w": jnp.ones(2)}, {"w": jnp.ones(2)})
  np.testing.assert_allclose(u["w"], 1 / (1 - 0.9), rtol=1e-6)


@pytest.mark.parametrize("correct_bias", [True, False])
def test_adamw_decay_is_decoupled_and_scaled_by_the_bias_corrected_rate(correct_bias):
  # A zero gradient leaves m = 0: the whole step is the decay, -eta_t * wd * w.
  lr, wd, b1, b2 = 0.1, 0.5, 0.9, 0.99
  w = jnp.array([2.0, -4.0])
  tx = lars_optax.mxnet.adamw(lr, beta1=b1, beta2=b2, wd=wd, correct_bias=correct_bias)
  u, _ = _step(tx, {"w": w}, {"w": jnp.zeros(2)})
  eta = lr * (math.sqrt(1 - b2) / (1 - b1) if correct_bias else 1.0)
  np.testing.assert_allclose(u["w"], -eta * wd * np.asarray(w), rtol=1e-6)


def test_adamw_weight_decay_never_enters_the_moments():
  tx = lars_optax.mxnet.adamw(0.1, wd=0.5)
  params = {"w": jnp.array([2.0, -4.0])}
  _, state = _step(tx, params, {"w": jnp.zeros(2)})
  chex.assert_trees_all_equal(optax.tree_utils.tree_get(state, "mu"), {"w": jnp.zeros(2)})


def test_adamw_wd_mult_and_lr_mult_multiply_the_decay():
  w = {"a": jnp.array([1.0]), "b": jnp.array([1.0])}
  tx = lars_optax.mxnet.adamw(0.1, wd=0.5, correct_bias=False, lr_mult={"a": 2.0},
                        wd_mult={"b": 3.0})
  u, _ = _step(tx, w, {"a": jnp.zeros(1), "b": jnp.zeros(1)})
  np.testing.assert_allclose([u["a"][0], u["b"][0]], [-0.1 * 2 * 0.5, -0.1 * 0.5 * 3], rtol=1e-6)


def test_adamax_adds_epsilon_after_the_maximum():
  # optax.scale_by_adamax would give m / max(b2 v, |g| + eps); MXNet: m / (max(b2 v, |g|) + eps).
  b1, eps = 0.9, 0.5
  tx = lars_optax.mxnet.scale_by_mxnet_adamax(b1, b2=0.999, eps=eps)
  u, _ = _step(tx, {"w": jnp.ones(1)}, {"w": jnp.array([2.0])})
  np.testing.assert_allclose(u["w"], (1 - b1) * 2.0 / (2.0 + eps), rtol=1e-6)


@pytest.mark.parametrize("name", ["adamw", "adamax", "nadam", "adabelief"])
def test_zero_gradient_with_zero_epsilon_gives_a_zero_step_not_nan(name):
  tx = public(name)(0.1, epsilon=0.0)
  params = {"w": jnp.ones(3)}
  with jax.debug_nans(True):
    u, _ = _step(tx, params, {"w": jnp.zeros(3)})
  chex.assert_trees_all_equal(u, {"w": jnp.zeros(3)})


def test_adabelief_adds_weight_decay_before_clipping():
  # g = 0, wd * w = 10 is clipped to 0.5: m = (1 - b1) * 0.5.
  tx = lars_optax.mxnet.adabelief(0.1, wd=1.0, clip_gradient=0.5)
  _, state = _step(tx, {"w": jnp.array([10.0])}, {"w": jnp.zeros(1)})
  np.testing.assert_allclose(optax.tree_utils.tree_get(state, "mu")["w"], [0.05], rtol=1e-6)


def test_adabelief_deviation_is_from_the_new_mean_and_epsilon_enters_twice():
  b1, b2, eps, g = 0.9, 0.99, 1e-3, 2.0
  tx = lars_optax.mxnet.scale_by_mxnet_belief(b1, b2=b2, eps=eps)
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
  tx = lars_optax.mxnet.scale_by_mxnet_nadam(b1, schedule_decay=psi, initial_count=begin)
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
  tx = lars_optax.mxnet.nadam(0.01)
  s1, s3 = tx.init(one), tx.init(three)
  for k in range(3):
    g = {"w": jnp.array([0.5, -1.0]) * (k + 1), "x": jnp.ones(4), "y": jnp.ones(1)}
    u1, s1 = tx.update({"w": g["w"]}, s1, one)
    u3, s3 = tx.update(g, s3, three)
    chex.assert_trees_all_close(u1["w"], u3["w"], rtol=1e-6)


def test_nadam_first_step_matches_the_formula():
  b1, b2, eps, psi, g = 0.9, 0.999, 1e-8, 0.004, 0.3
  tx = lars_optax.mxnet.scale_by_mxnet_nadam(b1, b2=b2, eps=eps, schedule_decay=psi)
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
  tx = lars_optax.mxnet.ftml(lr, beta1=b1, beta2=b2, epsilon=eps)
  params = {"w": jnp.array([1.5], jnp.float32)}
  state = tx.init(params)
  for g in grads:
    u, state = tx.update({"w": jnp.array([g], jnp.float32)}, state, params)
    params = optax.apply_updates(params, u)
  np.testing.assert_allclose(params["w"], [_ftml_ref(lr, b1, b2, eps, 1.5, grads)], rtol=1e-5)


def test_ftml_lr_mult_enters_d():
  base = lars_optax.mxnet.ftml(0.02)
  mult = lars_optax.mxnet.ftml(0.01, lr_mult={"w": 2.0})
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

  tx = lars_optax.mxnet.ftml(sched)
  params = {"w": jnp.ones(2)}
  state = tx.init(params)
  for _ in range(2):
    _, state = tx.update({"w": jnp.ones(2)}, state, params)
  assert [int(n) for n in seen] == [0, 1]


def test_ftml_with_zero_epsilon_and_no_gradient_leaves_the_weight():
  tx = lars_optax.mxnet.ftml(0.01, epsilon=0.0)
  with jax.debug_nans(True):
    u, _ = _step(tx, {"w": jnp.ones(2)}, {"w": jnp.zeros(2)})
  chex.assert_trees_all_equal(u, {"w": jnp.zeros(2)})


def test_ftml_update_needs_params():
  tx = lars_optax.mxnet.scale_by_ftml(0.01)
  with pytest.raises(ValueError, match=r"^scale_by_ftml: params are required; call update"):
    tx.update({"w": jnp.ones(1)}, tx.init({"w": jnp.ones(1)}))


@pytest.mark.parametrize("name", ["adamw", "nadam", "adabelief", "ftml"])
def test_float16_without_master_weights_warns(name):
  with pytest.warns(lars_optax.LowPrecisionWarning, match="float16"):
    public(name)().init({"w": jnp.ones(2, jnp.float16)})


def test_adamax_on_float16_does_not_warn():
  # Its second buffer is max |g|, not a square: nothing underflows early.
  with warnings.catch_warnings():
    warnings.simplefilter("error", lars_optax.LowPrecisionWarning)
    lars_optax.mxnet.adamax().init({"w": jnp.ones(2, jnp.float16)})


# --------------------------------------------------------------------------
# adam (mx.optimizer.Adam)
# --------------------------------------------------------------------------


def test_adam_by_hand_with_begin_num_update():
  lr, b1, b2, eps, wd, t0 = 0.01, 0.8, 0.99, 1e-6, 1e-2, 4
  tx = lars_optax.mxnet.adam(lr, beta1=b1, beta2=b2, epsilon=eps, wd=wd, begin_num_update=t0)
  p = _params()
  state = tx.init(p)
  m = dict.fromkeys(p, 0.0)
  v = dict(m)
  w = {k: np.asarray(x, np.float64) for k, x in p.items()}
  for step in range(1, 4):
    g = _grads(scale=float(step))
    updates, state = tx.update(g, state, p)
    p = optax.apply_updates(p, updates)
    t = t0 + step
    for k in w:
      u = np.asarray(g[k], np.float64) + wd * w[k]
      m[k] = b1 * m[k] + (1 - b1) * u
      v[k] = b2 * v[k] + (1 - b2) * u * u
      w[k] = w[k] - lr * np.sqrt(1 - b2**t) / (1 - b1**t) * m[k] / (np.sqrt(v[k]) + eps)
      np.testing.assert_allclose(p[k], w[k], rtol=1e-6)


def test_adam_with_inject_hyperparams():
  tx = optax.inject_hyperparams(lars_optax.mxnet.adam)(learning_rate=0.01, beta1=0.8, wd=0.01)
  a, state = _run(tx)
  b, _ = _run(lars_optax.mxnet.adam(0.01, beta1=0.8, wd=0.01))
  chex.assert_trees_all_close(a, b, rtol=1e-5)
  assert float(state.hyperparams["beta1"]) == pytest.approx(0.8)


@pytest.mark.parametrize("epsilon", [0, 0.0, np.float32(0)], ids=["int", "float", "np_float32"])
def test_adam_epsilon_zero_gives_a_zero_step_for_an_entry_whose_gradient_was_always_zero(
    epsilon):
  params = {"w": jnp.array([1.0, 2.0, 3.0])}
  tx = lars_optax.mxnet.adam(0.1, epsilon=epsilon)
  state = tx.init(params)
  for _ in range(2):
    updates, state = tx.update({"w": jnp.array([0.0, 0.5, -0.5])}, state, params)
    np.testing.assert_array_equal(np.asarray(updates["w"])[0], 0.0)
    np.testing.assert_allclose(np.asarray(updates["w"])[1:], [-0.1, 0.1], rtol=1e-5)


@pytest.mark.parametrize("make", [
    lambda: lars_optax.mxnet.adam(0.01),
    lambda: lars_optax.mxnet.adam(0.01, lazy_update=True),
    lambda: lars_optax.mxnet.create("adam"),
    lambda: lars_optax.mxnet.scale_by_mxnet_adam(),
], ids=["adam", "adam_lazy", "create_adam", "scale_by_mxnet_adam"])
def test_float16_adam_without_multi_precision_warns_once_at_init(make):
  params = {"w": jnp.ones((2, 2), jnp.float16), "b": jnp.ones(2, jnp.float16)}
  tx = make()
  with pytest.warns(lars_optax.LowPrecisionWarning, match="is float16 and there are no "
                    "float32 master weights.*multi_precision=True") as record:
    state = tx.init(params)
  assert len(record) == 1
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    tx.update(jax.tree.map(jnp.ones_like, params), state, params)  # update: no warning


@pytest.mark.parametrize("make, dtype", [
    (lambda: lars_optax.mxnet.adam(0.01, multi_precision=True), jnp.float16),
    (lambda: lars_optax.mxnet.create("adam", multi_precision=True), jnp.float16),
    (lambda: lars_optax.mxnet.adam(0.01), jnp.bfloat16),
    (lambda: lars_optax.mxnet.adam(0.01), jnp.float32),
    (lambda: lars_optax.mxnet.sgd(0.1, momentum=0.9), jnp.float16),
], ids=["multi_precision", "create_multi_precision", "bfloat16", "float32", "sgd"])
def test_no_low_precision_warning_where_adam_is_safe(make, dtype):
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    make().init({"w": jnp.ones(2, dtype)})


# --------------------------------------------------------------------------
# scale_by_mxnet_adam
# --------------------------------------------------------------------------


def _np_mxnet_adam(grads, b1, b2, eps, t0=0):
  m = v = 0.0
  out = []
  for t, g in enumerate(grads, start=t0 + 1):
    g = np.asarray(g, np.float64)
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    out.append(np.sqrt(1 - b2**t) / (1 - b1**t) * m / (np.sqrt(v) + eps))
  return out


@pytest.mark.parametrize("b1, b2, eps, t0", [(0.9, 0.999, 1e-8, 0), (0.8, 0.99, 1e-3, 0),
                                             (0.9, 0.999, 1e-8, 7), (0.0, 0.5, 0.0, 0)])
def test_scale_by_mxnet_adam_formula(b1, b2, eps, t0):
  rng = np.random.default_rng(0)
  grads = [rng.normal(size=4).astype(np.float32) * 10.0**-k for k in range(6)]
  tx = lars_optax.mxnet.scale_by_mxnet_adam(b1, b2=b2, eps=eps, initial_count=t0)
  state = tx.init(jnp.zeros(4))
  update = jax.jit(tx.update)
  for g, exp in zip(grads, _np_mxnet_adam(grads, b1, b2, eps, t0)):
    out, state = update(jnp.asarray(g), state)
    np.testing.assert_allclose(out, exp, rtol=2e-6)


def test_scale_by_mxnet_adam_equals_optax_adam_without_epsilon():
  rng = np.random.default_rng(1)
  ours, theirs = lars_optax.mxnet.scale_by_mxnet_adam(eps=0.0), optax.scale_by_adam(eps=0.0)
  s1, s2 = ours.init(jnp.zeros(5)), theirs.init(jnp.zeros(5))
  for _ in range(5):
    g = jnp.asarray(rng.normal(size=5), jnp.float32)
    u1, s1 = ours.update(g, s1)
    u2, s2 = theirs.update(g, s2)
    # optax forms 1 - 0.999**t directly in float32 (off by up to ~1e-5).
    np.testing.assert_allclose(u1, u2, rtol=3e-5)


def test_scale_by_mxnet_adam_epsilon_placement_differs_from_optax():
  g = jnp.full(3, 1e-7)  # sqrt(v) comparable to eps: the placements differ
  u1, _ = lars_optax.mxnet.scale_by_mxnet_adam().update(g,
                                                        lars_optax.mxnet.scale_by_mxnet_adam().init(g))
  u2, _ = optax.scale_by_adam().update(g, optax.scale_by_adam().init(g))
  # ours: (1e-7 * 0.1) * sqrt(1e-3) / 0.1 / (sqrt(1e-3) * 1e-7 + 1e-8)
  np.testing.assert_allclose(u1, 1e-7 / (1e-7 + 1e-8 / np.sqrt(1e-3)), rtol=1e-5)
  np.testing.assert_allclose(u2, 1e-7 / (1e-7 + 1e-8), rtol=1e-5)


@pytest.mark.filterwarnings("ignore::lars_optax.LowPrecisionWarning")  # float16 Adam
@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_scale_by_mxnet_adam_low_precision_zero_gradient_is_not_nan(dtype):
  tx = lars_optax.mxnet.scale_by_mxnet_adam()  # eps=1e-8 is 0 in float16
  g = jnp.zeros(3, dtype)
  out, state = tx.update(g, tx.init(g))
  assert out.dtype == dtype and state.mu.dtype == dtype
  np.testing.assert_array_equal(out, 0)


@pytest.mark.parametrize("kwargs, match", [
    ({"b1": 1.0}, "b1: must be in"), ({"b2": -0.5}, "b2: must be in"),
    ({"eps": -1.0}, "eps: must be >= 0"), ({"initial_count": -1}, "initial_count"),
    ({"initial_count": 2.5}, "initial_count")])
def test_scale_by_mxnet_adam_bad_input(kwargs, match):
  with pytest.raises(ValueError, match=match):
    lars_optax.mxnet.scale_by_mxnet_adam(**kwargs)


@pytest.mark.op_by_op
def test_scale_by_mxnet_adam_float64_bias_correction_is_float64():
  from conftest import x64  # pylint: disable=g-import-not-at-top
  with x64():
    rng = np.random.default_rng(2)
    grads = [rng.normal(size=4) for _ in range(5)]
    tx = lars_optax.mxnet.scale_by_mxnet_adam()
    state = tx.init(jnp.zeros(4, jnp.float64))
    for g, exp in zip(grads, _np_mxnet_adam(grads, 0.9, 0.999, 1e-8)):
      out, state = tx.update(jnp.asarray(g, jnp.float64), state)
      assert out.dtype == jnp.float64
      np.testing.assert_allclose(out, exp, rtol=1e-12)


# --------------------------------------------------------------------------
# lazy_update=True on a dense gradient (where it departs from MXNet: docs/porting.md)
# --------------------------------------------------------------------------


@pytest.mark.op_by_op
def test_adam_lazy_update_on_a_dense_gradient_skips_all_zero_rows_unlike_mxnet():
  """MXNet is lazy only for row_sparse gradients: on a dense one, Adam(lazy_update=True)
  is its standard update (lazy_update=False here). Here a dense gradient's all-zero
  rows are absent: their weight and moments stay, as in MXNet's row_sparse update
  that lists the other rows. A row with any non-zero entry gets the full update."""
  from jax.experimental.sparse import BCOO

  lr, b1, b2 = 0.1, 0.9, 0.999
  params = {"emb": jnp.ones((3, 2))}
  second = jnp.array([[1.0, 1.0], [0.0, 0.0], [1.0, 0.0]])  # row 1 all zero
  grads = [jnp.ones((3, 2)), second]

  def run(tx, grads):
    p, state = params, tx.init(params)
    for g in grads:
      updates, state = tx.update({"emb": g}, state, p)
      p = optax.apply_updates(p, updates)
    return np.asarray(p["emb"]), state

  lazy, _ = run(lars_optax.mxnet.adam(lr, lazy_update=True), grads)
  dense, _ = run(lars_optax.mxnet.adam(lr), grads)
  # Both: Adam's first step is -lr (up to epsilon). At step 2, MXNet's dense rule
  # moves row 1 by its decayed first moment: lr * sqrt(1 - b2**2) / (1 - b1**2) *
  # (b1 (1 - b1)) / sqrt(b2 (1 - b2)).
  moved = 1 - lr - lr * math.sqrt(1 - b2**2) / (1 - b1**2) * (b1 * (1 - b1)) / math.sqrt(
      b2 * (1 - b2))
  np.testing.assert_allclose(dense[1], moved, rtol=1e-5)     # 0.833: MXNet's dense numbers
  np.testing.assert_allclose(lazy[1], 1 - lr, rtol=1e-6)     # 0.9: the row is skipped
  np.testing.assert_allclose(lazy[[0, 2]], dense[[0, 2]], rtol=1e-6)  # present rows agree
  assert lazy[2, 1] == dense[2, 1] != lazy[0, 1]  # a zero entry in a present row updates
  # The dense lazy path equals the row-sparse one that lists the non-zero rows.
  bcoo = BCOO((second[jnp.array([0, 2])], jnp.array([[0], [2]])), shape=(3, 2))
  sparse, _ = run(lars_optax.mxnet.adam(lr, lazy_update=True), [grads[0], bcoo])
  np.testing.assert_allclose(sparse, lazy, rtol=1e-6)
