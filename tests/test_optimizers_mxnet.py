"""What the MXNet-flavoured optimizers share: signum, signsgd, adam, sgd and lars.

The number-for-number comparison with MXNet is in
``test_reference_mxnet_optimizers.py``, and each optimizer's rule on small
hand-made cases in the test file of its family (``test_sign.py``,
``test_adam_family.py``, ``test_sgd_family.py``); here: argument checks,
per-leaf multipliers, dtypes, jit and composition.
"""

import math

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

MXNET = {
    "signum": lars_optax.signum,
    "signsgd": lars_optax.signsgd,
    "adam": lars_optax.mxnet.adam,
    "sgd": lars_optax.mxnet.sgd,
    "lars": lars_optax.lars,
}


# --------------------------------------------------------------------------
# Bad input
# --------------------------------------------------------------------------


@pytest.mark.parametrize("name, arg, value, match", [
    ("adam", "beta1", 1.0, r"beta1: must be in \[0, 1\), got 1"),
    ("adam", "beta1", -0.1, r"beta1: must be in \[0, 1\)"),
    ("adam", "beta2", 1.5, r"beta2: must be in \[0, 1\)"),
    ("adam", "epsilon", -1e-8, "epsilon: must be >= 0"),
    ("signum", "momentum", 1.0, r"momentum: must be in \[0, 1\)"),
    ("signum", "momentum", -0.5, r"momentum: must be in \[0, 1\)"),
    ("signum", "wd_lh", -1e-3, "wd_lh: must be >= 0"),
    ("signsgd", "wd_lh", -1e-3, "wd_lh: must be >= 0"),
    ("sgd", "momentum", 1.0, r"momentum: must be in \[0, 1\)"),
    ("adam", "begin_num_update", -1, r"begin_num_update: expected an int in \[0, 2147483646\]"),
])
def test_out_of_range(name, arg, value, match):
  with pytest.raises(ValueError, match=match):
    MXNET[name](**{arg: value})


@pytest.mark.parametrize("name", list(MXNET))
@pytest.mark.parametrize("arg, value, exc, match", [
    ("learning_rate", -0.1, ValueError, "learning_rate: must be >= 0"),
    ("wd", -1.0, ValueError, "wd: must be >= 0"),
    ("wd", math.nan, ValueError, "wd: must be finite"),
    ("rescale_grad", 0.0, ValueError, "rescale_grad: must be > 0"),
    ("clip_gradient", 0.0, ValueError, "clip_gradient: must be > 0"),
    ("multi_precision", 1, TypeError, "multi_precision: expected a bool"),
    ("lr_mult", {"fc1_weight": -1.0}, ValueError, "lr_mult: the value for 'fc1_weight'"),
    ("wd_mult", [("nopreset", 1.0)], ValueError, "wd_mult: unknown preset 'nopreset'"),
    ("lr_mult", 2.0, TypeError, "lr_mult: expected a dict"),
])
def test_base_arguments_are_checked(name, arg, value, exc, match):
  with pytest.raises(exc, match=match):
    MXNET[name](**{arg: value})


@pytest.mark.parametrize("name", ["adam", "sgd"])
def test_lazy_update_flag_and_scalar_leaf(name):
  with pytest.raises(TypeError, match="lazy_update: expected a bool"):
    MXNET[name](lazy_update="yes")
  tx = MXNET[name](lazy_update=True)
  with pytest.raises(ValueError, match="lazy_update: parameter 'step_scale' is 0-d"):
    tx.init({"w": jnp.ones(3), "step_scale": jnp.ones(())})


@pytest.mark.parametrize("name", list(MXNET))
def test_unknown_multiplier_name_fails_at_init(name):
  tx = MXNET[name](lr_mult={"fc1_wieght": 2.0}, wd_mult={"fc1_bias": 0.0})
  with pytest.raises(ValueError, match="lr_mult: no parameter is named 'fc1_wieght'"):
    tx.init(_params())


