"""The SGD family: sgd, mxnet_momentum, nag, dcasgd and sgld (``lars_optax.mxnet._sgd_family``).

Their numbers against MXNet 2.0.0b1 are checked in
``test_reference_mxnet_registry.py`` (nag, dcasgd); here: what the reference
cases cannot show (scheduled learning rates, optax equivalences, the
transformations on their own).
"""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import mxnet_grads as _mxnet_grads
from conftest import mxnet_params as _mxnet_params
from conftest import mxnet_run as _mxnet_run

import lars_optax


def _params():
  rng = np.random.default_rng(0)
  return {"w": jnp.asarray(rng.normal(size=(4, 3)), jnp.float32),
          "b": jnp.asarray(rng.normal(size=(3,)), jnp.float32)}


def _grads(k):
  rng = np.random.default_rng(100 + k)
  return {"w": jnp.asarray(rng.normal(size=(4, 3)), jnp.float32),
          "b": jnp.asarray(rng.normal(size=(3,)), jnp.float32)}


def _run(tx, steps=5, params=None):
  params = _params() if params is None else params
  state = tx.init(params)
  step = jax.jit(tx.update)
  out = []
  for k in range(steps):
    updates, state = step(_grads(k), state, params)
    params = optax.apply_updates(params, updates)
    out.append(params)
  return out, state


# --------------------------------------------------------------------------
# nag
# --------------------------------------------------------------------------


def _nag_numpy(lrs, momentum, wd=0.0):
  """MXNet's NAG rule (nag_mom_update, the rate inside the buffer), in float64."""
  params = {k: np.asarray(x, np.float64) for k, x in _params().items()}
  mom = {k: np.zeros_like(x) for k, x in params.items()}
  out = []
  for k, lr in enumerate(lrs):
    for name, g in _grads(k).items():
      u = np.asarray(g, np.float64) + wd * params[name]
      mom[name] = momentum * mom[name] - lr * u
      params[name] = params[name] + momentum * mom[name] - lr * u
    out.append(dict(params))
  return out


def test_nag_scheduled_rate_sits_inside_the_momentum():
  lrs = [0.3, 0.1, 0.05, 0.2, 0.01]
  schedule = lambda count: jnp.asarray(lrs)[count]
  out, _ = _run(lars_optax.mxnet.nag(schedule, momentum=0.9, wd=1e-2))
  for ours, ref in zip(out, _nag_numpy(lrs, 0.9, wd=1e-2)):
    chex.assert_trees_all_close(ours, ref, rtol=1e-5, atol=1e-6)


def test_nag_with_a_constant_rate_equals_optax_sgd_nesterov():
  ours, _ = _run(lars_optax.mxnet.nag(0.1, momentum=0.9))
  theirs, _ = _run(optax.sgd(0.1, momentum=0.9, nesterov=True))
  chex.assert_trees_all_close(ours, theirs, rtol=1e-5, atol=1e-6)


def test_nag_without_momentum_is_sgd_and_keeps_no_buffer():
  ours, state = _run(lars_optax.mxnet.nag(0.1, momentum=0.0))
  theirs, _ = _run(optax.sgd(0.1))
  chex.assert_trees_all_close(ours, theirs, rtol=1e-6)
  assert optax.tree_utils.tree_get(state, "momentum") is None


def test_nag_buffer_is_mxnet_momentum_state():
  _, state = _run(lars_optax.mxnet.nag(0.1, momentum=0.9), steps=1)
  found = optax.tree_utils.tree_get(state, "MXNetMomentumState")
  assert isinstance(found, lars_optax.MXNetMomentumState)
  chex.assert_trees_all_equal_shapes(found.momentum, _params())


