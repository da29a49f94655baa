"""SVRG building blocks: the rule, the helpers, errors, and convergence.

The comparison with MXNet 1.9.1's ``SVRGModule`` is in
``test_reference_mxnet_svrg.py``.
"""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import x64

import lars_optax


def _problem(n=250, d=5, seed=0, noise=0.5, dtype=np.float32):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(n, d)).astype(dtype)
  w = rng.normal(size=d).astype(dtype)
  y = (x @ w + 0.3 + noise * rng.normal(size=n)).astype(dtype)
  return x, y


def _loss(params, batch):
  """Mean squared error of a linear model, with Flax-style nested names."""
  x, y = batch
  dense = params["params"]["Dense_0"]
  return 0.5 * jnp.mean((x @ dense["kernel"] + dense["bias"] - y) ** 2)


def _params(d=5, dtype=jnp.float32):
  return {"params": {"Dense_0": {"kernel": jnp.zeros(d, dtype), "bias": jnp.zeros((), dtype)}}}


def _batches(x, y, size):
  return [(x[i:i + size], y[i:i + size]) for i in range(0, len(x), size)]


# --------------------------------------------------------------------------
# The rule
# --------------------------------------------------------------------------


@pytest.mark.op_by_op
@pytest.mark.parametrize("inner", [optax.sgd(0.1), optax.adam(0.01),
                                   lars_optax.lars(0.1, momentum=0.9, eta=0.1)],
                         ids=["sgd", "adam", "lars"])
def test_update_is_inner_of_g_minus_snapshot_g_plus_mu(inner):
  params = {"fc1_weight": jnp.array([[1.0, 2.0], [3.0, -1.0]]), "fc1_bias": jnp.array([0.5, 0.1])}
  g = jax.tree.map(lambda p: 0.1 * p + 0.05, params)
  g_snap = jax.tree.map(lambda p: -0.2 * p, params)
  mu = jax.tree.map(lambda p: 0.3 * jnp.ones_like(p), params)
  tx = lars_optax.svrg.svrg(inner)
  state = lars_optax.svrg.refresh(tx.init(params), params, mu)
  updates, state = jax.jit(tx.update)(g, state, params, snapshot_grads=g_snap)
  expected, _ = inner.update(jax.tree.map(lambda a, b, m: a - b + m, g, g_snap, mu),
                             inner.init(params), params)
  chex.assert_trees_all_close(updates, expected, rtol=1e-6)
  # The snapshot and mu are kept; only the inner state moves.
  chex.assert_trees_all_equal(state.full_grad, mu)
  chex.assert_trees_all_equal(lars_optax.svrg.snapshot(state), params)


def test_at_the_snapshot_the_gradient_is_mu():
  x, y = _problem()
  params = _params()
  tx = lars_optax.svrg.svrg(optax.sgd(1.0))
  mu = lars_optax.svrg.full_gradient(_loss, params, _batches(x, y, 50))
  state = lars_optax.svrg.refresh(tx.init(params), params, mu)
  _, g, g_snap = lars_optax.svrg.value_and_grads(_loss)(params, lars_optax.svrg.snapshot(state),
                                                   (x[:50], y[:50]))
  updates, _ = tx.update(g, state, params, snapshot_grads=g_snap)
  chex.assert_trees_all_close(updates, jax.tree.map(jnp.negative, mu), rtol=1e-6)


@pytest.mark.op_by_op
def test_value_and_grads_in_one_call():
  x, y = _problem()
  params = _params()
  snap = jax.tree.map(lambda p: p + 0.5, params)
  loss, g, g_snap = lars_optax.svrg.value_and_grads(_loss)(params, snap, (x, y))
  np.testing.assert_allclose(loss, _loss(params, (x, y)), rtol=1e-6)
  chex.assert_trees_all_close(g, jax.grad(_loss)(params, (x, y)), rtol=1e-6)
  chex.assert_trees_all_close(g_snap, jax.grad(_loss)(snap, (x, y)), rtol=1e-6)


# --------------------------------------------------------------------------
# full_gradient
# --------------------------------------------------------------------------


@pytest.mark.parametrize("size", [50, 32, 250, 7])  # 32 and 7 leave a smaller last batch
def test_full_gradient_equals_the_whole_data_gradient(size):
  x, y = _problem()
  params = jax.tree.map(lambda p: p + 0.3, _params())
  exact = jax.grad(_loss)(params, (x, y))
  from_list = lars_optax.svrg.full_gradient(_loss, params, _batches(x, y, size))
  stacked = lars_optax.svrg.full_gradient(_loss, params, (x, y), batch_size=size)
  chex.assert_trees_all_close(from_list, exact, rtol=2e-5, atol=1e-6)
  chex.assert_trees_all_close(stacked, exact, rtol=2e-5, atol=1e-6)