@pytest.mark.parametrize("name", list(MXNET))
def test_integer_params_rejected(name):
  with pytest.raises(TypeError, match="only real floating"):
    MXNET[name](wd=0.1).init({"w": jnp.ones(3, jnp.int32)})


# --------------------------------------------------------------------------
# lr_mult / wd_mult
# --------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(MXNET))
def test_lr_mult_zero_freezes_a_leaf(name):
  params, _ = _run(MXNET[name](wd=0.01, lr_mult={"fc1_bias": 0.0}))
  chex.assert_trees_all_equal(params["fc1_bias"], _params()["fc1_bias"])
  assert not np.allclose(params["fc1_weight"], _params()["fc1_weight"])


@pytest.mark.parametrize("name", ["adam", "signum", "signsgd", "sgd"])
def test_lr_mult_scales_one_step(name):
  tx_mult = MXNET[name](lr_mult=[(lars_optax.by_suffix("bias"), 3.0)])
  p, g = _params(), _grads()
  u1, _ = tx_mult.update(g, tx_mult.init(p), p)
  u0, _ = MXNET[name]().update(g, MXNET[name]().init(p), p)
  np.testing.assert_allclose(u1["fc1_bias"], 3.0 * u0["fc1_bias"], rtol=1e-6)
  np.testing.assert_allclose(u1["fc1_weight"], u0["fc1_weight"], rtol=0)


@pytest.mark.op_by_op
@pytest.mark.parametrize("name", list(MXNET))
def test_wd_mult_zero_equals_no_weight_decay_for_that_leaf(name):
  a, _ = _run(MXNET[name](wd=0.05, wd_mult={"fc1_bias": 0.0}))
  b, _ = _run(MXNET[name](wd=0.0))
  c, _ = _run(MXNET[name](wd=0.05))
  np.testing.assert_allclose(a["fc1_bias"], b["fc1_bias"], rtol=1e-6)
  np.testing.assert_allclose(a["fc1_weight"], c["fc1_weight"], rtol=1e-6)


# --------------------------------------------------------------------------
# dtypes, jit, composition
# --------------------------------------------------------------------------


@pytest.mark.op_by_op
@pytest.mark.filterwarnings("ignore::lars_optax.LowPrecisionWarning")  # float16 Adam
@pytest.mark.parametrize("name", list(MXNET))
@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16, jnp.float32])
def test_low_precision_keeps_its_dtype_end_to_end(name, dtype):
  tx = MXNET[name](wd=0.01)
  params, state = _run(tx, dtype=dtype)
  chex.assert_trees_all_equal_dtypes(params, _params(dtype))
  for leaf in jax.tree.leaves(state):
    if jnp.issubdtype(leaf.dtype, jnp.floating) and leaf.ndim > 1:
      assert leaf.dtype == dtype, (name, leaf.dtype)
  assert all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves(params))


@pytest.mark.parametrize("name", list(MXNET))
def test_jit_and_eager_agree(name):
  tx = MXNET[name](wd=0.01, rescale_grad=0.5, clip_gradient=0.3, lr_mult={"fc1_bias": 2.0})
  a, _ = _run(tx, jit=True)
  b, _ = _run(tx, jit=False)
  chex.assert_trees_all_close(a, b, rtol=1e-6)


@pytest.mark.op_by_op
@pytest.mark.parametrize("name", ["adam", "signum", "sgd"])
def test_schedule(name):
  sched = optax.exponential_decay(0.1, 1, 0.5)
  a, _ = _run(MXNET[name](learning_rate=sched), steps=1)
  b, _ = _run(MXNET[name](learning_rate=0.1), steps=1)
  chex.assert_trees_all_close(a, b, rtol=1e-6)


@pytest.mark.parametrize("name", list(MXNET))
def test_empty_tree(name):
  tx = MXNET[name](wd=0.1)
  updates, _ = tx.update({}, tx.init({}), {})
  assert updates == {}
