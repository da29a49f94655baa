"""Every bad input gets a clear error; every odd tree gets the right result.

Three tables, each run over every public optimizer (and over ``create``):

* bad hyperparameters, rejected at construction with a message that starts
  with the argument's name and states the accepted range;
* masks and names: bad masks, unknown presets, and names the user gave that
  match no leaf (``skip``, ``skip_list``, ``lr_mult``/``wd_mult`` rules),
  rejected at construction or ``init``; presets and ``Mask.optional()`` may
  match nothing;
* parameter and gradient trees, over every optimizer of ``tests/optimizers.py``'s
  table and the configurations it leaves out whose checks differ: mismatched trees
  and shapes, missing params, integer/complex leaves, 0-d and zero-size leaves,
  empty trees, ``None`` leaves, ``optax.MaskedNode`` leaves (inside
  ``optax.masked``) and gradients of another float dtype than their params.
"""

import inspect
import math
import re

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import public, x64
import optimizers

import lars_optax
from lars_optax import _validation as v
from lars_optax import _masks


# --------------------------------------------------------------------------
# Hyperparameters
# --------------------------------------------------------------------------

NAN, INF = math.nan, math.inf

# What is wrong with a value of each kind, and what the error says.
BAD = {
    "lr": [(-0.1, ValueError, "must be >= 0, got -0.1"),
           (NAN, ValueError, "must be finite and >= 0"),
           (-INF, ValueError, "must be finite and >= 0"),
           ("0.1", TypeError, "expected a real number >= 0 or an optax schedule"),
           (True, TypeError, "expected a real number >= 0"),
           (None, TypeError, "expected a real number >= 0"),
           (np.ones(2), TypeError, r"expected a real number >= 0 .*\(a real scalar\)"),
           (1j, TypeError, r"expected a real number >= 0 .*\(a real scalar\)")],
    "nonneg": [(-1e-3, ValueError, "must be >= 0, got -0.001"),
               (INF, ValueError, "must be finite and >= 0"),
               (np.float32("nan"), ValueError, "must be finite and >= 0"),
               ("1", TypeError, "expected a real number >= 0"),
               (None, TypeError, "expected a real number >= 0"),
               ([1e-3], TypeError, "expected a real number >= 0")],
    "unit": [(1.0, ValueError, r"must be in \[0, 1\), got 1"),
             (-0.1, ValueError, r"must be in \[0, 1\), got -0.1"),
             (NAN, ValueError, r"must be finite and in \[0, 1\)"),
             (True, TypeError, r"expected a real number in \[0, 1\)"),
             ("0.9", TypeError, r"expected a real number in \[0, 1\)")],
    "pos": [(0.0, ValueError, "must be > 0, got 0"),
            (-2.0, ValueError, "must be > 0, got -2"),
            (INF, ValueError, "must be finite and > 0"),
            ("2", TypeError, "expected a real number > 0")],
    "pos_or_none": [(0.0, ValueError, "must be > 0, got 0"),
                    (-1.0, ValueError, "must be > 0, got -1"),
                    (NAN, ValueError, "must be finite and > 0"),
                    ("1", TypeError, "expected a real number > 0")],
    "nonneg_or_none": [(-0.1, ValueError, "must be >= 0, got -0.1"),
                       (NAN, ValueError, "must be finite and >= 0"),
                       ("1", TypeError, "expected a real number >= 0 or None"),
                       ([1.0], TypeError, "expected a real number >= 0 or None")],
    "flag": [("yes", TypeError, "expected a bool"), (1, TypeError, "expected a bool"),
             (None, TypeError, "expected a bool")],
    "count": [(-1, ValueError, "expected an int >= 0"), (1.5, ValueError, "expected an int >= 0"),
              (True, ValueError, "expected an int >= 0")],
    # A step count: int32, and the first update's count (this + 1) must fit.
    "step": [(-1, ValueError, r"expected an int in \[0, 2147483646\] \(the step count is int32"),
             (1.5, ValueError, r"expected an int in \[0, 2147483646\]"),
             (True, ValueError, r"expected an int in \[0, 2147483646\]"),
             (2**31 - 1, ValueError, r"expected an int in \[0, 2147483646\] .*got 2147483647"),
             (2**31, ValueError, r"expected an int in \[0, 2147483646\] .*got 2147483648")],
    # A PRNG key: an int seed JAX keeps whole without x64, or a key array.
    "key": [(-1, ValueError, r"expected an int seed in \[0, 4294967295\] or a JAX PRNG key"),
            (2**32, ValueError, r"expected an int seed in \[0, 4294967295\] .*got 4294967296"),
            (1.5, TypeError, r"expected an int seed in \[0, 4294967295\] or a JAX PRNG key"),
            (True, TypeError, "expected an int seed"),
            ("0", TypeError, "expected an int seed"),
            (None, TypeError, "expected an int seed"),
            (np.zeros(3, np.uint32), TypeError,
             r"expected an int seed .*got an array of dtype uint32 and shape \(3,\)")],
    # A learning rate that is divided by (FTRL, FTML): > 0, or a schedule.
    "pos_lr": [(0.0, ValueError, "must be > 0, got 0"),
               (-0.1, ValueError, "must be > 0, got -0.1"),
               (NAN, ValueError, "must be finite and > 0"),
               ("0.1", TypeError, "expected a real number > 0 or an optax schedule"),
               (None, TypeError, "expected a real number > 0")],
    "finite": [(NAN, ValueError, "must be finite, got nan"),
               (INF, ValueError, "must be finite, got inf"),
               ("1", TypeError, "expected a real number, got '1'"),
               (None, TypeError, "expected a real number, got None")],
}

BASE = {"learning_rate": "lr", "wd": "nonneg", "rescale_grad": "pos",
        "clip_gradient": "pos_or_none", "multi_precision": "flag"}

# Every hyperparameter of every optimizer, with its kind.
ARGS = {
    "lars": {**BASE, "momentum": "unit", "eta": "nonneg", "epsilon": "nonneg"},
    "tf_lars": {"learning_rate": "lr", "momentum": "unit", "weight_decay": "nonneg",
                "eeta": "nonneg", "epsilon": "nonneg", "use_nesterov": "flag"},
    "signum": {**BASE, "momentum": "unit", "wd_lh": "nonneg"},
    "signsgd": {**BASE, "wd_lh": "nonneg"},
    "adam": {**BASE, "beta1": "unit", "beta2": "unit", "epsilon": "nonneg",
             "lazy_update": "flag", "begin_num_update": "step"},
    "sgd": {**BASE, "momentum": "unit", "lazy_update": "flag"},
    "nag": {**BASE, "momentum": "unit"},
    "dcasgd": {**BASE, "momentum": "unit", "lamda": "nonneg"},
    "sgld": {**BASE, "key": "key"},
    "adagrad": {**BASE, "epsilon": "nonneg"},
    "groupadagrad": {**{k: x for k, x in BASE.items() if k != "wd"}, "epsilon": "nonneg"},
    "rmsprop": {**BASE, "rho": "unit", "momentum": "unit", "epsilon": "pos", "centered": "flag",
                "clip_weights": "pos_or_none"},
    "adadelta": {**BASE, "rho": "unit", "epsilon": "pos"},
    "ftrl": {**BASE, "learning_rate": "pos_lr", "lamda1": "nonneg", "beta": "nonneg"},
    "lamb": {**BASE, "beta1": "unit", "beta2": "unit", "epsilon": "nonneg",
             "lower_bound": "nonneg_or_none", "upper_bound": "pos_or_none",
             "bias_correction": "flag"},
    "lans": {**BASE, "beta1": "unit", "beta2": "unit", "epsilon": "nonneg",
             "lower_bound": "nonneg_or_none", "upper_bound": "pos_or_none"},
    "adamw": {**BASE, "beta1": "unit", "beta2": "unit", "epsilon": "nonneg",
              "correct_bias": "flag", "begin_num_update": "step"},
    "adamax": {**BASE, "beta1": "unit", "beta2": "unit", "epsilon": "nonneg",
               "begin_num_update": "step"},
    "nadam": {**BASE, "beta1": "unit", "beta2": "unit", "epsilon": "nonneg",
              "schedule_decay": "nonneg", "begin_num_update": "step"},
    "adabelief": {**BASE, "beta1": "unit", "beta2": "unit", "epsilon": "nonneg",
                  "correct_bias": "flag", "begin_num_update": "step"},
    "ftml": {**BASE, "learning_rate": "pos_lr", "beta1": "unit", "beta2": "unit",
             "epsilon": "nonneg", "begin_num_update": "step"},
}