def test_mxnet_momentum_nesterov_update_looks_one_step_ahead():
  tx = lars_optax.mxnet_momentum(0.5, momentum=0.9, nesterov=True)
  params = {"w": jnp.zeros(2)}
  state = tx.init(params)
  g = {"w": jnp.array([1.0, -2.0])}
  u1, state = tx.update(g, state)
  # m1 = -0.5 g, update = 0.9 m1 - 0.5 g = -0.95 g
  np.testing.assert_allclose(u1["w"], -0.95 * g["w"], rtol=1e-6)
  u2, state = tx.update(g, state)
  # m2 = 0.9 m1 - 0.5 g = -0.95 g, update = 0.9 m2 - 0.5 g = -1.355 g
  np.testing.assert_allclose(state.momentum["w"], -0.95 * g["w"], rtol=1e-6)
  np.testing.assert_allclose(u2["w"], -1.355 * g["w"], rtol=1e-6)


@pytest.mark.parametrize("name", ["nag", "NAG"])
def test_nag_by_name(name):
  ours, _ = _run(lars_optax.mxnet.create(name, learning_rate=0.1, momentum=0.8, wd=1e-3,
                                   lr_mult={"w": 0.5}))
  theirs, _ = _run(lars_optax.mxnet.nag(0.1, momentum=0.8, wd=1e-3, lr_mult={"w": 0.5}))
  chex.assert_trees_all_equal(ours, theirs)


# --------------------------------------------------------------------------
# dcasgd
# --------------------------------------------------------------------------


def test_add_delay_compensation_adds_lamda_g_squared_times_the_weight_change():
  tx = lars_optax.mxnet.add_delay_compensation(0.5)
  w0 = {"w": jnp.array([1.0, 2.0, -1.0])}
  state = tx.init(w0)
  g = {"w": jnp.array([2.0, -1.0, 0.5])}
  out, state = tx.update(g, state, w0)  # the first step: no weight change yet
  chex.assert_trees_all_equal(out, g)
  w1 = {"w": jnp.array([0.5, 2.5, -1.0])}
  out, state = tx.update(g, state, w1)
  expected = g["w"] + 0.5 * g["w"] ** 2 * (w1["w"] - w0["w"])
  np.testing.assert_allclose(out["w"], expected, rtol=1e-6)
  chex.assert_trees_all_equal(state.previous_params, w1)


def test_add_delay_compensation_state_is_a_copy_of_the_params():
  params = {"w": jnp.ones(3)}
  state = lars_optax.mxnet.add_delay_compensation().init(params)
  assert state.previous_params["w"] is not params["w"]
  chex.assert_trees_all_equal(state.previous_params, params)


def test_add_delay_compensation_needs_params():
  tx = lars_optax.mxnet.add_delay_compensation()
  params = {"w": jnp.ones(3)}
  with pytest.raises(ValueError, match=r"^add_delay_compensation: params are required"):
    tx.update(params, tx.init(params))


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_dcasgd_with_lamda_zero_is_mxnet_sgd(momentum):
  ours, _ = _run(lars_optax.mxnet.dcasgd(0.1, momentum=momentum, lamda=0.0, wd=1e-2))
  theirs, _ = _run(lars_optax.mxnet.sgd(0.1, momentum=momentum, wd=1e-2))
  chex.assert_trees_all_close(ours, theirs, rtol=1e-6)


def _dcasgd_numpy(lrs, momentum, lamda):
  """MXNet's DCASGD step (mxnet.optimizer.DCASGD.step), in float64."""
  params = {k: np.asarray(x, np.float64) for k, x in _params().items()}
  prev = dict(params)
  mom = {k: np.zeros_like(x) for k, x in params.items()}
  out = []
  for k, lr in enumerate(lrs):
    for name, g in _grads(k).items():
      g = np.asarray(g, np.float64)
      d = g + lamda * g * g * (params[name] - prev[name])
      mom[name] = momentum * mom[name] - lr * d
      prev[name] = params[name]
      params[name] = params[name] + mom[name]
    out.append(dict(params))
  return out


