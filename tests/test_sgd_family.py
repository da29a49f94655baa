"""The SGD variants: nag, dcasgd and sgld (``lars_optax.sgd_family``).

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
  out, _ = _run(lars_optax.nag(schedule, momentum=0.9, wd=1e-2))
  for ours, ref in zip(out, _nag_numpy(lrs, 0.9, wd=1e-2)):
    chex.assert_trees_all_close(ours, ref, rtol=1e-5, atol=1e-6)


def test_nag_with_a_constant_rate_equals_optax_sgd_nesterov():
  ours, _ = _run(lars_optax.nag(0.1, momentum=0.9))
  theirs, _ = _run(optax.sgd(0.1, momentum=0.9, nesterov=True))
  chex.assert_trees_all_close(ours, theirs, rtol=1e-5, atol=1e-6)


def test_nag_without_momentum_is_sgd_and_keeps_no_buffer():
  ours, state = _run(lars_optax.nag(0.1, momentum=0.0))
  theirs, _ = _run(optax.sgd(0.1))
  chex.assert_trees_all_close(ours, theirs, rtol=1e-6)
  assert optax.tree_utils.tree_get(state, "momentum") is None


def test_nag_buffer_is_mxnet_momentum_state():
  _, state = _run(lars_optax.nag(0.1, momentum=0.9), steps=1)
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
  ours, _ = _run(lars_optax.create(name, learning_rate=0.1, momentum=0.8, wd=1e-3,
                                   lr_mult={"w": 0.5}))
  theirs, _ = _run(lars_optax.nag(0.1, momentum=0.8, wd=1e-3, lr_mult={"w": 0.5}))
  chex.assert_trees_all_equal(ours, theirs)


# --------------------------------------------------------------------------
# dcasgd
# --------------------------------------------------------------------------


def test_add_delay_compensation_adds_lamda_g_squared_times_the_weight_change():
  tx = lars_optax.add_delay_compensation(0.5)
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
  state = lars_optax.add_delay_compensation().init(params)
  assert state.previous_params["w"] is not params["w"]
  chex.assert_trees_all_equal(state.previous_params, params)


def test_add_delay_compensation_needs_params():
  tx = lars_optax.add_delay_compensation()
  params = {"w": jnp.ones(3)}
  with pytest.raises(ValueError, match=r"^add_delay_compensation: params are required"):
    tx.update(params, tx.init(params))


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_dcasgd_with_lamda_zero_is_mxnet_sgd(momentum):
  ours, _ = _run(lars_optax.dcasgd(0.1, momentum=momentum, lamda=0.0, wd=1e-2))
  theirs, _ = _run(lars_optax.sgd(0.1, momentum=momentum, wd=1e-2))
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
  out, _ = _run(lars_optax.dcasgd(schedule, momentum=0.9, lamda=0.3))
  for ours, ref in zip(out, _dcasgd_numpy(lrs, 0.9, 0.3)):
    chex.assert_trees_all_close(ours, ref, rtol=1e-5, atol=1e-6)


def test_dcasgd_by_name_with_mxnet_defaults():
  ours, state = _run(lars_optax.create("dcasgd"))
  theirs, _ = _run(lars_optax.dcasgd(0.1, momentum=0.0, lamda=0.04))
  chex.assert_trees_all_equal(ours, theirs)
  assert optax.tree_utils.tree_get(state, "momentum") is None  # momentum=0: no buffer