FACTORIES = {name: public(name) for name in ARGS}
REQUIRED = {"tf_lars": {"learning_rate": 0.1}}

# The building blocks' hyperparameters.
TRANSFORMS = {
    "scale_by_lars_trust_ratio": (lars_optax.scale_by_lars_trust_ratio, {},
                                  {"trust_coefficient": "nonneg", "ratio_weight_decay": "nonneg",
                                   "eps": "nonneg", "grad_scale": "pos"}),
    "mxnet_momentum": (lars_optax.mxnet_momentum, {"learning_rate": 0.1},
                       {"learning_rate": "lr", "momentum": "unit", "nesterov": "flag"}),
    "scale_by_mxnet_adam": (lars_optax.mxnet.scale_by_mxnet_adam, {},
                            {"b1": "unit", "b2": "unit", "eps": "nonneg",
                             "initial_count": "step"}),
    "add_delay_compensation": (lars_optax.mxnet.add_delay_compensation, {},
                               {"variance_control": "nonneg"}),
    "add_langevin_noise": (lars_optax.mxnet.add_langevin_noise, {"learning_rate": 0.1},
                           {"learning_rate": "lr", "key": "key"}),
    "scale_by_mxnet_adagrad": (lars_optax.mxnet.scale_by_mxnet_adagrad, {}, {"eps": "nonneg"}),
    "scale_by_group_adagrad": (lars_optax.mxnet.scale_by_group_adagrad, {}, {"eps": "nonneg"}),
    "clip_params": (lars_optax.mxnet.clip_params, {"max_abs": 1.0}, {"max_abs": "pos"}),
    "ftrl_proximal": (lars_optax.mxnet.ftrl_proximal, {"learning_rate": 0.1},
                      {"learning_rate": "pos_lr", "lamda1": "nonneg", "beta": "nonneg",
                       "weight_decay": "nonneg"}),
    "scale_by_adam_moments": (lars_optax.mxnet.scale_by_adam_moments, {},
                              {"b1": "unit", "b2": "unit", "eps": "nonneg"}),
    "scale_by_bias_correction": (lars_optax.mxnet.scale_by_bias_correction, {},
                                 {"b1": "unit", "b2": "unit", "initial_count": "step"}),
    "scale_by_mxnet_adamax": (lars_optax.mxnet.scale_by_mxnet_adamax, {},
                              {"b1": "unit", "b2": "unit", "eps": "nonneg"}),
    "scale_by_mxnet_belief": (lars_optax.mxnet.scale_by_mxnet_belief, {},
                              {"b1": "unit", "b2": "unit", "eps": "nonneg"}),
    "scale_by_mxnet_nadam": (lars_optax.mxnet.scale_by_mxnet_nadam, {},
                             {"b1": "unit", "b2": "unit", "eps": "nonneg",
                              "schedule_decay": "nonneg", "initial_count": "step"}),
    "scale_by_ftml": (lars_optax.mxnet.scale_by_ftml, {},
                      {"learning_rate": "pos_lr", "b1": "unit", "b2": "unit",
                       "eps": "nonneg", "initial_count": "step"}),
    "add_decayed_weights_per_leaf": (lars_optax.add_decayed_weights_per_leaf,
                                     {"weight_decay": 0.1}, {"weight_decay": "nonneg"}),
    "lars_trust_ratio": (lars_optax.lars_trust_ratio,
                         {"param": jnp.ones(3), "grad": jnp.ones(3)},
                         {"trust_coefficient": "nonneg", "ratio_weight_decay": "nonneg",
                          "eps": "nonneg", "grad_scale": "pos"}),
    "mxnet_schedule": (lars_optax.mxnet.mxnet_schedule, {"lr_scheduler": lambda n: 0.1},
                       {"begin_num_update": "step"}),
    "scale_by_lamb_trust_ratio": (lars_optax.scale_by_lamb_trust_ratio, {},
                                  {"lower_bound": "nonneg_or_none",
                                   "upper_bound": "pos_or_none"}),
    "scale_by_lans": (lars_optax.scale_by_lans, {},
                      {"b1": "unit", "b2": "unit", "eps": "nonneg", "weight_decay": "nonneg",
                       "lower_bound": "nonneg_or_none", "upper_bound": "pos_or_none"}),
    "scale_by_lamb_adam": (lars_optax.scale_by_lamb_adam, {},
                           {"b1": "unit", "b2": "unit", "eps": "nonneg",
                            "bias_correction": "flag"}),
}


def _cases(args):
  """Every (argument, bad value, error, message) of a function's argument kinds."""
  return [(arg, value, exc, msg) for arg, kind in args.items() for value, exc, msg in BAD[kind]]


def _check_all(call, args, keep=lambda arg, value: True):
  """``call(arg, value)`` raises the kind's error for every bad value of every argument.

  One test per function, all its cases inside: a failure lists each case that did
  not raise as expected (the argument, the value and what happened).
  """
  missed = []
  for arg, value, exc, msg in _cases(args):
    if not keep(arg, value):
      continue
    try:
      call(arg, value)
    except exc as e:
      if not re.search(rf"^{re.escape(arg)}: {msg}", str(e)):
        missed.append(f"{arg}={value!r}: {type(e).__name__}: {e}")
    except Exception as e:  # noqa: BLE001  (reported below, with the case)
      missed.append(f"{arg}={value!r}: {type(e).__name__}: {e}")
    else:
      missed.append(f"{arg}={value!r}: no error")
  assert not missed, "\n".join(missed)


@pytest.mark.parametrize("name", sorted(ARGS))
def test_bad_hyperparameters_are_named(name):
  _check_all(lambda arg, value: FACTORIES[name](**{**REQUIRED.get(name, {}), arg: value}),
             ARGS[name])


# create() takes learning_rate=None as MXNet does (the default rate), so that
# case is left out here (test_registry.py checks it).
@pytest.mark.parametrize("name", sorted(k for k in ARGS if k != "tf_lars"))
def test_bad_hyperparameters_through_create_are_named(name):
  _check_all(lambda arg, value: lars_optax.mxnet.create(name, **{arg: value}), ARGS[name],
             keep=lambda arg, value: not (arg == "learning_rate" and value is None))


# The argument kinds with no upper bound: 1e39 passes construction, and init
# rejects it for float32 params (beyond float32 whichever dtype it is used in).
UNBOUNDED = ("lr", "nonneg", "nonneg_or_none", "pos", "pos_or_none", "pos_lr")
# Arguments a float32 1e39 does not break, with why: clip_gradient=1e39 clips nothing.
BEYOND_FLOAT32_OK = {"clip_gradient", "clip_weights"}


@pytest.mark.parametrize("name", sorted(ARGS))
def test_every_unbounded_hyperparameter_is_checked_against_the_params_dtype_once(name):
  """Each argument is checked where it enters: the optimizer's first link names it at
  init (the links inside it no longer check it again)."""
  missed = []
  for arg, kind in ARGS[name].items():
    if kind not in UNBOUNDED or arg in BEYOND_FLOAT32_OK:
      continue
    tx = FACTORIES[name](**{**REQUIRED.get(name, {}), arg: 1e39})
    try:
      tx.init({"w": jnp.ones(2, jnp.float32)})
    except ValueError as e:
      if not str(e).startswith(f"{arg}: 1e+39 is beyond the range of float32"):
        missed.append(f"{arg}: {e}")
    else:
      missed.append(f"{arg}: no error")
  assert not missed, "\n".join(missed)