def test_dcasgd_scheduled_rate_sits_inside_the_momentum():
  lrs = [0.3, 0.1, 0.05, 0.2, 0.01]
  schedule = lambda count: jnp.asarray(lrs)[count]
  out, _ = _run(lars_optax.mxnet.dcasgd(schedule, momentum=0.9, lamda=0.3))
  for ours, ref in zip(out, _dcasgd_numpy(lrs, 0.9, 0.3)):
    chex.assert_trees_all_close(ours, ref, rtol=1e-5, atol=1e-6)


def test_dcasgd_by_name_with_mxnet_defaults():
  ours, state = _run(lars_optax.mxnet.create("dcasgd"))
  theirs, _ = _run(lars_optax.mxnet.dcasgd(0.1, momentum=0.0, lamda=0.04))
  chex.assert_trees_all_equal(ours, theirs)
  assert optax.tree_utils.tree_get(state, "momentum") is None  # momentum=0: no buffer


# --------------------------------------------------------------------------
# sgld: checked by distribution (MXNet draws from its global random state)
# --------------------------------------------------------------------------
#
# The same statistics of MXNet 2.0.0b1's own SGLD (mx.optimizer.create("sgld"),
# zero gradients, wd=0, a leaf of 10**6 zeros, 4 steps: 4 * 10**6 draws) were
# measured once: lr=0.01: mean 5.4e-5 (1.1 standard errors), variance / lr
# 1.00015; lr=0.25: mean -1.4e-5 (0.06 standard errors), variance / lr 1.00085
# (5 standard errors: 0.0035); kurtosis 2.997 (normal: 3); with a gradient of 3
# and lr=0.01 the mean step was -0.01512 against -lr/2 * g = -0.015 (1.2
# standard errors). So MXNet's normal(0, sqrt(lr)) has variance lr, and its
# deterministic step is -lr/2 * g, as below.

N = 200_000  # draws per step; a few steps give 5-sigma bounds of about 1% on the variance
SIGMAS = 5.0


def _noise_steps(tx, steps, n=N, params=None, jit=True):
  """The per-step updates of ``tx`` on zero gradients, one leaf of ``n`` zeros."""
  params = {"w": jnp.zeros((n,), jnp.float32)} if params is None else params
  state = tx.init(params)
  step = jax.jit(tx.update) if jit else tx.update
  zeros = jax.tree.map(jnp.zeros_like, params)
  out = []
  for _ in range(steps):
    updates, state = step(zeros, state, params)
    out.append(updates)
  return out


def _assert_normal(x, variance):
  """``x`` has mean 0 and variance ``variance``, within SIGMAS standard errors."""
  x = np.asarray(x, np.float64).ravel()
  n = x.size
  assert abs(x.mean()) <= SIGMAS * np.sqrt(variance / n), (x.mean(), variance)
  # The sample variance of n normal draws has a standard error of variance * sqrt(2 / n).
  assert abs(x.var() / variance - 1) <= SIGMAS * np.sqrt(2 / n), x.var() / variance


@pytest.mark.parametrize("lr", [0.01, 0.25])
def test_sgld_noise_has_mean_zero_and_variance_the_learning_rate(lr):
  steps = _noise_steps(lars_optax.mxnet.sgld(lr, key=0), 4)
  _assert_normal(np.concatenate([np.asarray(u["w"]) for u in steps]), lr)


@pytest.mark.op_by_op
def test_sgld_noise_is_independent_between_steps_and_leaves():
  params = {"a": jnp.zeros((N,)), "b": jnp.zeros((N,))}
  steps = _noise_steps(lars_optax.mxnet.sgld(0.04, key=1), 2, params=params)
  pairs = [(steps[0]["a"], steps[1]["a"]), (steps[0]["a"], steps[0]["b"])]
  for x, y in pairs:
    corr = np.corrcoef(np.asarray(x), np.asarray(y))[0, 1]
    assert abs(corr) <= SIGMAS / np.sqrt(N), corr


