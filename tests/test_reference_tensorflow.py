"""lars_optax.tf_lars against TensorFlow's LARSOptimizer test and rule 2.

The first two tests port ``lars_optimizer_test.py`` from the TensorFlow commit
that added ``tf.contrib.opt.LARSOptimizer`` (its formulas computed in NumPy,
float32 and float64, one step and ten steps). The rest compare Nesterov,
``skip_list`` and multi-leaf trees with ``tests/reference/tf_lars_numpy.py``, a
float64 transcription of the rule. Tolerances: relative 1e-5 in float32, 1e-12
in float64.
"""

import contextlib
import pathlib
import sys

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import x64

import lars_optax

sys.path.insert(0, str(pathlib.Path(__file__).parent / "reference"))
from tf_lars_numpy import tf_lars_steps

RTOL = {"float32": 1e-5, "float64": 1e-12}


def _maybe_x64(dtype):
  return x64() if dtype == "float64" else contextlib.nullcontext()


def _step_fn(opt):
  @jax.jit
  def step(params, state, grads):
    updates, state = opt.update(grads, state, params)
    return optax.apply_updates(params, updates), state
  return step


@pytest.mark.quick
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("steps", [1, 10], ids=["one_step", "multi_step"])
def test_tf_lars_test_file(dtype, steps):
  """TF's testLARSGradientOneStep / testLARSGradientMultiStep."""
  with _maybe_x64(dtype):
    shape = (3, 3)
    var_np, grad_np = np.ones(shape), np.ones(shape)
    lr_np, m_np, wd_np, ep_np, eeta = 0.1, 0.9, 0.1, 1e-5, 0.1
    vel_np = np.zeros(shape)
    opt = lars_optax.tf_lars(learning_rate=lr_np, momentum=m_np, weight_decay=wd_np,
                             eeta=eeta, epsilon=ep_np)
    var = jnp.asarray(var_np, dtype)
    grad = jnp.asarray(grad_np, dtype)
    state = opt.init(var)
    chex.assert_trees_all_close(state[1].inner_state.trace, vel_np)
    step = _step_fn(opt)
    for _ in range(steps):
      var, state = step(var, state, grad)
      w_norm = np.linalg.norm(var_np.flatten(), ord=2)
      g_norm = np.linalg.norm(grad_np.flatten(), ord=2)
      trust_ratio = eeta * w_norm / (g_norm + wd_np * w_norm + ep_np)
      scaled_lr = lr_np * trust_ratio
      vel_np = m_np * vel_np + grad_np
      var_np = var_np - scaled_lr * vel_np
      assert var.dtype == jnp.dtype(dtype)
      np.testing.assert_allclose(np.asarray(var, np.float64), var_np, rtol=RTOL[dtype])
      np.testing.assert_allclose(np.asarray(state[1].inner_state.trace, np.float64), vel_np,
                                 rtol=RTOL[dtype])


def _problem(seed=0):
  rng = np.random.default_rng(seed)
  shapes = {"dense/kernel": (5, 4), "dense/bias": (4,), "batch_normalization/gamma": (4,),
            "conv/kernel": (3, 3, 2), "zero/kernel": (2, 2)}
  params = {k: rng.standard_normal(s) * 0.5 for k, s in shapes.items()}
  params["zero/kernel"] = np.zeros(shapes["zero/kernel"])
  grads = []
  for t in range(12):
    g = {k: rng.standard_normal(s) * rng.choice([0.05, 0.5, 2.0]) for k, s in shapes.items()}
    if t == 4:  # an all-zero gradient step
      g = {k: np.zeros(s) for k, s in shapes.items()}
    grads.append(g)
  return params, grads


CASES = {
    "momentum": {"momentum": 0.9},
    "nesterov": {"momentum": 0.9, "use_nesterov": True},
    "skip_list": {"momentum": 0.9, "skip_list": ["batch_normalization", "bias"]},
    "nesterov_skip_list_epsilon": {"momentum": 0.5, "use_nesterov": True, "skip_list": ["bias"],
                                   "epsilon": 1e-2, "weight_decay": 1e-2, "eeta": 0.01},
    "no_momentum": {"momentum": 0.0, "weight_decay": 0.0},
}


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_against_numpy_rule(case, dtype):
  kwargs = {"lr": 0.1, "eeta": 0.02, **CASES[case]}
  params_np, grads_np = _problem()
  want_w, want_a = tf_lars_steps(params_np, grads_np, **kwargs)
  with _maybe_x64(dtype):
    tf_kwargs = {k: v for k, v in kwargs.items() if k != "lr"}
    opt = lars_optax.tf_lars(kwargs["lr"], **tf_kwargs)
    params = {k: jnp.asarray(v, dtype) for k, v in params_np.items()}
    state = opt.init(params)
    step = _step_fn(opt)
    for t, g in enumerate(grads_np):
      params, state = step(params, state, {k: jnp.asarray(v, dtype) for k, v in g.items()})
      for k in params:
        assert params[k].dtype == jnp.dtype(dtype)
        exp = want_w[t][k]
        err = np.abs(np.asarray(params[k], np.float64) - exp).max() / np.abs(exp).max()
        assert err <= RTOL[dtype], (t, k, err)
        exp_a = want_a[t][k]
        got_a = np.asarray(state[1].inner_state.trace[k], np.float64)
        scale = max(np.abs(exp_a).max(), 1e-30)
        assert np.abs(got_a - exp_a).max() / scale <= RTOL[dtype], (t, k)


def test_skip_list_ratio_is_one():
  params_np, grads_np = _problem()
  opt = lars_optax.tf_lars(0.1, skip_list=["bias"])
  params = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), params_np)
  state = opt.init(params)
  _, state = opt.update(jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), grads_np[0]),
                        state, params)
  ratios = lars_optax.trust_ratios(state, params)
  assert float(ratios["dense/bias"]) == 1.0
  assert float(ratios["dense/kernel"]) != 1.0
  assert float(ratios["zero/kernel"]) == 1.0  # |w| == 0 fallback