def test_full_gradient_from_a_generator():
  x, y = _problem()
  params = _params()
  gen = (b for b in _batches(x, y, 40))
  chex.assert_trees_all_close(lars_optax.svrg.full_gradient(_loss, params, gen),
                              jax.grad(_loss)(params, (x, y)), rtol=2e-5, atol=1e-6)


def test_data_parallel_with_pmap_and_axis_name():
  x, y = _problem(n=240)
  n_dev = jax.local_device_count()
  params = jax.tree.map(lambda p: p + 0.1, _params())
  shards = (x.reshape(n_dev, -1, x.shape[1]), y.reshape(n_dev, -1))
  rep = jax.tree.map(lambda p: jnp.stack([p] * n_dev), params)

  def per_device(p, data):
    mu = lars_optax.svrg.full_gradient(_loss, p, data, batch_size=20, axis_name="d")
    _, g, g_snap = lars_optax.svrg.value_and_grads(_loss, axis_name="d", jit=False)(p, p, data)
    return mu, g, g_snap

  mu, g, g_snap = jax.pmap(per_device, axis_name="d")(rep, shards)
  exact = jax.grad(_loss)(params, (x, y))
  for tree in (mu, g, g_snap):
    chex.assert_trees_all_close(jax.tree.map(lambda a: a[0], tree), exact, rtol=2e-5, atol=1e-6)


def test_unbound_axis_name_is_named():
  x, y = _problem()
  with pytest.raises(ValueError, match="axis_name: 'nope' is not bound"):
    lars_optax.svrg.full_gradient(_loss, _params(), (x, y), batch_size=50, axis_name="nope")


@pytest.mark.parametrize("kwargs, data, match", [
    ({"batch_size": 0}, "stacked", "batch_size: expected an int >= 1"),
    ({"batch_size": 2.5}, "stacked", "batch_size: expected an int >= 1"),
    ({}, "stacked", "batch_size: data looks like stacked arrays"),
    ({}, [], "data: no batches"),
    ({"batch_size": 10}, "ragged", "same length along axis 0"),
])
def test_full_gradient_bad_input(kwargs, data, match):
  x, y = _problem()
  if data == "stacked":
    data = (x, y)
  elif data == "ragged":
    data = (x, y[:-1])
  with pytest.raises(ValueError, match=match):
    lars_optax.svrg.full_gradient(_loss, _params(), data, **kwargs)


# --------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------


def test_update_before_any_snapshot_is_an_error():
  tx = lars_optax.svrg.svrg(optax.sgd(0.1))
  params = _params()
  g = jax.tree.map(jnp.ones_like, params)
  with pytest.raises(ValueError, match=r"svrg: no snapshot yet; .*lars_optax\.svrg\.refresh"):
    tx.update(g, tx.init(params), params, snapshot_grads=g)
  with pytest.raises(ValueError, match="svrg: no snapshot yet"):
    lars_optax.svrg.snapshot(tx.init(params))


def test_missing_snapshot_grads_is_an_error():
  tx = lars_optax.svrg.svrg(optax.sgd(0.1))
  params = _params()
  state = lars_optax.svrg.refresh(tx.init(params), params, params)
  with pytest.raises(ValueError, match="snapshot_grads: svrg's update needs"):
    tx.update(params, state, params)


def test_mismatched_trees_are_errors():
  tx = lars_optax.svrg.svrg(optax.sgd(0.1))
  params = _params()
  state = lars_optax.svrg.refresh(tx.init(params), params, params)
  bad = {"params": {"Dense_0": {"kernel": jnp.zeros(5)}}}
  with pytest.raises(ValueError, match="snapshot_grads: gradients and params have different"):
    tx.update(params, state, params, snapshot_grads=bad)
  with pytest.raises(ValueError, match="full_grad: gradients and params have different"):
    lars_optax.svrg.refresh(state, params, bad)
  wrong_shape = {"params": {"Dense_0": {"kernel": jnp.zeros(4), "bias": jnp.zeros(())}}}
  with pytest.raises(ValueError, match="has shape"):
    tx.update(params, state, params, snapshot_grads=wrong_shape)


@pytest.mark.parametrize("update_freq", [0, -1, 1.5, True, "2"])
def test_update_freq_must_be_a_positive_int(update_freq):
  with pytest.raises(ValueError, match="update_freq: expected an int >= 1"):
    lars_optax.svrg.due(0, update_freq=update_freq)