def test_sgld_deterministic_part_is_minus_half_the_rate_times_the_gradient():
  # Same key, so the same noise: the difference of two runs is the gradient step alone.
  tx = lars_optax.mxnet.sgld(learning_rate=0.1, wd=0.05, rescale_grad=0.5, clip_gradient=0.4,
                       lr_mult={"w": 3.0}, wd_mult={"b": 0.0}, key=7)
  params = _params()
  state = tx.init(params)
  g = jax.tree.map(lambda x: 2.0 * x, _grads(0))
  with_grad, _ = tx.update(g, state, params)
  zero_grad, _ = tx.update(jax.tree.map(jnp.zeros_like, g), state, params)
  lrs = {"w": 0.1 * 3.0, "b": 0.1}
  wds = {"w": 0.05, "b": 0.0}
  for name in params:
    u = np.clip(0.5 * np.asarray(g[name]), -0.4, 0.4) + wds[name] * np.asarray(params[name])
    u0 = wds[name] * np.asarray(params[name])
    np.testing.assert_allclose(with_grad[name] - zero_grad[name],
                               -lrs[name] / 2 * (u - u0), rtol=1e-5, atol=1e-6)


@pytest.mark.op_by_op
def test_sgld_lr_mult_scales_the_noise_variance():
  params = {"fast": jnp.zeros((N,)), "slow": jnp.zeros((N,))}
  tx = lars_optax.mxnet.sgld(0.01, lr_mult={"fast": 4.0, "slow": 0.25}, key=2)
  (u,) = _noise_steps(tx, 1, params=params)
  _assert_normal(u["fast"], 0.04)
  _assert_normal(u["slow"], 0.0025)


@pytest.mark.op_by_op
def test_sgld_scheduled_rate_sets_each_steps_variance():
  lrs = [0.01, 0.25, 0.04]
  schedule = lambda count: jnp.asarray(lrs)[count]
  for u, lr in zip(_noise_steps(lars_optax.mxnet.sgld(schedule, key=3), 3), lrs):
    _assert_normal(u["w"], lr)


@pytest.mark.op_by_op
def test_sgld_under_inject_hyperparams_variance_follows_the_rate():
  tx = optax.inject_hyperparams(lars_optax.mxnet.sgld)(learning_rate=0.01)
  params = {"w": jnp.zeros((N,))}
  state = tx.init(params)
  step = jax.jit(tx.update)
  for lr in (0.01, 0.25):
    state.hyperparams["learning_rate"] = jnp.asarray(lr)
    updates, state = step({"w": jnp.zeros((N,))}, state, params)
    _assert_normal(updates["w"], lr)


def test_sgld_same_key_same_steps_different_key_different_steps():
  a = _noise_steps(lars_optax.mxnet.sgld(0.1, key=5), 2, n=100, jit=False)
  b = _noise_steps(lars_optax.mxnet.sgld(0.1, key=5), 2, n=100, jit=False)
  c = _noise_steps(lars_optax.mxnet.sgld(0.1, key=6), 2, n=100, jit=False)
  chex.assert_trees_all_equal(a, b)
  assert not np.allclose(a[0]["w"], c[0]["w"])
  assert not np.allclose(a[0]["w"], a[1]["w"])  # the key moves on every step


def test_sgld_int_seed_raw_key_and_typed_key_give_the_same_steps():
  by_seed = _noise_steps(lars_optax.mxnet.sgld(0.1, key=9), 2, n=50, jit=False)
  raw = _noise_steps(lars_optax.mxnet.sgld(0.1, key=jax.random.PRNGKey(9)), 2, n=50, jit=False)
  typed = _noise_steps(lars_optax.mxnet.sgld(0.1, key=jax.random.key(9)), 2, n=50, jit=False)
  chex.assert_trees_all_equal(by_seed, raw)
  chex.assert_trees_all_equal(by_seed, typed)