P = lars_optax.porting
PORTS = {  # every porting constructor, with the options that build all its links
    "timm_lars": lambda: P.timm_lars(0.1, momentum=0.9, weight_decay=1e-4, trust_clip=True),
    "timm_lamb": lambda: P.timm_lamb(caution=True),
    "timm_lambw": lambda: P.timm_optimizer("lambw", weight_decay=0.01),
    "timm_cadamw": lambda: P.timm_optimizer("cadamw", weight_decay=0.01),
    "torch_sparse_adam": lambda: P.torch_sparse_adam(),
    "keras_lamb": lambda: P.keras_lamb(weight_decay=0.01),
    "optax_lars": lambda: P.optax_lars(0.1, weight_decay=1e-4),
    "optax_lamb": lambda: P.optax_lamb(1e-3, weight_decay=0.01),
    "byol_lars": lambda: P.byol_lars(0.1, weight_decay=1e-6),
    "simclr_lars": lambda: P.simclr_lars(0.1, weight_decay=1e-6),
    "albert_lamb": lambda: P.albert_lamb(1e-3, weight_decay_rate=0.01),
}
GROUPED = {  # the same, stacked by shape: the links rebuilt at each trace
    "lars-group_by_shape": lambda: lars_optax.lars(0.1, momentum=0.9, wd=1e-4,
                                                   group_by_shape=True),
    "tf_lars-group_by_shape": lambda: lars_optax.tf_lars(0.1, group_by_shape=True),
    "lamb-group_by_shape": lambda: lars_optax.lamb(1e-3, wd=0.01, group_by_shape=True),
    "lans-group_by_shape": lambda: lars_optax.lans(1e-3, wd=0.01, group_by_shape=True),
    "timm_lamb-group_by_shape": lambda: P.timm_lamb(caution=True, group_by_shape=True),
    "optax_lars-group_by_shape": lambda: P.optax_lars(0.1, weight_decay=1e-4,
                                                      group_by_shape=True),
}
ONCE = {**{name: lambda name=name: FACTORIES[name](**REQUIRED.get(name, {})) for name in ARGS},
        **PORTS, **GROUPED}


# torch's SparseAdam is MXNet's lazy Adam: its update's structure check is lazy_update's.
UPDATE_NAME = {"torch_sparse_adam": "lazy_update"}


@pytest.mark.parametrize("name", sorted(ONCE))
def test_bad_trees_are_refused_where_they_enter_under_the_optimizers_name(name):
  """What a user sees of the checks: a params tree the optimizer cannot take is refused
  at init, and gradients of another structure at update, each under the optimizer's
  own name, whether its links are built per leaf or by shape."""
  own = name.split("-")[0]
  tx = ONCE[name]()
  with pytest.raises(TypeError, match=rf"^{own}: parameter 'w' has dtype int32; only real "):
    tx.init({"w": jnp.ones(2, jnp.int32)})
  params = {"w": jnp.ones(2)}
  state = tx.init(params)
  with pytest.raises(ValueError, match=rf"^{UPDATE_NAME.get(own, own)}: gradients and params "
                     "have different tree structures"):
    tx.update({"v": jnp.ones(2)}, state, params)
  tx.update({"w": jnp.ones(2)}, state, params)  # and takes the right ones


@pytest.mark.parametrize("make", [
    lars_optax.lamb, lars_optax.lans, lars_optax.scale_by_lamb_trust_ratio,
    lars_optax.scale_by_lans, lambda **kw: lars_optax.mxnet.create("lamb", **kw)],
    ids=["lamb", "lans", "scale_by_lamb_trust_ratio", "scale_by_lans", "create"])
def test_lower_bound_above_upper_bound_names_both(make):
  with pytest.raises(ValueError, match=r"^lower_bound: must be <= upper_bound .*got "
                     r"lower_bound=2 and upper_bound=1\.5\.$"):
    make(lower_bound=2.0, upper_bound=np.float32(1.5))
  make(lower_bound=1.5, upper_bound=1.5)  # equal bounds: the norm is fixed


@pytest.mark.parametrize("name", sorted(TRANSFORMS))
def test_bad_transformation_hyperparameters_are_named(name):
  fn, required, args = TRANSFORMS[name]
  _check_all(lambda arg, value: fn(**{**required, arg: value}), args)


@pytest.mark.parametrize("fn", [lars_optax.sparse.lazy_update, lars_optax.multi_precision,
                                lars_optax.skip_nonfinite,
                                lars_optax.scale_by_lars_trust_ratio])
@pytest.mark.parametrize("inner", ["sgd", lars_optax.mxnet.sgd, lambda g, s, p: (g, s)])
def test_wrappers_need_a_transformation(fn, inner):
  with pytest.raises(TypeError, match=r"^inner: expected an optax.GradientTransformation"):
    fn(inner)


@pytest.mark.parametrize("value", [-1, 1.5, True, "3"])
def test_skip_nonfinite_max_consecutive_errors(value):
  with pytest.raises(ValueError, match=r"^max_consecutive_errors: expected None or an int >= 0"):
    lars_optax.skip_nonfinite(lars_optax.mxnet.sgd(), max_consecutive_errors=value)


def _loss(params, batch):
  return jnp.sum(params["w"]) * 0.0


# Every public building block's other arguments: (call, exception, message).
BLOCKS = {
    "lars_trust_ratio-param": (lambda: lars_optax.lars_trust_ratio(
        jnp.ones(3, jnp.int32), jnp.ones(3)), TypeError, r"^param: expected a real floating"),
    "lars_trust_ratio-grad": (lambda: lars_optax.lars_trust_ratio(
        jnp.ones(3), jnp.ones(3, jnp.complex64)), TypeError, r"^grad: expected a real floating"),
    "lars_trust_ratio-axis_name": (lambda: lars_optax.lars_trust_ratio(
        jnp.ones(3), jnp.ones(3), axis_name=3), TypeError, r"^axis_name: expected None"),
    "scale_by_lars_trust_ratio-axis_name": (lambda: lars_optax.scale_by_lars_trust_ratio(
        axis_name=""), TypeError, r"^axis_name: expected None"),
    "scale_per_leaf-negative": (lambda: lars_optax.scale_per_leaf({"w": -1.0}), ValueError,
                                r"^multipliers: the value for 'w' must be finite and >= 0"),
    "scale_per_leaf-arg_name": (lambda: lars_optax.scale_per_leaf(
        {"w": NAN}, arg_name="lr_mult"), ValueError, r"^lr_mult: the value for 'w'"),
    "scale_per_leaf-type": (lambda: lars_optax.scale_per_leaf(3), TypeError,
                            r"^multipliers: expected a dict"),
    "add_decayed_weights_per_leaf-multipliers": (
        lambda: lars_optax.add_decayed_weights_per_leaf(0.1, multipliers={"w": NAN}), ValueError,
        r"^multipliers: the value for 'w' must be finite"),
    "check_inputs-name": (lambda: lars_optax.check_inputs(3), TypeError,
                          r"^name: expected a string"),
    "check_inputs-names": (lambda: lars_optax.check_inputs(names=[("skip",)]), TypeError,
                           r"^names: expected a sequence of 3-tuples"),
    "check_inputs-names-mask": (lambda: lars_optax.check_inputs(
        names=[("skip", "nopreset", None)]), ValueError, r"^skip: unknown preset 'nopreset'"),
    "check_inputs-leaf_values": (lambda: lars_optax.check_inputs(
        leaf_values=[("lr_mult", {"w": -1.0})]), ValueError, r"^lr_mult: the value for 'w'"),
    "check_inputs-hyperparams": (lambda: lars_optax.check_inputs(hyperparams=3), TypeError,
                                 r"^hyperparams: expected a sequence of 2-tuples"),
    "lazy_update-axis_name": (lambda: lars_optax.sparse.lazy_update(lars_optax.mxnet.sgd(),
                                                                    axis_name=3),
                              TypeError, r"^axis_name: expected None"),
    "present_rows-type": (lambda: lars_optax.sparse.present_rows([1.0, 2.0]), TypeError,
                          r"^grad: expected an array"),
    "present_rows-0d": (lambda: lars_optax.sparse.present_rows(jnp.ones(())), ValueError,
                        r"^grad: a 0-d array has no rows"),
    "svrg_due-update_freq": (lambda: lars_optax.svrg.due(0, update_freq=0), ValueError,
                             r"^update_freq: expected an int >= 1"),
    "svrg_due-epoch": (lambda: lars_optax.svrg.due(-1, update_freq=1), ValueError,
                       r"^epoch: expected an int >= 0"),
    "svrg_value_and_grads-loss_fn": (lambda: lars_optax.svrg.value_and_grads(3), TypeError,
                                     r"^loss_fn: expected a callable"),
    "svrg_value_and_grads-axis_name": (lambda: lars_optax.svrg.value_and_grads(
        _loss, axis_name=3), TypeError, r"^axis_name: expected None"),
    "svrg_value_and_grads-jit": (lambda: lars_optax.svrg.value_and_grads(_loss, jit="yes"),
                                 TypeError, r"^jit: expected a bool"),
    "full_gradient-loss_fn": (lambda: lars_optax.svrg.full_gradient(3, {}, []), TypeError,
                              r"^loss_fn: expected a callable"),
    "full_gradient-batch_size": (lambda: lars_optax.svrg.full_gradient(
        _loss, {"w": jnp.ones(2)}, (jnp.ones((4, 1)),), batch_size=0), ValueError,
        r"^batch_size: expected an int >= 1"),
    "full_gradient-axis_name": (lambda: lars_optax.svrg.full_gradient(
        _loss, {"w": jnp.ones(2)}, [jnp.ones((1, 1))], axis_name=3), TypeError,
        r"^axis_name: expected None"),
    "mxnet_schedule-lr_scheduler": (lambda: lars_optax.mxnet.mxnet_schedule(3), TypeError,
                                    r"^lr_scheduler: expected a callable"),
    "trust_ratios-state": (lambda: lars_optax.trust_ratios(3), ValueError,
                           r"^state: no ScaleByLarsTrustRatioState found"),
    "master_params-state": (lambda: lars_optax.master_params(3, {}), ValueError,
                            r"^state: no MultiPrecisionState found"),
    "svrg_snapshot-state": (lambda: lars_optax.svrg.snapshot(3), ValueError,
                            r"^state: no SVRGState found"),
}