def test_svrg_due_follows_mxnet():
  assert [e for e in range(7) if lars_optax.svrg.due(e, update_freq=2)] == [0, 2, 4, 6]
  assert all(lars_optax.svrg.due(e, update_freq=1) for e in range(3))
  with pytest.raises(ValueError, match="epoch: expected an int >= 0"):
    lars_optax.svrg.due(-1, update_freq=2)


def test_bad_inner_and_loss():
  with pytest.raises(TypeError, match=r"inner: expected an optax\.GradientTransformation"):
    lars_optax.svrg.svrg(lambda g: g)
  with pytest.raises(TypeError, match="loss_fn: expected a callable"):
    lars_optax.svrg.value_and_grads(3)
  with pytest.raises(TypeError, match="loss_fn: expected a callable"):
    lars_optax.svrg.full_gradient(3, _params(), [])


def test_refresh_needs_an_svrg_state():
  with pytest.raises(ValueError, match="state: no SVRGState found"):
    lars_optax.svrg.refresh(optax.sgd(0.1).init(_params()), _params(), _params())


def test_refresh_inside_a_chain():
  params = _params()
  tx = optax.chain(optax.clip(1.0), lars_optax.svrg.svrg(optax.sgd(0.1)))
  state = lars_optax.svrg.refresh(tx.init(params), params, params)
  assert lars_optax.svrg.snapshot(state) is not None


# --------------------------------------------------------------------------
# Training loops
# --------------------------------------------------------------------------


def _train(tx, params, batches, epochs, use_svrg, update_freq=2, jit=True, keep_after=()):
  """The params after ``epochs`` epochs (or a list: after each epoch count in ``keep_after``)."""
  grads_fn = lars_optax.svrg.value_and_grads(_loss, jit=jit)
  grad_fn = jax.jit(jax.grad(_loss)) if jit else jax.grad(_loss)
  state = tx.init(params)
  update = jax.jit(tx.update) if jit else tx.update
  kept = []
  for epoch in range(epochs):
    if use_svrg and lars_optax.svrg.due(epoch, update_freq=update_freq):
      mu = lars_optax.svrg.full_gradient(_loss, params, batches)
      state = lars_optax.svrg.refresh(state, params, mu)
    for batch in batches:
      if use_svrg:
        _, g, g_snap = grads_fn(params, lars_optax.svrg.snapshot(state), batch)
        updates, state = update(g, state, params, snapshot_grads=g_snap)
      else:
        updates, state = update(grad_fn(params, batch), state, params)
      params = optax.apply_updates(params, updates)
    if epoch + 1 in keep_after:
      kept.append(params)
  return kept if keep_after else params


def test_svrg_converges_linearly_where_sgd_stalls():
  """Least squares, constant step: SVRG reaches the optimum, SGD a noise floor."""
  with x64():
    x, y = _problem(n=200, noise=1.0, dtype=np.float64)
    batches = _batches(x, y, 10)
    a = np.c_[x, np.ones(len(x))]
    opt = np.linalg.lstsq(a, y, rcond=None)[0]

    def dist(p):
      d = p["params"]["Dense_0"]
      return float(np.linalg.norm(np.r_[np.asarray(d["kernel"]), float(d["bias"])] - opt))

    params = _params(dtype=jnp.float64)
    lr = 0.05
    epochs = (8, 16, 32)  # (one run of 32 epochs each, measured after 8, 16 and 32)
    errs_svrg = [dist(p) for p in _train(lars_optax.svrg.svrg(optax.sgd(lr)), params, batches,
                                         epochs[-1], True, keep_after=epochs)]
    errs_sgd = [dist(p) for p in _train(optax.sgd(lr), params, batches, epochs[-1], False,
                                        keep_after=epochs)]
  print("distance to the optimum after", epochs, "epochs: svrg", errs_svrg, "sgd", errs_sgd)
  # Linear convergence: every 8 more epochs (4 snapshots) divide the error by
  # more than 100 (measured: 224x from 8 to 16 epochs, 5e4x from 16 to 32).
  assert errs_svrg[1] < 1e-2 * errs_svrg[0], errs_svrg
  assert errs_svrg[2] < 1e-4 * errs_svrg[1], errs_svrg
  assert errs_svrg[2] < 1e-8, errs_svrg
  # Plain SGD with the same step stalls at a noise floor: it does not improve
  # from 16 to 32 epochs and stays orders of magnitude above SVRG.
  assert errs_sgd[2] > 0.5 * errs_sgd[1] > 1e-3, errs_sgd
  assert errs_sgd[2] > 1e6 * errs_svrg[2]