def test_sgld_jit_and_eager_give_the_same_steps():
  tx = lars_optax.mxnet.sgld(0.1, wd=1e-2, key=4)
  params = _params()
  state_j = state_e = tx.init(params)
  p_j = p_e = params
  for k in range(3):
    u, state_j = jax.jit(tx.update)(_grads(k), state_j, p_j)
    p_j = optax.apply_updates(p_j, u)
    u, state_e = tx.update(_grads(k), state_e, p_e)
    p_e = optax.apply_updates(p_e, u)
  chex.assert_trees_all_close(p_j, p_e, rtol=1e-6, atol=1e-7)
  chex.assert_trees_all_equal(state_j, state_e)


def test_sgld_replicated_under_pmap_draws_the_same_noise_on_every_device():
  n_dev = min(jax.local_device_count(), 4)
  tx = lars_optax.mxnet.sgld(0.1, key=8)
  params = {"w": jnp.zeros((16,))}

  def replicate(tree):
    return jax.tree.map(lambda x: jnp.broadcast_to(x, (n_dev, *x.shape)), tree)

  rep = replicate(params)
  updates, _ = jax.pmap(tx.update)(jax.tree.map(jnp.zeros_like, rep),
                                   replicate(tx.init(params)), rep)
  eager, _ = tx.update({"w": jnp.zeros((16,))}, tx.init(params), params)
  for d in range(n_dev):
    np.testing.assert_allclose(updates["w"][d], eager["w"], rtol=1e-6)


@pytest.mark.op_by_op
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_sgld_low_precision_noise_is_drawn_in_float32_with_full_tails(dtype):
  # Drawn in bfloat16, the normal's tail would end near 2.9 sigma.
  (u,) = _noise_steps(lars_optax.mxnet.sgld(1.0, key=11), 1,
                      params={"w": jnp.zeros((N,), dtype)})
  assert u["w"].dtype == dtype
  x = np.asarray(u["w"], np.float64)
  assert np.abs(x).max() > 3.5
  _assert_normal(x, 1.0)


def test_sgld_by_name_takes_key():
  a = _noise_steps(lars_optax.mxnet.create("sgld", learning_rate=0.1, key=12), 1, n=50, jit=False)
  b = _noise_steps(lars_optax.mxnet.sgld(0.1, key=12), 1, n=50, jit=False)
  chex.assert_trees_all_equal(a, b)


# --------------------------------------------------------------------------
# sgd (mx.optimizer.SGD) and mxnet_momentum
# --------------------------------------------------------------------------


def test_sgd_by_hand():
  lr, mu, wd, s, c = 0.1, 0.9, 1e-2, 0.5, 0.2
  tx = lars_optax.mxnet.sgd(lr, momentum=mu, wd=wd, rescale_grad=s, clip_gradient=c)
  p = _mxnet_params()
  state = tx.init(p)
  m = dict.fromkeys(p, 0.0)
  w = {k: np.asarray(v, np.float64) for k, v in p.items()}
  for step in range(3):
    g = _mxnet_grads(scale=1.0 + step)
    updates, state = tx.update(g, state, p)
    p = optax.apply_updates(p, updates)
    for k in w:
      m[k] = mu * m[k] - lr * (np.clip(s * np.asarray(g[k]), -c, c) + wd * w[k])
      w[k] = w[k] + m[k]
      np.testing.assert_allclose(p[k], w[k], rtol=1e-6)


def test_sgd_without_momentum_keeps_no_buffer():
  _, state = _mxnet_run(lars_optax.mxnet.sgd(momentum=0.0))
  assert optax.tree_utils.tree_get(state, "momentum") is None


class MXNetMomentumTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_learning_rate_inside_the_buffer(self):
    """m = mu m - lr_t u: a learning-rate change only affects new contributions."""
    sched = lambda count: jnp.where(count < 2, 1.0, 0.1)
    tx = lars_optax.mxnet_momentum(sched, momentum=0.5)
    params = jnp.zeros(2)
    state = tx.init(params)
    update = self.variant(tx.update)
    m = np.zeros(2)
    for t in range(4):
      u, state = update(jnp.ones(2), state, params)
      m = 0.5 * m - (1.0 if t < 2 else 0.1) * np.ones(2)
      np.testing.assert_allclose(u, m, rtol=1e-6)
    self.assertEqual(int(state.count), 4)

  def test_no_momentum_no_buffer(self):
    tx = lars_optax.mxnet_momentum(0.1)
    state = tx.init({"w": jnp.ones(3)})
    self.assertIsNone(state.momentum)
    u, _ = tx.update({"w": jnp.ones(3)}, state)
    np.testing.assert_allclose(u["w"], -0.1 * np.ones(3), rtol=1e-6)

  def test_dtype_kept_with_schedule(self):
    tx = lars_optax.mxnet_momentum(optax.constant_schedule(0.1), momentum=0.9)
    p = jnp.ones(3, jnp.bfloat16)
    u, state = tx.update(p, tx.init(p))
    self.assertEqual(u.dtype, jnp.bfloat16)
    self.assertEqual(state.momentum.dtype, jnp.bfloat16)

  def test_bad_momentum(self):
    for bad in (-0.1, 1.0, float("inf")):
      with pytest.raises(ValueError, match="momentum"):
        lars_optax.mxnet_momentum(0.1, momentum=bad)


# --------------------------------------------------------------------------
# dampened_trace: PyTorch's momentum buffer
# --------------------------------------------------------------------------


def _torch_sgd_buffer(grads, momentum, dampening, nesterov):
  """torch.optim.SGD's buffer rule, transcribed in float64 (the update before the lr)."""
  buf, out = None, []
  for g in grads:
    buf = g.copy() if buf is None else momentum * buf + (1 - dampening) * g
    out.append(g + momentum * buf if nesterov else buf.copy())
  return out


@pytest.mark.parametrize("momentum,dampening,nesterov", [
    (0.9, 0.0, False), (0.9, 0.3, False), (0.8, 0.0, True), (0.5, 0.99, False)])
def test_dampened_trace_is_pytorchs_buffer(momentum, dampening, nesterov):
  rng = np.random.default_rng(0)
  grads = [rng.standard_normal(5) for _ in range(4)]
  tx = lars_optax.dampened_trace(momentum, dampening=dampening, nesterov=nesterov)
  state = tx.init(jnp.zeros(5))
  update = jax.jit(tx.update)
  for g, want in zip(grads, _torch_sgd_buffer(grads, momentum, dampening, nesterov)):
    out, state = update(jnp.asarray(g, jnp.float32), state)
    np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-7)


def test_dampened_trace_without_dampening_is_optax_trace():
  g = jnp.array([1.0, -2.0])
  a, b = lars_optax.dampened_trace(0.9, nesterov=True), optax.trace(0.9, nesterov=True)
  sa, sb = a.init(g), b.init(g)
  for k in range(3):
    ua, sa = a.update(g * (k + 1), sa)
    ub, sb = b.update(g * (k + 1), sb)
    chex.assert_trees_all_close(ua, ub)


@pytest.mark.parametrize("kwargs,match", [
    ({"momentum": 0.0, "nesterov": True}, "^nesterov: Nesterov momentum needs momentum > 0"),
    ({"momentum": 0.9, "dampening": 0.1, "nesterov": True}, "^nesterov: .*dampening = 0"),
    ({"momentum": 0.9, "dampening": 1.0}, "^dampening"),
    ({"momentum": 0.9, "dampening": -0.1}, "^dampening"),
    ({"momentum": 1.0}, "^momentum"),
])
def test_dampened_trace_and_timm_lars_reject_what_pytorch_rejects(kwargs, match):
  with pytest.raises(ValueError, match=match):
    lars_optax.dampened_trace(**kwargs)
  with pytest.raises(ValueError, match=match):
    lars_optax.porting.timm_lars(0.1, **kwargs)


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_dcasgd_low_precision_gradient_above_256_stays_finite(dtype):
  """g * g overflows float16 for |g| > 256; times an unchanged weight that was inf * 0 = NaN."""
  params = {"w": jnp.zeros((2, 2), dtype)}
  tx = lars_optax.mxnet.dcasgd(0.001, momentum=0.9, lamda=1e-6)
  state = tx.init(params)
  for _ in range(3):
    updates, state = jax.jit(tx.update)({"w": jnp.full((2, 2), 300.0, dtype)}, state, params)
    params = optax.apply_updates(params, updates)
    assert params["w"].dtype == dtype
    assert bool(jnp.all(jnp.isfinite(params["w"])))