@pytest.mark.parametrize("name", sorted(BLOCKS))
def test_building_block_bad_argument(name):
  call, exc, msg = BLOCKS[name]
  with pytest.raises(exc, match=msg):
    call()


# --------------------------------------------------------------------------
# Step counts and values beyond the params' dtype
# --------------------------------------------------------------------------

LARGEST_BEGIN = 2**31 - 2


@pytest.mark.numeric
def test_begin_num_update_at_its_largest_value_gives_the_converged_bias_correction():
  # t = 2**31 - 1 at the first step and stays there: both bias corrections are 1.
  tx = lars_optax.mxnet.adam(0.1, begin_num_update=LARGEST_BEGIN)
  params = {"w": jnp.ones(3)}
  state, update = tx.init(params), jax.jit(tx.update)
  m = v = 0.0
  for k in range(3):
    g = 0.5 * (k + 1)
    updates, state = update({"w": jnp.full(3, g)}, state, params)
    m, v = 0.9 * m + 0.1 * g, 0.999 * v + 0.001 * g * g
    np.testing.assert_allclose(updates["w"], -0.1 * m / (np.sqrt(v) + 1e-8), rtol=1e-5)


def test_begin_num_update_at_its_largest_value_through_create():
  seen = []
  tx = lars_optax.mxnet.create("sgd", lr_scheduler=lambda n: seen.append(int(n)) or 0.1,
                         begin_num_update=LARGEST_BEGIN)
  params = {"w": jnp.ones(2)}
  state = tx.init(params)
  for _ in range(2):  # the count stops at the int32 maximum instead of wrapping around
    updates, state = tx.update({"w": jnp.ones(2)}, state, params)
    chex.assert_tree_all_finite(updates)
  # The scheduler sees the int32 maximum (the host path calls it once per count,
  # and the saturated count repeats).
  assert seen and set(seen) == {2**31 - 1}
  with pytest.raises(ValueError, match=r"^begin_num_update: expected an int in \[0, 2147483646\]"):
    lars_optax.mxnet.create("adam", begin_num_update=LARGEST_BEGIN + 1)


# (optimizer, argument, value, params dtype): each overflows the dtype it meets.
BEYOND = [
    (lambda **kw: lars_optax.mxnet.sgd(**kw), "learning_rate", 1e39, jnp.float32),
    (lambda **kw: lars_optax.mxnet.sgd(**kw), "learning_rate", 1e5, jnp.float16),
    (lambda **kw: lars_optax.mxnet.sgd(**kw), "wd", 1e5, jnp.float16),
    (lambda **kw: lars_optax.lars(**kw), "rescale_grad", 1e5, jnp.float16),
    (lambda **kw: lars_optax.lars(**kw), "eta", 1e39, jnp.float16),  # used in float32
    (lambda **kw: lars_optax.tf_lars(0.1, **kw), "eeta", 1e39, jnp.float32),
    (lambda **kw: lars_optax.signum(**kw), "wd_lh", 1e5, jnp.float16),
    (lambda **kw: lars_optax.signsgd(**kw), "learning_rate", np.float32(1e5), jnp.float16),
    (lambda **kw: lars_optax.mxnet.adam(**kw), "learning_rate", jnp.float32(1e5), jnp.float16),
    (lambda **kw: lars_optax.mxnet_momentum(**kw), "learning_rate", 1e39, jnp.float32),
    (lambda **kw: lars_optax.mxnet.ftrl(**kw), "lamda1", 1e5, jnp.float16),
    (lambda **kw: lars_optax.mxnet.rmsprop(**kw), "epsilon", 1e39, jnp.float32),
    (lambda **kw: lars_optax.add_decayed_weights_per_leaf(**kw), "weight_decay", 1e5,
     jnp.float16),
]


@pytest.mark.filterwarnings("ignore::lars_optax.LowPrecisionWarning")
@pytest.mark.parametrize("make, arg, value, dtype", BEYOND,
                         ids=[f"{a}={float(v):g}-{jnp.dtype(d).name}" for _, a, v, d in BEYOND])
def test_hyperparameter_beyond_the_params_dtype_is_rejected_at_init(make, arg, value, dtype):
  tx = make(**{arg: value})
  # eta/eeta are used in the float32-or-wider dtype of the norms.
  shown = jnp.promote_types(dtype, jnp.float32) if arg in ("eta", "eeta") else jnp.dtype(dtype)
  with pytest.raises(ValueError, match=rf"^{arg}: {re.escape(f'{float(value):g}')} is beyond "
                     rf"the range of {shown.name} .*parameter 'w'"):
    tx.init({"w": jnp.ones(2, dtype), "z": jnp.ones(2, jnp.float32)})


def test_hyperparameter_that_fits_with_master_weights_or_float64_is_accepted():
  lars_optax.mxnet.sgd(1e5, multi_precision=True).init({"w": jnp.ones(2, jnp.float16)})
  lars_optax.lars(eta=1e5).init({"w": jnp.ones(2, jnp.float16)})  # the ratio is float32
  # schedules: unchecked
  lars_optax.mxnet.sgd(optax.constant_schedule(1e39)).init({"w": jnp.ones(2)})
  with x64():
    lars_optax.mxnet.sgd(1e39).init({"w": jnp.ones(2, jnp.float64)})


@pytest.mark.op_by_op
@pytest.mark.parametrize("name", sorted(ARGS))
def test_valid_edge_values_are_accepted(name):
  """The closed ends of every range (0 where >= 0 is allowed, numpy scalars)."""
  kwargs = {arg: 0.0 for arg, kind in ARGS[name].items() if kind in ("lr", "nonneg", "unit")}
  kwargs.update({arg: np.float32(1.0) for arg, kind in ARGS[name].items() if kind == "pos"})
  tx = FACTORIES[name](**kwargs)
  params = {"w": jnp.ones((2, 3))}
  updates, _ = tx.update({"w": jnp.ones((2, 3))}, tx.init(params), params)
  chex.assert_tree_all_finite(updates)


# --------------------------------------------------------------------------
# Masks and names
# --------------------------------------------------------------------------


def _tree():
  return {"fc1_weight": jnp.ones((3, 2)), "fc1_bias": jnp.ones(2),
          "conv": {"kernel": jnp.ones((2, 2)), "bias": jnp.ones(2)}}


@pytest.mark.parametrize("skip, exc, msg", [
    ("bias", ValueError, r"skip: unknown preset 'bias'; valid presets are \['equinox', 'flax'"),
    (3, TypeError, "skip: expected a mask"),
    (0.5, TypeError, "skip: expected a mask"),
    (np.int64(1), TypeError, "skip: expected a mask"),
    (np.float32(0.5), TypeError, "skip: expected a mask"),
    (jnp.int32(1), TypeError, "skip: expected a mask"),
    (1 + 0j, TypeError, "skip: expected a mask"),
    (np.array([1, 0]), TypeError, "skip: expected a mask"),
    (b"bias", TypeError, "skip: expected a mask"),
    (["bias"], TypeError, r"skip: expected a mask.*got the strings \['bias'\].*by_substring"),
    (("gamma", "beta"), TypeError, "skip: expected a mask.*by_suffix"),
])
@pytest.mark.parametrize("arg", ["skip", "wd_skip"])
def test_lars_bad_skip_at_construction(skip, exc, msg, arg):
  with pytest.raises(exc, match=re.sub(r"^(\^?)skip:", rf"\1{arg}:", msg)):
    lars_optax.lars(**{arg: skip})