def test_training_with_lars_inside_and_without_jit():
  x, y = _problem()
  batches = _batches(x, y, 50)
  tx = lars_optax.svrg.svrg(lars_optax.lars(0.5, momentum=0.9, eta=1.0, skip="flax"))
  a = _train(tx, _params(), batches, 4, True, jit=True)
  b = _train(tx, _params(), batches, 4, True, jit=False)
  chex.assert_trees_all_close(a, b, rtol=1e-5, atol=1e-6)
  assert _loss(a, (x, y)) < 0.5 * _loss(_params(), (x, y))


# --------------------------------------------------------------------------
# Flax and Haiku models, pmap
# --------------------------------------------------------------------------


def _flax_model():
  import flax.linen as nn  # pylint: disable=g-import-not-at-top

  class MLP(nn.Module):

    @nn.compact
    def __call__(self, x):
      return nn.Dense(1)(nn.tanh(nn.Dense(8)(x)))[..., 0]

  model = MLP()
  return model.init(jax.random.key(0), jnp.zeros((1, 5))), model.apply


def _haiku_model():
  import haiku as hk  # pylint: disable=g-import-not-at-top

  def forward(x):
    return hk.nets.MLP([8, 1], activation=jnp.tanh)(x)[..., 0]

  model = hk.without_apply_rng(hk.transform(forward))
  return model.init(jax.random.key(0), jnp.zeros((1, 5))), model.apply


@pytest.mark.parametrize("make_model", [_flax_model, _haiku_model], ids=["flax", "haiku"])
@pytest.mark.parametrize("inner", ["sgd", "lars"])
def test_flax_and_haiku_models(make_model, inner):
  params, apply = make_model()

  def loss(p, batch):
    x, y = batch
    return 0.5 * jnp.mean((apply(p, x) - y) ** 2)

  x, y = _problem(n=200)
  batches = _batches(x, y, 25)
  skip = "flax" if make_model is _flax_model else "haiku"
  opt = optax.sgd(0.05) if inner == "sgd" else lars_optax.lars(0.1, momentum=0.9, eta=0.1,
                                                               skip=skip)
  tx = lars_optax.svrg.svrg(opt)
  grads_fn = lars_optax.svrg.value_and_grads(loss)
  state = tx.init(params)
  start = loss(params, (x, y))

  @jax.jit
  def step(params, state, batch):
    _, g, g_snap = grads_fn(params, lars_optax.svrg.snapshot(state), batch)
    updates, state = tx.update(g, state, params, snapshot_grads=g_snap)
    return optax.apply_updates(params, updates), state

  for epoch in range(4):
    if lars_optax.svrg.due(epoch, update_freq=2):
      state = lars_optax.svrg.refresh(state, params,
                                      lars_optax.svrg.full_gradient(loss, params, batches))
    for batch in batches:
      params, state = step(params, state, batch)
  assert loss(params, (x, y)) < 0.7 * start


def test_training_step_under_pmap_equals_one_device():
  x, y = _problem(n=200)
  n_dev = jax.local_device_count()
  tx = lars_optax.svrg.svrg(lars_optax.lars(0.5, momentum=0.9, eta=1.0, skip="flax"))
  params = jax.tree.map(lambda p: p + 0.2, _params())
  mu = lars_optax.svrg.full_gradient(_loss, params, (x, y), batch_size=40)
  state = lars_optax.svrg.refresh(tx.init(params), params, mu)
  batch = (x[:40], y[:40])

  def step(params, state, batch, axis_name=None):
    fn = lars_optax.svrg.value_and_grads(_loss, axis_name=axis_name, jit=False)
    _, g, g_snap = fn(params, lars_optax.svrg.snapshot(state), batch)
    updates, state = tx.update(g, state, params, snapshot_grads=g_snap)
    return optax.apply_updates(params, updates)

  single = jax.jit(step)(params, state, batch)
  rep = jax.tree.map(lambda a: jnp.stack([a] * n_dev), (params, state))
  shards = jax.tree.map(lambda a: a.reshape((n_dev, -1, *a.shape[1:])), batch)
  multi = jax.pmap(lambda p, s, b: step(p, s, b, axis_name="d"), axis_name="d")(
      *rep, shards)
  chex.assert_trees_all_close(jax.tree.map(lambda a: a[0], multi), single, rtol=1e-5)
