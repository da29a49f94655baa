"""The public transformations on their own and composed into new chains."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lars_optax
from lars_optax import masks


def _np_ratio(w, g, eta, wd, eps):
  wn, gn = np.linalg.norm(np.ravel(w)), np.linalg.norm(np.ravel(g))
  if wn == 0 or gn == 0 or not np.isfinite(wn) or not np.isfinite(gn):
    return 1.0
  return eta * wn / (gn + wd * wn + eps)


class TrustRatioTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_ratio_values_and_fallbacks(self):
    ratio = self.variant(lars_optax.lars_trust_ratio)
    w = jnp.arange(6.0).reshape(2, 3)
    g = jnp.full((2, 3), 0.5)
    np.testing.assert_allclose(ratio(w, g, 0.1, 0.01, 1e-3), _np_ratio(w, g, 0.1, 0.01, 1e-3),
                               rtol=1e-6)
    # grad_scale multiplies the gradient norm by |s|.
    np.testing.assert_allclose(ratio(w, g, 0.1, 0.0, 0.0, -4.0), _np_ratio(w, 4 * g, 0.1, 0, 0),
                               rtol=1e-6)
    zeros = jnp.zeros((2, 3))
    for bad_w, bad_g in [(zeros, g), (w, zeros), (w, g.at[0, 0].set(jnp.nan)),
                         (w, g.at[0, 0].set(jnp.inf)), (w.at[1, 1].set(jnp.inf), g),
                         (w.at[1, 1].set(jnp.nan), g)]:
      self.assertEqual(float(ratio(bad_w, bad_g, 0.1, 0.01, 1e-3)), 1.0)

  def test_norm_dtype_is_float32_or_wider(self):
    w = jnp.full((300,), 300.0, jnp.float16)  # |w|^2 overflows float16
    g = jnp.ones((300,), jnp.float16)
    r = lars_optax.lars_trust_ratio(w, g, eta=1.0)
    self.assertEqual(r.dtype, jnp.float32)
    np.testing.assert_allclose(r, 300.0, rtol=1e-3)

  def test_scales_inner_output_and_skips(self):
    params = {"fc_weight": jnp.ones((4, 3)), "fc_bias": jnp.ones((3,))}
    grads = {"fc_weight": jnp.full((4, 3), 2.0), "fc_bias": jnp.full((3,), 2.0)}
    tx = lars_optax.scale_by_lars_trust_ratio(
        optax.scale(3.0), eta=0.5, skip=lars_optax.MXNET_SKIP)
    state = tx.init(params)
    out, state = tx.update(grads, state, params)
    r = _np_ratio(params["fc_weight"], grads["fc_weight"], 0.5, 0.0, 0.0)
    chex.assert_trees_all_close(out["fc_weight"], 6.0 * r * jnp.ones((4, 3)), rtol=1e-6)
    chex.assert_trees_all_close(out["fc_bias"], jnp.full((3,), 6.0))
    named = lars_optax.trust_ratios(state, params)
    self.assertEqual(float(named["fc_bias"]), 1.0)
    np.testing.assert_allclose(float(named["fc_weight"]), r, rtol=1e-6)

  def test_ratio_taken_before_inner(self):
    """The ratio uses the gradient entering the transformation, not the inner's output."""
    params = {"w": jnp.ones((4,))}
    grads = {"w": jnp.array([10.0, 0.0, 0.0, 0.0])}
    tx = lars_optax.scale_by_lars_trust_ratio(optax.clip(1.0), eta=1.0, rescale=0.5)
    out, state = tx.update(grads, tx.init(params), params)
    r = _np_ratio(params["w"], 0.5 * grads["w"], 1.0, 0.0, 0.0)
    np.testing.assert_allclose(out["w"], r * np.array([1.0, 0, 0, 0]), rtol=1e-6)
    np.testing.assert_allclose(lars_optax.trust_ratios(state)[0], r, rtol=1e-6)

  def test_inner_state_is_kept(self):
    params = {"w": jnp.ones((3,))}
    tx = lars_optax.scale_by_lars_trust_ratio(optax.trace(0.9), eta=1.0)
    state = tx.init(params)
    for _ in range(3):
      _, state = tx.update({"w": jnp.ones((3,))}, state, params)
    np.testing.assert_allclose(state.inner_state.trace["w"], 1 + 0.9 + 0.81, rtol=1e-6)

  def test_requires_params(self):
    tx = lars_optax.scale_by_lars_trust_ratio()
    with pytest.raises(ValueError, match="params"):
      tx.update({"w": jnp.ones(2)}, tx.init({"w": jnp.ones(2)}))

  def test_bad_hyperparameters(self):
    for kwargs, arg in [({"eta": -1.0}, "eta"), ({"epsilon": float("nan")}, "epsilon"),
                        ({"weight_decay": -1e-4}, "weight_decay"), ({"rescale": 0.0}, "rescale")]:
      with pytest.raises(ValueError, match=arg):
        lars_optax.scale_by_lars_trust_ratio(**kwargs)
    with pytest.raises(TypeError, match="inner"):
      lars_optax.scale_by_lars_trust_ratio(inner=lambda x: x)

  def test_custom_chain_with_masked_weight_decay(self):
    """Users build variants: a LAMB-like chain with decay off for norm/bias leaves."""
    params = {"params": {"Dense_0": {"kernel": jnp.ones((3, 2)), "bias": jnp.ones((2,))}}}
    grads = jax.tree.map(lambda p: 0.1 * jnp.ones_like(p), params)
    tx = optax.chain(
        lars_optax.scale_by_lars_trust_ratio(
            optax.chain(optax.scale_by_adam(),
                        optax.add_decayed_weights(0.01, mask=~lars_optax.FLAX_SKIP)),
            eta=1.0, skip=lars_optax.FLAX_SKIP),
        optax.scale_by_learning_rate(0.1))
    state = tx.init(params)
    updates, state = jax.jit(tx.update)(grads, state, params)
    chex.assert_tree_all_finite(updates)
    named = lars_optax.trust_ratios(state, params)
    self.assertEqual(float(named["params/Dense_0/bias"]), 1.0)
    self.assertNotEqual(float(named["params/Dense_0/kernel"]), 1.0)


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
    tx = lars_optax.mxnet_momentum(optax.constant_schedule(0.1), 0.9)
    p = jnp.ones(3, jnp.bfloat16)
    u, state = tx.update(p, tx.init(p))
    self.assertEqual(u.dtype, jnp.bfloat16)
    self.assertEqual(state.momentum.dtype, jnp.bfloat16)

  def test_bad_momentum(self):
    for bad in (-0.1, 1.0, float("inf")):
      with pytest.raises(ValueError, match="momentum"):
        lars_optax.mxnet_momentum(0.1, bad)


def test_mxnet_chain_equals_lars():
  """lars() is exactly the documented chain of public pieces."""
  params = {"fc_weight": jnp.linspace(-1, 1, 12).reshape(4, 3), "fc_bias": jnp.ones(3)}
  grads = jax.tree.map(lambda p: 0.7 * p + 0.2, params)
  a = lars_optax.lars(0.1, momentum=0.9, eta=0.01, wd=1e-3, rescale_grad=0.5, clip_gradient=0.3)
  b = optax.chain(
      lars_optax.scale_by_lars_trust_ratio(
          optax.chain(optax.clip(0.3), optax.add_decayed_weights(1e-3)),
          eta=0.01, weight_decay=1e-3, epsilon=1e-8, skip=masks.MXNET_SKIP, rescale=0.5),
      lars_optax.mxnet_momentum(0.1, 0.9))
  sa, sb = a.init(params), b.init(params)
  for _ in range(3):
    ua, sa = a.update(grads, sa, params)
    ub, sb = b.update(grads, sb, params)
    chex.assert_trees_all_equal(ua, ub)