@pytest.mark.parametrize("skip, exc, msg", [
    ({"fc1_weight": True}, ValueError, "skip: the mask's tree structure does not match"),
    (lambda p: jax.tree.map(lambda _: 1, p), TypeError, "skip: expected a Python bool"),
    (lars_optax.by_suffix("bais"), ValueError,
     (r"^skip: no parameter name ends with 'bais' \(names look like \['conv/bias', "
      r"'conv/kernel', 'fc1_bias'\], 4 in all;.*mask.optional\(\)")),
    (lars_optax.by_leaf_name("bais", "bias"), ValueError,
     "skip: no parameter name has the last component 'bais'"),
    (lars_optax.by_regex(r"^Dense_\d"), ValueError,
     r"skip: no parameter name matches the regex '\^Dense_\\\\d'"),
    (lars_optax.masks.FLAX_SKIP | lars_optax.by_substring("embeding"), ValueError,
     "skip: no parameter name contains 'embeding'"),
    (~lars_optax.by_substring("bn") & lars_optax.by_suffix("wieght"), ValueError,
     "skip: no parameter name contains 'bn', and none ends with 'wieght'"),
])
@pytest.mark.parametrize("arg", ["skip", "wd_skip"])
def test_lars_bad_skip_at_init(skip, exc, msg, arg):
  tx = lars_optax.lars(**{arg: skip})  # decided on the params, at init
  with pytest.raises(exc, match=re.sub(r"^(\^?)skip:", rf"\1{arg}:", msg)):
    tx.init(_tree())


@pytest.mark.parametrize("skip", [
    "flax", "haiku", lars_optax.masks.HAIKU_SKIP,  # presets may match nothing
    lars_optax.by_suffix("bais").optional(),
    lars_optax.by_substring("embedding").optional() | lars_optax.masks.MXNET_SKIP,
    lars_optax.by_suffix("weight") & lars_optax.by_ndim(1),  # names match; selects nothing
    lars_optax.by_predicate(lambda n, x: False),
    lambda p: jax.tree.map(lambda _: False, p),
    None,
])
def test_lars_skip_that_may_match_nothing(skip):
  tx = lars_optax.lars(skip=skip)
  params = _tree()
  updates, _ = tx.update(params, tx.init(params), params)
  chex.assert_tree_all_finite(updates)


def test_names_are_not_checked_on_an_empty_tree():
  tx = lars_optax.lars(skip=lars_optax.by_suffix("bais"), wd=0.1,
                       wd_mult=[(lars_optax.by_suffix("bais"), 0.0)])
  assert tx.update({}, tx.init({}), {})[0] == {}


def test_names_routed_elsewhere_by_optax_masked_count_as_matching():
  """Inside optax.masked the other leaves are MaskedNode placeholders; their names count."""
  params = {"w": jnp.ones((2, 3)), "fc_bias": jnp.ones(3)}
  route = {"w": True, "fc_bias": False}
  optax.masked(lars_optax.lars(skip=lars_optax.by_suffix("bias")), route).init(params)
  with pytest.raises(ValueError, match="skip: no parameter name ends with 'bais'"):
    optax.masked(lars_optax.lars(skip=lars_optax.by_suffix("bais")), route).init(params)


def test_unmatched_and_check_matches():
  mask = lars_optax.by_suffix("bias", "gamma") | lars_optax.by_leaf_name("kernel")
  assert mask.unmatched(_tree()) == ["ends with 'gamma'"]
  assert mask.optional().unmatched(_tree()) == []
  assert repr(mask.optional()) == repr(mask)
  assert mask.optional()(_tree()) == mask(_tree())
  with pytest.raises(ValueError, match=r"^my_arg: no parameter name ends with 'gamma'"):
    _masks.check_matches(mask, _tree(), "my_arg")
  _masks.check_matches(mask, {}, "my_arg")
  _masks.check_matches("mxnet", _tree(), "my_arg")
  # Calling a mask (as optax does) never checks.
  assert lars_optax.by_suffix("bais")(_tree())["fc1_bias"] is False


@pytest.mark.parametrize("skip_list, exc, msg", [
    ("bias", TypeError, r"skip_list: expected a list of strings.*\['bias'\]"),
    ([3], TypeError, "skip_list: expected non-empty strings"),
    (["bias", ""], TypeError, "skip_list: expected non-empty strings"),
    (123, TypeError, r"^skip_list: expected a list of strings, got 123"),
    (b"bias", TypeError, r"^skip_list: expected a list of strings"),
    ([b"bias"], TypeError, "skip_list: expected non-empty strings"),
])
def test_tf_lars_bad_skip_list_at_construction(skip_list, exc, msg):
  with pytest.raises(exc, match=msg):
    lars_optax.tf_lars(0.1, skip_list=skip_list)


@pytest.mark.parametrize("skip_list, msg", [
    (["batchnorm"], r"^skip_list: no parameter name contains 'batchnorm' \(names look like"),
    (["bias", "batch_normalization"], ("skip_list: no parameter name contains "
                                       "'batch_normalization'.*Fix the entry or leave it out")),
])
def test_tf_lars_skip_list_entry_matching_nothing(skip_list, msg):
  tx = lars_optax.tf_lars(0.1, skip_list=skip_list)
  with pytest.raises(ValueError, match=msg):
    tx.init(_tree())
  lars_optax.tf_lars(0.1, skip_list=["bias", "conv"]).init(_tree())  # all match: fine


def test_tf_lars_skip_list_error_says_how_to_make_an_entry_optional():
  """A model without biases (Gemma): the message names the optional form."""
  params = {"attn": {"kernel": jnp.ones((2, 2))}, "norm": {"scale": jnp.ones(2)}}
  with pytest.raises(ValueError, match=re.escape(
      "skip=lars_optax.by_substring('bias', 'scale').optional() instead of skip_list")):
    lars_optax.tf_lars(0.1, skip_list=["bias", "scale"]).init(params)
  tx = lars_optax.tf_lars(0.1, skip=lars_optax.by_substring("bias", "scale").optional())
  _, state = tx.update(params, tx.init(params), params)
  assert float(lars_optax.trust_ratios(state, params)["norm/scale"]) == 1.0


@pytest.mark.parametrize("skip", [
    "mxnet", lars_optax.by_suffix("bias"), {"fc1_weight": False, "fc1_bias": True,
                                             "conv": {"kernel": False, "bias": True}},
    lambda p: jax.tree.map(lambda x: x.ndim == 1, p),
], ids=["preset", "mask", "bool_tree", "callable"])
def test_tf_lars_skip_takes_what_lars_takes(skip):
  params = _tree()
  tx = lars_optax.tf_lars(0.1, momentum=0.0, skip=skip)
  ref = lars_optax.tf_lars(0.1, momentum=0.0, skip_list=["bias"])
  grads = jax.tree.map(lambda x: 0.5 * x, params)
  u, s = tx.update(grads, tx.init(params), params)
  u_ref, s_ref = ref.update(grads, ref.init(params), params)
  chex.assert_trees_all_equal(u, u_ref)
  chex.assert_trees_all_equal(lars_optax.trust_ratios(s), lars_optax.trust_ratios(s_ref))


def test_tf_lars_skip_and_skip_list_together_are_rejected():
  with pytest.raises(ValueError, match=r"^skip_list: give skip_list or skip, not both"):
    lars_optax.tf_lars(0.1, skip_list=["bias"], skip="flax")


@pytest.mark.parametrize("skip, exc, msg", [
    ("bias", ValueError, "^skip: unknown preset 'bias'"),
    (np.int64(1), TypeError, "^skip: expected a mask"),
])
def test_tf_lars_bad_skip_at_construction(skip, exc, msg):
  with pytest.raises(exc, match=msg):
    lars_optax.tf_lars(0.1, skip=skip)


def test_tf_lars_skip_mask_matching_nothing_at_init():
  with pytest.raises(ValueError, match=r"^skip: no parameter name ends with 'bais'"):
    lars_optax.tf_lars(0.1, skip=lars_optax.by_suffix("bais")).init(_tree())


@pytest.mark.parametrize("name", ["lars", "tf_lars", "signum", "adam", "sgd"])
@pytest.mark.parametrize("leaf", [1.0, 2], ids=["float", "int"])
def test_python_scalar_params_rejected_at_init(name, leaf):
  with pytest.raises(TypeError, match=rf"^{name}: parameter 'w' is a Python "
                                      rf"{type(leaf).__name__}, not an array"):
    FACTORIES[name](**REQUIRED.get(name, {})).init({"w": leaf, "b": jnp.ones(2)})


