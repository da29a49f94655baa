"""signum and signsgd (lars_optax.sign): the rules by hand, and momentum 0 as signSGD.

The number-for-number comparison with MXNet is in
``test_reference_mxnet_optimizers.py``; the checks that every MXNet-flavoured
optimizer shares are in ``test_optimizers_mxnet.py``.
"""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import mxnet_grads as _grads
from conftest import mxnet_params as _params
from conftest import mxnet_run as _run

import lars_optax

# --------------------------------------------------------------------------
# The rules by hand
# --------------------------------------------------------------------------


def test_signum_one_step_by_hand():
  lr, mu, wd, wd_lh, s, c = 0.1, 0.9, 0.01, 0.02, 0.5, 0.2
  tx = lars_optax.signum(lr, momentum=mu, wd_lh=wd_lh, wd=wd, rescale_grad=s, clip_gradient=c)
  p, g = _params(), _grads()
  updates, _ = tx.update(g, tx.init(p), p)
  for k in p:
    w, gg = np.asarray(p[k], np.float64), np.asarray(g[k], np.float64)
    m = -(1 - mu) * (np.clip(s * gg, -c, c) + wd * w)
    expected = (1 - lr * wd_lh) * w + lr * np.sign(m)
    np.testing.assert_allclose(p[k] + updates[k], expected, rtol=1e-6, atol=1e-7)


def test_signum_momentum_zero_is_signsgd():
  kw = {"learning_rate": 0.05, "wd_lh": 0.01, "wd": 0.02}
  a, sa = _run(lars_optax.signum(momentum=0.0, rescale_grad=0.3, clip_gradient=0.1, **kw))
  b, _ = _run(lars_optax.signsgd(**kw))
  chex.assert_trees_all_equal(a, b)
  assert not any(np.size(x) > 1 for x in jax.tree.leaves(sa))  # no momentum buffer


def test_signsgd_rule_and_sign_of_zero():
  lr, wd, wd_lh = 0.1, 0.01, 0.02
  tx = lars_optax.signsgd(lr, wd_lh=wd_lh, wd=wd)
  p, g = _params(), _grads()  # fc1_weight[1, 0] has a zero gradient
  updates, _ = tx.update(g, tx.init(p), p)
  for k in p:
    w = np.asarray(p[k], np.float64)
    expected = (1 - lr * (wd + wd_lh)) * w - lr * np.sign(np.asarray(g[k]))
    np.testing.assert_allclose(p[k] + updates[k], expected, rtol=1e-6, atol=1e-7)
  # sign(0) = 0: only the decay moves that entry.
  np.testing.assert_allclose(updates["fc1_weight"][1, 0], -lr * (wd + wd_lh) * 0.5, rtol=1e-6)


def test_wd_mult_does_not_scale_wd_lh():
  a, _ = _run(lars_optax.signum(wd_lh=0.05, wd_mult={"fc1_bias": 0.0}))
  b, _ = _run(lars_optax.signum(wd_lh=0.05))
  chex.assert_trees_all_close(a, b, rtol=0, atol=0)


# --------------------------------------------------------------------------
# Choices that depend on a hyperparameter's value, not its type
# --------------------------------------------------------------------------


ZEROS = {"int": 0, "float": 0.0, "np_float32": np.float32(0), "np_float64": np.float64(0),
         "jnp_float32": jnp.float32(0), "jnp_bfloat16": jnp.bfloat16(0)}


@pytest.mark.op_by_op
@pytest.mark.parametrize("zero", sorted(ZEROS))
def test_signum_with_momentum_zero_is_signsgd_whatever_the_type_of_zero(zero):
  params = {"w": jnp.array([1.0, -2.0, 3.0]), "b": jnp.array([0.5, -0.5])}
  tx = lars_optax.signum(0.1, momentum=ZEROS[zero], wd=0.1, wd_lh=0.01)
  ref = lars_optax.signsgd(0.1, wd=0.1, wd_lh=0.01)
  s, r = tx.init(params), ref.init(params)
  for k in range(3):
    grads = jax.tree.map(lambda p, k=k: jnp.sin(p * (k + 1)) * 1e-3, params)
    u, s = jax.jit(tx.update)(grads, s, params)
    v, r = ref.update(grads, r, params)
    chex.assert_trees_all_close(u, v, rtol=1e-6)  # decoupled decay: not signum's coupled wd


def test_signum_momentum_zero_under_inject_hyperparams_is_signsgd():
  params = {"w": jnp.array([1.0, -2.0, 3.0])}
  grads = {"w": jnp.array([1e-3, 0.0, -1e-3])}
  tx = optax.inject_hyperparams(lars_optax.signum)(learning_rate=0.1, momentum=0.0, wd=0.1)
  u, _ = jax.jit(tx.update)(grads, tx.init(params), params)
  ref = lars_optax.signsgd(0.1, wd=0.1)
  chex.assert_trees_all_close(u, ref.update(grads, ref.init(params), params)[0], rtol=1e-6)