def test_mxnet_momentum_dampening_is_pytorchs_with_the_rate_inside():
  """m_1 = -lr u_1; m_t = mu m - (1 - d) lr u_t: a constant rate gives PyTorch's SGD."""
  rng = np.random.default_rng(1)
  grads = [rng.standard_normal(4) for _ in range(4)]
  tx = lars_optax.mxnet_momentum(0.1, momentum=0.9, dampening=0.3)
  state = tx.init(jnp.zeros(4))
  for g, want in zip(grads, _torch_sgd_buffer(grads, 0.9, 0.3, False)):
    out, state = jax.jit(tx.update)(jnp.asarray(g, jnp.float32), state)
    np.testing.assert_allclose(out, -0.1 * want, rtol=1e-6, atol=1e-7)


def test_lars_under_inject_hyperparams_keeps_mxnets_momentum_state():
  """An injected dampening (an array, 0) keeps MXNetMomentumState and the same steps."""
  params = {"w": jnp.array([[1.0, -2.0], [0.5, 3.0]])}
  g = {"w": jnp.array([[0.3, -0.1], [0.0, 0.4]])}
  injected = optax.inject_hyperparams(lars_optax.lars)(learning_rate=0.1, momentum=0.9)
  plain = lars_optax.lars(0.1, momentum=0.9)
  s_i, s_p = injected.init(params), plain.init(params)
  assert isinstance(s_i.inner_state[2], lars_optax.MXNetMomentumState)
  for _ in range(3):
    u_i, s_i = jax.jit(injected.update)(g, s_i, params)
    u_p, s_p = plain.update(g, s_p, params)
    chex.assert_trees_all_close(u_i, u_p, rtol=1e-6)


@pytest.mark.parametrize("make, kwargs", [
    (lars_optax.dampened_trace, {"momentum": 0.9, "nesterov": True}),
    (lars_optax.mxnet_momentum, {"learning_rate": 0.1, "momentum": 0.9, "nesterov": True}),
    (lars_optax.porting.timm_lars, {"lr": 0.1, "momentum": 0.9, "nesterov": True,
                                    "weight_decay": 1e-3}),
    (lars_optax.porting.optax_lars, {"learning_rate": 0.1, "nesterov": True}),
], ids=["dampened_trace", "mxnet_momentum", "timm_lars", "optax_lars"])
def test_nesterov_under_inject_hyperparams_judges_the_injected_zero_by_value(make, kwargs):
  """#37 item 4: inject_hyperparams makes the default dampening Array(0.): still 0."""
  params = {"w": jnp.array([[1.0, -2.0], [0.5, 3.0]])}
  grads = {"w": jnp.array([[0.3, -0.1], [0.0, 0.4]])}
  injected = optax.inject_hyperparams(make)(**kwargs)
  plain = make(**kwargs)
  a, _ = injected.update(grads, injected.init(params), params)
  b, _ = plain.update(grads, plain.init(params), params)
  chex.assert_trees_all_close(a, b, rtol=1e-6)
  bad = optax.inject_hyperparams(lars_optax.dampened_trace)(momentum=0.9, dampening=0.5,
                                                             nesterov=True)
  with pytest.raises(ValueError, match=r"^nesterov"):  # a concrete non-zero still refuses
    bad.init(params)