@pytest.mark.parametrize("name", ["lars", "tf_lars", "signum", "adam", "sgd"])
def test_python_scalar_gradients_rejected(name):
  params = {"w": jnp.ones(())}
  tx = FACTORIES[name](**REQUIRED.get(name, {}))
  with pytest.raises(TypeError, match=f"^{name}: gradient 'w' is a Python float"):
    tx.update({"w": 1.0}, tx.init(params), params)


@pytest.mark.parametrize("make", [
    lambda: lars_optax.lars(),
    lambda: lars_optax.tf_lars(0.1, skip_list=["b"]),
    lambda: lars_optax.mxnet.sgd(lr_mult={"a/b": 0.5}),
    lambda: lars_optax.mxnet.adam(wd=0.1, wd_mult=[("mxnet", 0.0)]),
    lambda: lars_optax.scale_per_leaf({"a/b": 2.0}),
    lambda: lars_optax.scale_by_lars_trust_ratio(),
], ids=["lars", "tf_lars", "lr_mult", "wd_mult", "scale_per_leaf", "trust_ratio"])
def test_leaves_sharing_a_name_are_rejected_at_init(make):
  """The key ``"a/b"`` and the nested keys ``a``, ``b`` both render as ``a/b``."""
  params = {"a/b": jnp.ones((2, 2)), "a": {"b": jnp.ones(2)}}
  with pytest.raises(ValueError, match=re.escape(
      "params: the leaves at ['a']['b'] and ['a/b'] share the name 'a/b'")):
    make().init(params)


def test_leaves_sharing_a_name_are_fine_where_names_are_not_used():
  params = {"a/b": jnp.ones((2, 2)), "a": {"b": jnp.ones(2)}}
  tx = lars_optax.mxnet.sgd(0.1, momentum=0.9)
  tx.update(params, tx.init(params), params)


def test_trust_ratios_rejects_leaves_sharing_a_name():
  params = {"a/b": jnp.ones((2, 2)), "a": {"b": jnp.ones(2)}}
  other = {"p": jnp.ones((2, 2)), "q": jnp.ones(2)}
  tx = lars_optax.lars(skip=None)
  _, state = tx.update(other, tx.init(other), other)
  with pytest.raises(ValueError, match="params: the leaves at"):
    lars_optax.trust_ratios(state, params)


MXNET = ["lars", "signum", "signsgd", "adam", "sgd", "adagrad", "rmsprop", "adadelta", "ftrl"]


@pytest.mark.parametrize("name", MXNET)
@pytest.mark.parametrize("arg", ["lr_mult", "wd_mult"])
@pytest.mark.parametrize("spec, exc, msg", [
    ({"fc1_weight": -1.0}, ValueError, "the value for 'fc1_weight' must be finite and >= 0"),
    ({"fc1_weight": NAN}, ValueError, "the value for 'fc1_weight' must be finite and >= 0"),
    ({"fc1_weight": "2"}, TypeError, "the value for 'fc1_weight' must be a real number"),
    ({3: 1.0}, TypeError, r"dict keys must be leaf names \(str\)"),
    (2.0, TypeError, r"expected a dict \{leaf name: value\} or a list of \(mask, value\)"),
    ("fc1_weight", TypeError, "expected a dict"),
    ([("bias", 0.0)], ValueError, "unknown preset 'bias'"),
    ([(None, 0.0)], TypeError, "a rule's mask is None"),
    ([("mxnet",)], TypeError, r"expected \(mask, value\) pairs"),
    ([(lars_optax.masks.MXNET_SKIP, -1.0)], ValueError,
     r"the value for Mask\(suffix in .*\) must be finite and >= 0"),
])
def test_bad_leaf_values_at_construction(name, arg, spec, exc, msg):
  with pytest.raises(exc, match=f"^{arg}: {msg}"):
    FACTORIES[name](**{arg: spec})


@pytest.mark.parametrize("name", MXNET)
@pytest.mark.parametrize("arg", ["lr_mult", "wd_mult"])
@pytest.mark.parametrize("wd", [0.0, 1e-3], ids=["wd0", "wd"])
@pytest.mark.parametrize("spec, msg", [
    ({"fc1_wieght": 2.0}, r"no parameter is named 'fc1_wieght' \(did you mean \['fc1_weight'\]"),
    ([(lars_optax.by_suffix("bais"), 0.0)], "no parameter name ends with 'bais'"),
    ([("mxnet", 0.0), (lars_optax.by_leaf_name("kernal"), 2.0)],
     "no parameter name has the last component 'kernal'"),
])
def test_leaf_value_names_matching_nothing_fail_at_init(name, arg, wd, spec, msg):
  # With wd=0 wd_mult is unused, and a typo in it is still an error.
  tx = FACTORIES[name](wd=wd, **{arg: spec})
  with pytest.raises(ValueError, match=f"^{arg}: {msg}"):
    tx.init(_tree())


@pytest.mark.op_by_op
@pytest.mark.parametrize("name", MXNET)
def test_leaf_value_presets_may_match_nothing(name):
  tx = FACTORIES[name](wd=1e-3, lr_mult=[("flax", 2.0)], wd_mult=[("haiku", 0.0)])
  params = _tree()
  updates, _ = tx.update(params, tx.init(params), params)
  chex.assert_tree_all_finite(updates)


@pytest.mark.parametrize("make", [
    lambda m: lars_optax.scale_by_lars_trust_ratio(skip=m),
    lambda m: lars_optax.scale_by_lars_trust_ratio(ratio_weight_decay=0.1, wd_mult=[(m, 0.0)]),
    lambda m: lars_optax.scale_per_leaf([(m, 2.0)]),
    lambda m: lars_optax.add_decayed_weights_per_leaf(0.1, multipliers=[(m, 0.0)]),
], ids=["lars_skip", "lars_wd_mult", "scale_per_leaf", "add_decayed_weights_per_leaf"])
def test_transformations_check_names_at_init(make):
  with pytest.raises(ValueError, match="no parameter name contains 'batchnorm'"):
    make(lars_optax.by_substring("batchnorm")).init(_tree())
  make(lars_optax.by_substring("batchnorm").optional()).init(_tree())


# --------------------------------------------------------------------------
# Parameter and gradient trees, for every optimizer
# --------------------------------------------------------------------------

# Every optimizer of the table (tests/optimizers.py), beside the configurations it leaves
# out whose checks differ: master weights, the lazy steps, rmsprop's centered form.
VARIANTS = {o.name: o.make for o in optimizers.TABLE} | {
    "lars_mp": lambda: lars_optax.lars(0.1, momentum=0.9, wd=1e-3, multi_precision=True),
    "mxnet.adam_lazy": lambda: lars_optax.mxnet.adam(0.1, wd=1e-3, lazy_update=True),
    "mxnet.sgd_lazy_mp": lambda: lars_optax.multi_precision(
        lars_optax.mxnet.sgd(0.1, momentum=0.9, wd=1e-3, lazy_update=True)),
    "mxnet.rmsprop_centered_mp": lambda: lars_optax.mxnet.rmsprop(
        0.01, centered=True, clip_weights=2.0, wd=1e-3, multi_precision=True),
}
# The lazy steps (rows of a leaf), which refuse a 0-d leaf.
LAZY = {"mxnet.adam_lazy", "mxnet.sgd_lazy_mp", "porting.torch_sparse_adam"}

# The trees are checked by the first link every optimizer shares (check_inputs) and
# the wrappers around it: the whole matrix of bad and odd trees runs on one
# representative per family in the default tier (the rest in the slow one), and every
# optimizer is seen refusing a gradient of another shape under its own name.
FAMILIES = {"lars", "tf_lars", "lamb", "mxnet.adam", "mxnet.adam_lazy", "sparse.adam",
            "porting.timm_lamb", "lars_mp", "mxnet.sgd_lazy_mp"}
TREE_MATRIX = [n if n in FAMILIES else pytest.param(n, marks=pytest.mark.slow)
               for n in sorted(VARIANTS)]


def _params(dtype=jnp.float32):
  return {"w": jnp.arange(1.0, 7.0, dtype=dtype).reshape(2, 3),
          "fc_bias": jnp.array([0.5, -0.5, 1.0], dtype)}


def _grads(params):
  return jax.tree.map(lambda p: (0.1 * p + 0.05).astype(p.dtype), params)


def _step(tx, params, grads, jit=False):
  update = jax.jit(tx.update) if jit else tx.update
  return update(grads, tx.init(params), params)


@pytest.mark.parametrize("name", TREE_MATRIX)
@pytest.mark.parametrize("grads, msg", [
    ({"w": jnp.ones((2, 3))}, r"missing from gradients: \['fc_bias'\]"),
    ({"w": jnp.ones((2, 3)), "fc_bias": jnp.ones(3), "extra": jnp.ones(1)},
     r"not in params: \['extra'\]"),
    ({"w": jnp.ones((3,)), "fc_bias": jnp.ones(3)},
     r"gradient 'w' has shape \(3,\) but the parameter has shape \(2, 3\)"),
    ({"w": jnp.ones((1, 3)), "fc_bias": jnp.ones(3)}, r"gradient 'w' has shape \(1, 3\)"),
    ({"w": jnp.ones((2, 3)), "fc_bias": jnp.ones(())}, r"gradient 'fc_bias' has shape \(\)"),
    ([jnp.ones((2, 3)), jnp.ones(3)], "different tree structures"),
], ids=["missing", "extra", "rank", "broadcastable", "scalar", "container"])
def test_mismatched_gradients(name, grads, msg):
  tx = VARIANTS[name]()
  params = _params()
  state = tx.init(params)
  with pytest.raises(ValueError, match=msg):
    tx.update(grads, state, params)


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_every_optimizer_refuses_a_gradient_of_another_shape_by_its_name(name):
  tx = VARIANTS[name]()
  params = _params()
  with pytest.raises(ValueError, match=r"gradient 'w' has shape \(3,\) but the parameter has "
                                       r"shape \(2, 3\)"):
    tx.update({"w": jnp.ones((3,)), "fc_bias": jnp.ones(3)}, tx.init(params), params)


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_mismatched_gradients_under_jit(name):
  tx = VARIANTS[name]()
  params = _params()
  with pytest.raises(ValueError, match=r"gradient 'w' has shape \(1, 3\)"):
    jax.jit(tx.update)({"w": jnp.ones((1, 3)), "fc_bias": jnp.ones(3)}, tx.init(params), params)


# The variants whose step, as configured here, reads no params (no weight decay, trust
# ratio or master weights): update takes params=None (the test below, whose
# configurations these are).
PARAMS_OPTIONAL = {"mxnet.adabelief", "mxnet.adadelta", "mxnet.adagrad", "mxnet.adamax",
                   "mxnet.groupadagrad", "mxnet.nadam", "mxnet.nag", "mxnet.rmsprop",
                   "mxnet.sgld", "porting.torch_sparse_adam"}


@pytest.mark.parametrize("name", sorted(set(VARIANTS) - PARAMS_OPTIONAL))
def test_params_required_where_read(name):
  tx = VARIANTS[name]()
  params = _params()
  with pytest.raises(ValueError, match=r"params are required; call update\(updates, state, "
                                       r"params\)"):
    tx.update(_grads(params), tx.init(params))


# Each optimizer of the table with its weight decay set to 0, and its lazy step where it
# has one: those whose rule reads no params take update(..., params=None) (the
# others, which read them for a trust ratio, FTML's and FTRL's rules, DCASGD's delay
# compensation or the dense-exact catch-up, refuse it by name).
WEIGHT_DECAY = ("wd", "weight_decay", "weight_decay_rate", "wd_lh")
READ_WITHOUT_DECAY = {
    "lars", "tf_lars", "lamb", "lans", "mxnet.ftml", "mxnet.ftrl", "mxnet.dcasgd",
    "sparse.adam", "sparse.adamw", "sparse.sgd", "porting.keras_lamb", "porting.optax_lars",
    "porting.optax_lamb", "porting.byol_lars", "porting.simclr_lars", "porting.albert_lamb"}
WITHOUT_DECAY = {
    **{o.name: o for o in optimizers.TABLE},
    **{f"{n}_lazy": optimizers.BY_NAME[n] for n in optimizers.LAZY
       if "lazy_update" in inspect.signature(optimizers.BY_NAME[n].fn).parameters}}


@pytest.mark.numeric
@pytest.mark.parametrize("name", sorted(WITHOUT_DECAY))
def test_without_weight_decay_params_are_optional_where_the_rule_reads_none(name):
  o = WITHOUT_DECAY[name]
  no_decay = {k: 0.0 for k in WEIGHT_DECAY if k in inspect.signature(o.fn).parameters}
  tx = optimizers.lazy_step(o, **no_decay) if name.endswith("_lazy") else o.make(**no_decay)
  params = _params()
  grads = _grads(params)
  if name in READ_WITHOUT_DECAY:
    with pytest.raises(ValueError, match=r"params are required; call update"):
      tx.update(grads, tx.init(params))
    return
  with_params, _ = tx.update(grads, tx.init(params), params)
  without, _ = tx.update(grads, tx.init(params))
  chex.assert_trees_all_equal(with_params, without)


# The variants whose rule is defined on complex params: those the table marks complex
# (compared with optax in tests/test_dtypes.py), MXNet's and TF's LARS (norms of |w|
# and |g|, also there) and mxnet.adam's lazy step.
COMPLEX_OK = {*optimizers.COMPLEX, "lars", "tf_lars", "mxnet.adam_lazy"}


@pytest.mark.parametrize("name", sorted(VARIANTS))
@pytest.mark.parametrize("dtype", [jnp.int32, jnp.complex64])  # uint8, bool: test_optimizer_table
def test_non_float_params_rejected_at_init(name, dtype):
  params = {"w": jnp.ones((2, 3)), "layer": {"bad": jnp.ones((2,), dtype)}}
  if dtype == jnp.complex64 and name in COMPLEX_OK:
    VARIANTS[name]().init(params)
    return
  with pytest.raises(TypeError, match=r"parameter 'layer/bad' has dtype .*only real floating"):
    VARIANTS[name]().init(params)


@pytest.mark.parametrize("name", sorted(set(VARIANTS) - COMPLEX_OK))
def test_complex_params_rejected_naming_the_optimizers_that_take_them(name):
  params = {"w": jnp.ones((2, 3), jnp.complex64)}
  with pytest.raises(TypeError, match=r"Complex params are taken by lars_optax.mxnet.sgd, "
                                      r"lars_optax.mxnet.nag, lars_optax.mxnet.adam, "
                                      r"lars_optax.lars, "
                                      r"lars_optax.tf_lars, lars_optax.lamb, "
                                      r"lars_optax.porting.torch_sparse_adam \(without "
                                      r"clip_gradient or multi_precision\)"):
    VARIANTS[name]().init(params)


def test_complex_params_with_clip_gradient_rejected():
  with pytest.raises(TypeError, match="Complex params are taken by"):
    lars_optax.mxnet.sgd(0.1, clip_gradient=1.0).init({"w": jnp.ones(2, jnp.complex64)})


@pytest.mark.parametrize("name", sorted(VARIANTS))
@pytest.mark.parametrize("dtype", [jnp.int32, jnp.complex64])
def test_non_float_gradients_rejected(name, dtype):
  tx = VARIANTS[name]()
  params = _params()
  grads = {"w": jnp.ones((2, 3), dtype), "fc_bias": jnp.ones(3)}
  match = r"gradient 'w' has dtype .*only real floating"
  if dtype == jnp.complex64 and name in COMPLEX_OK:
    match = r"gradient 'w' is complex \(complex64\) but its parameter is real \(float32\)"
  with pytest.raises(TypeError, match=match):
    tx.update(grads, tx.init(params), params)


@pytest.mark.op_by_op
@pytest.mark.numeric
@pytest.mark.parametrize("name", TREE_MATRIX)
def test_0d_leaf(name):
  tx = VARIANTS[name]()
  params = {"w": jnp.ones((2, 3)), "s": jnp.array(2.0)}
  if name in LAZY:
    with pytest.raises(ValueError, match="parameter 's' is 0-d"):
      tx.init(params)
    return
  updates, _ = _step(tx, params, _grads(params), jit=True)
  chex.assert_shape(updates["s"], ())
  assert float(updates["s"]) != 0.0 and np.isfinite(float(updates["s"]))


@pytest.mark.op_by_op
@pytest.mark.numeric
@pytest.mark.parametrize("name", TREE_MATRIX)
def test_zero_size_leaf(name):
  tx = VARIANTS[name]()
  params = {**_params(), "empty": jnp.zeros((0, 3))}
  updates, state = _step(tx, params, _grads(params), jit=True)
  chex.assert_shape(updates["empty"], (0, 3))
  chex.assert_tree_all_finite((updates, state))
  if name == "mxnet.sgld":  # its noise keys are split once per leaf, by the leaf's place
    return
  # The other leaves are updated as without the empty one.
  ref, _ = _step(VARIANTS[name](), _params(), _grads(_params()), jit=True)
  chex.assert_trees_all_close({k: updates[k] for k in ref}, ref, rtol=1e-6)


@pytest.mark.op_by_op
@pytest.mark.numeric
@pytest.mark.parametrize("name", TREE_MATRIX)
@pytest.mark.parametrize("tree", [{}, {"a": {}}, [], (), {"a": None}],
                         ids=["dict", "nested", "list", "tuple", "only_none"])
def test_empty_trees(name, tree):
  tx = VARIANTS[name]()
  updates, state = tx.update(tree, tx.init(tree), tree)
  assert updates == tree
  updates, _ = jax.jit(tx.update)(tree, state, tree)
  assert updates == tree


@pytest.mark.numeric
@pytest.mark.parametrize("name", TREE_MATRIX)
def test_none_leaves(name):
  """``None`` is an empty subtree: it stays None and the other leaves are unaffected."""
  params = {**_params(), "frozen": None}
  grads = {**_grads(_params()), "frozen": None}
  updates, _ = _step(VARIANTS[name](), params, grads)
  assert updates["frozen"] is None
  ref, _ = _step(VARIANTS[name](), _params(), _grads(_params()))
  chex.assert_trees_all_close({k: updates[k] for k in ref}, ref, rtol=1e-6)


@pytest.mark.op_by_op
@pytest.mark.numeric
@pytest.mark.parametrize("name", TREE_MATRIX)
def test_masked_node_leaves_inside_optax_masked(name):
  """Inside optax.masked the optimizer sees MaskedNode leaves; masked-out leaves pass through."""
  tx = optax.masked(VARIANTS[name](), {"w": True, "fc_bias": False})
  params = _params()
  grads = _grads(params)
  state = tx.init(params)
  for _ in range(2):
    updates, state = jax.jit(tx.update)(grads, state, params)
  chex.assert_trees_all_equal(updates["fc_bias"], grads["fc_bias"])
  # The selected leaf is updated as the optimizer alone updates a tree holding only it.
  alone = VARIANTS[name]()
  only = {"w": params["w"]}
  s = alone.init(only)
  for _ in range(2):
    ref, s = jax.jit(alone.update)({"w": grads["w"]}, s, only)
  chex.assert_trees_all_close(updates["w"], ref["w"], rtol=1e-6)


@pytest.mark.op_by_op
@pytest.mark.numeric
@pytest.mark.parametrize("name", TREE_MATRIX)
def test_gradients_of_another_float_dtype_are_cast_to_the_params(name):
  """float32 gradients for bfloat16 params: state and updates stay bfloat16 (no upcast)."""
  tx = VARIANTS[name]()
  params = _params(jnp.bfloat16)
  grads32 = _grads(_params(jnp.float32))
  mp = name.endswith("_mp")
  state = tx.init(params)
  step = jax.jit(tx.update)
  for _ in range(2):
    updates, new_state = step(grads32, state, params)
    chex.assert_trees_all_equal_dtypes(state, new_state)  # the state keeps its dtypes
    state = new_state
  expected = jnp.float32 if mp else jnp.bfloat16
  assert {x.dtype for x in jax.tree.leaves(updates)} == {jnp.dtype(expected)}
  assert optax.apply_updates(params, updates)["w"].dtype == jnp.bfloat16
  if not mp:  # the same as giving bfloat16 gradients
    ref = VARIANTS[name]()
    s = ref.init(params)
    for _ in range(2):
      ref_u, s = jax.jit(ref.update)(jax.tree.map(lambda g: g.astype(jnp.bfloat16), grads32),
                                     s, params)
    chex.assert_trees_all_equal(updates, ref_u)


def test_lr_mult_beyond_the_params_dtype_is_rejected_at_init():
  tx = lars_optax.mxnet.sgd(0.1, lr_mult={"w": 1e5})
  with pytest.raises(ValueError, match=r"^lr_mult: 100000 is beyond the range of float16 "
                     r".*parameter 'w'"):
    tx.init({"w": jnp.ones(2, jnp.float16), "z": jnp.ones(2)})


# --------------------------------------------------------------------------
# Another library's keyword names the one to use
# --------------------------------------------------------------------------

_MXNET_FLAVOURED = ["lars", "lamb", "lans", "sgd", "adam", "signum", "signsgd", "adamw",
                    "adamax", "nadam", "adabelief", "ftml", "nag", "dcasgd", "sgld",
                    "adagrad", "rmsprop", "adadelta", "ftrl"]


@pytest.mark.parametrize("name", _MXNET_FLAVOURED)
def test_weight_decay_keyword_names_mxnets_wd(name):
  with pytest.raises(TypeError, match=rf"^weight_decay: {name}\(\) has no argument "
                                      r"'weight_decay'; it takes MXNet's name for weight "
                                      r"decay, wd \(e\.g\. wd=1e-4\)\."):
    public(name)(weight_decay=1e-4)


@pytest.mark.parametrize("name", _MXNET_FLAVOURED)
def test_lr_keyword_names_learning_rate(name):
  with pytest.raises(TypeError, match=rf"^lr: {name}\(\) has no argument 'lr'; it takes "
                                      "learning_rate"):
    public(name)(lr=0.1)


def test_lars_weight_decay_also_points_to_tf_lars():
  with pytest.raises(TypeError, match=r"lars_optax\.tf_lars, is the one that takes weight_decay"):
    lars_optax.lars(0.1, momentum=0.9, weight_decay=1e-4)


@pytest.mark.parametrize("kwarg, right", [("wd", "weight_decay"), ("eta", "eeta"),
                                          ("lr", "learning_rate")])
def test_tf_lars_names_tensorflows_keywords(kwarg, right):
  with pytest.raises(TypeError, match=rf"^{kwarg}: tf_lars\(\) has no argument '{kwarg}'; "
                                      rf"it takes .*{right}"):
    lars_optax.tf_lars(0.1, **{kwarg: 1e-4})


@pytest.mark.parametrize("name", [*_MXNET_FLAVOURED, "tf_lars"])
def test_keyword_hints_keep_the_signature(name):
  fn = public(name)
  params = inspect.signature(fn).parameters
  assert "wd" in params or "weight_decay" in params
  assert "kwargs" not in params and fn.__name__ == name and fn.__doc__
  lars_optax.mxnet.create("sgd", wd=1e-4)  # create still reads the arguments


def test_keyword_hints_leave_a_taken_keyword_alone():
  @v.keyword_hints({"wd": "unused", "other": "use x."})
  def f(wd=0.0):
    return wd

  assert f(wd=2.0) == 2.0
  with pytest.raises(TypeError, match=r"^other: f\(\) has no argument 'other'; use x\.$"):
    f(other=1)


def test_a_public_link_checks_what_it_is_given_whoever_calls_it(monkeypatch):
  """#52 item 4: no link's checks depend on who is up the call stack. A public link built
  while an optimizer is being built (here from inside lars's own chain) still checks its
  arguments and trees; the optimizers chain the links' rules instead."""
  from lars_optax import _mxnet_base as base
  real = base.preprocess

  def preprocess(*args, **kwargs):
    lars_optax.scale_by_lars_trust_ratio(trust_coefficient=-1.0)
    return real(*args, **kwargs)

  monkeypatch.setattr(base, "preprocess", preprocess)
  with pytest.raises(ValueError, match=r"^trust_coefficient: must be >= 0"):
    lars_optax.lars(0.1)
  monkeypatch.undo()
  link = lars_optax.add_decayed_weights_per_leaf(0.1)
  with pytest.raises(TypeError, match=r"^add_decayed_weights_per_leaf: parameter 'w' has dtype"):
    link.init({"w": jnp.ones(2, jnp.int32)})
  assert "checked" not in inspect.signature(lars_optax.scale_by_lars_trust_ratio).parameters
  with pytest.raises(TypeError, match=r"^scale_by_lars_trust_ratio\(\) got an unexpected "
                     r"keyword argument 'checked'"):
    lars_optax.scale_by_lars_trust_ratio(checked=False)
