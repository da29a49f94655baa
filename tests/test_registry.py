"""lars_optax.mxnet.create / register: MXNet's ``mx.optimizer.create`` by name.

The numbers of every built-in name are checked against MXNet itself in
``test_reference_mxnet_optimizers.py``; here: name and argument handling, the
1-based scheduler count, ``base_lr`` overwriting, host-side schedulers,
``register`` and the errors.
"""

import functools
import inspect
import re
import warnings

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import x64

import lars_optax
from lars_optax.mxnet.registry import BASE_ARGS


def _params():
  return {"fc1_weight": jnp.array([[1.0, -2.0], [0.5, 3.0]]), "fc1_bias": jnp.array([0.1, -0.2])}


def _grads():
  return {"fc1_weight": jnp.array([[0.3, -0.1], [0.2, 0.4]]), "fc1_bias": jnp.array([0.5, -0.5])}


def _run(tx, steps=3, jit=True):
  params = _params()
  state = tx.init(params)
  update = jax.jit(tx.update) if jit else tx.update
  for _ in range(steps):
    updates, state = update(_grads(), state, params)
    params = optax.apply_updates(params, updates)
  return params


@pytest.mark.op_by_op
@pytest.mark.parametrize("name, factory, kwargs", [
    ("lars", lars_optax.lars, {"momentum": 0.9, "eta": 0.1, "wd": 1e-3}),
    ("LARS", lars_optax.lars, {}),
    ("Signum", lars_optax.signum, {"wd_lh": 0.01}),
    ("signsgd", lars_optax.signsgd, {"wd": 0.01}),
    ("adam", lars_optax.mxnet.adam, {"beta1": 0.8, "wd": 1e-2, "clip_gradient": 0.3}),
    ("SGD", lars_optax.mxnet.sgd, {"momentum": 0.9, "rescale_grad": 0.5}),
])
def test_create_matches_the_function(name, factory, kwargs):
  chex.assert_trees_all_close(_run(lars_optax.mxnet.create(name, **kwargs)),
                              _run(factory(**kwargs)),
                              rtol=0, atol=0)


def test_registered_names():
  assert {"lars", "signum", "signsgd", "adam", "sgd"} <= set(lars_optax.mxnet.registered())


def test_unknown_name_error_lists_every_registered_name():
  with pytest.raises(ValueError, match=r"^name: unknown optimizer 'no_such_optimizer'") as e:
    lars_optax.mxnet.create("no_such_optimizer")
  assert f"valid names are {lars_optax.mxnet.registered()}." in str(e.value)
  assert {"nag", "dcasgd", "sgld"} <= set(lars_optax.mxnet.registered())


def test_unknown_name_lists_the_valid_ones():
  with pytest.raises(ValueError, match=r"name: unknown optimizer 'adamm' \(did you mean "
                     r"'adam'\?\); valid names are \[.*'lars'.*'sgd'"):
    lars_optax.mxnet.create("adamm")  # (adamw is a name now)


def test_name_must_be_a_string():
  with pytest.raises(TypeError, match="name: expected a string"):
    lars_optax.mxnet.create(3)


@pytest.mark.parametrize("value", [False, np.False_])
def test_lars_takes_mxnets_lazy_update_default(value):
  chex.assert_trees_all_equal(_run(lars_optax.mxnet.create("lars", lazy_update=value,
                                                           momentum=0.9)),
                              _run(lars_optax.lars(momentum=0.9)))


@pytest.mark.parametrize("value", [True, 1, "no"])
def test_lars_rejects_lazy_update_naming_the_reason(value):
  with pytest.raises(ValueError, match=r"lazy_update: 'lars' takes only lazy_update=False "
                                       r".*norm of the whole layer"):
    lars_optax.mxnet.create("lars", lazy_update=value)


def test_unknown_argument_lists_the_valid_ones():
  with pytest.raises(ValueError, match=r"momentum: not an argument of 'adam'; valid arguments "
                     r"are \[.*'beta1'.*'lr_scheduler'"):
    lars_optax.mxnet.create("adam", momentum=0.9)


@pytest.mark.parametrize("arg", ["param_idx2name", "sym", "param_dict"])
def test_index_maps_are_not_needed(arg):
  with pytest.raises(ValueError, match=f"{arg}: not needed; parameter names come from"):
    lars_optax.mxnet.create("sgd", **{arg: {0: "fc1_weight"}})


def test_a_trainers_param_dict_points_to_skip_none():
  """A Gluon Trainer's LARS skips nothing (tests/test_reference_mxnet_gluon.py)."""
  with pytest.raises(ValueError, match=r"Gluon Trainer gives MXNet only param_dict.*skip=None"):
    lars_optax.mxnet.create("lars", param_dict={0: "fc1_weight"})


def test_fused_path_switches_are_accepted_and_ignored():
  a = _run(lars_optax.mxnet.create("sgd", momentum=0.9, use_fused_step=False, aggregate_num=4))
  chex.assert_trees_all_close(a, _run(lars_optax.mxnet.sgd(momentum=0.9)), rtol=0, atol=0)


@pytest.mark.op_by_op
@pytest.mark.parametrize("name, kernel", [("adamw", "adamw_update"),
                                          ("lans", "multi_lans_update")])
def test_unfused_step_of_adamw_and_lans_is_rejected_naming_the_argument(name, kernel):
  # MXNet 2.0's plain-Python step for these follows another rule than the fused
  # kernel that create reproduces (for AdamW 2.3e-4 relative after 5 steps with
  # lr 0.01, wd 0.1): accepting the flag and ignoring it would be a silent change.
  with pytest.raises(ValueError, match=rf"^use_fused_step: {name!r} takes only "
                                       r"use_fused_step=True \(MXNet's default\), got False: "
                                       rf"MXNet's plain-Python step .* fused {kernel} kernel"):
    lars_optax.mxnet.create(name, wd=0.01, use_fused_step=False)
  # MXNet's default, given explicitly (as a Python or NumPy bool), is its fused path.
  for flag in (True, np.bool_(True)):
    chex.assert_trees_all_close(_run(lars_optax.mxnet.create(name, wd=0.01, use_fused_step=flag)),
                                _run(lars_optax.mxnet.create(name, wd=0.01)), rtol=0, atol=0)


@pytest.mark.parametrize("name, kwargs, match", [
    ("adam", {"beta1": 1.0}, "beta1: must be in"),
    ("adam", {"beta2": -0.1}, "beta2: must be in"),
    ("signum", {"momentum": 1.0}, "momentum: must be in"),
    ("signum", {"wd_lh": -1e-3}, "wd_lh: must be >= 0"),
    ("sgd", {"wd": -1.0}, "wd: must be >= 0"),
    ("lars", {"rescale_grad": 0.0}, "rescale_grad: must be > 0"),
    ("signsgd", {"clip_gradient": -1.0}, "clip_gradient: must be > 0"),
    ("adam", {"begin_num_update": -1}, r"begin_num_update: expected an int in \[0, 2147483646\]"),
    ("sgd", {"begin_num_update": 1.5}, r"begin_num_update: expected an int in \[0, 2147483646\]"),
    ("sgd", {"multi_precision": "yes"}, "multi_precision: expected a bool"),
    ("adam", {"lazy_update": 1}, "lazy_update: expected a bool"),
    ("sgd", {"lr_mult": {"fc1_weight": -1.0}}, "lr_mult: the value for 'fc1_weight' must be"),
    ("sgd", {"lr_scheduler": 0.1}, "lr_scheduler: expected a callable"),
])
def test_bad_arguments_name_the_argument(name, kwargs, match):
  with pytest.raises((ValueError, TypeError), match=match):
    lars_optax.mxnet.create(name, **kwargs)


def test_lr_mult_with_an_unknown_leaf_name_fails_at_init():
  tx = lars_optax.mxnet.create("adam", lr_mult={"fc1_weigth": 2.0})
  with pytest.raises(ValueError, match=r"lr_mult: no parameter is named 'fc1_weigth' "
                     r"\(did you mean \['fc1_weight'"):
    tx.init(_params())


# --------------------------------------------------------------------------
# lr_scheduler and begin_num_update
# --------------------------------------------------------------------------


@pytest.mark.parametrize("begin", [0, 5])
@pytest.mark.parametrize("jit", [False, True])
def test_traceable_scheduler_gets_the_one_based_count(begin, jit):
  # SGD without momentum: the update is -lr(n) * g, so lr(n) = n shows n.
  tx = lars_optax.mxnet.create("sgd", lr_scheduler=lambda n: n * 1.0, begin_num_update=begin)
  params = _params()
  state = tx.init(params)
  update = jax.jit(tx.update) if jit else tx.update
  g = _grads()
  for step in range(1, 4):
    updates, state = update(g, state, params)
    np.testing.assert_allclose(updates["fc1_bias"], -(begin + step) * g["fc1_bias"], rtol=1e-6)


def test_optax_schedule_as_lr_scheduler():
  sched = optax.linear_schedule(1.0, 0.0, 10)
  tx = lars_optax.mxnet.create("sgd", lr_scheduler=sched)
  updates, _ = tx.update(_grads(), tx.init(_params()), _params())
  # MXNet's count is 1 at the first update.
  np.testing.assert_allclose(updates["fc1_bias"], -0.9 * _grads()["fc1_bias"], rtol=1e-6)


class FactorScheduler:
  """A stateful Python scheduler written like MXNet's (cannot be traced)."""

  def __init__(self, step, factor=1.0, base_lr=0.01):
    self.step, self.factor, self.base_lr, self.count = step, factor, base_lr, 0
    self.calls = []

  def __call__(self, num_update):
    self.calls.append(num_update)
    while num_update > self.count + self.step:
      self.count += self.step
      self.base_lr *= self.factor
    return self.base_lr


def test_python_scheduler_runs_on_the_host_under_jit():
  sched = FactorScheduler(step=2, factor=0.5, base_lr=1.0)
  tx = lars_optax.mxnet.create("sgd", learning_rate=1.0, lr_scheduler=sched, begin_num_update=1)
  params, g = _params(), _grads()
  state = tx.init(params)
  update = jax.jit(tx.update)
  lrs = []
  for _ in range(6):
    updates, state = update(g, state, params)
    lrs.append(float(-updates["fc1_bias"][0] / g["fc1_bias"][0]))
  # num_update = 2..7; lr = base * factor ** floor((n - 1) / step).
  np.testing.assert_allclose(lrs, [1.0, 0.5, 0.5, 0.25, 0.25, 0.125], rtol=1e-6)
  # create() calls a copy: the object passed in keeps its state.
  assert (sched.calls, sched.count, sched.base_lr) == ([], 0, 1.0)


def test_scheduler_base_lr_is_replaced_by_learning_rate_as_in_mxnet():
  sched = FactorScheduler(step=100, base_lr=0.5)
  with pytest.warns(UserWarning, match="base_lr 0.5 is replaced by learning_rate 0.25"):
    tx = lars_optax.mxnet.create("sgd", learning_rate=0.25, lr_scheduler=sched)
  updates, _ = tx.update(_grads(), tx.init(_params()), _params())
  np.testing.assert_allclose(updates["fc1_bias"], -0.25 * _grads()["fc1_bias"], rtol=1e-6)
  assert sched.base_lr == 0.5  # the caller's object is not changed


def test_scheduler_base_lr_takes_the_optimizer_default_as_in_mxnet():
  # mx.optimizer.Adam passes its default learning_rate=0.001 to the base class,
  # which overwrites the scheduler's base_lr.
  sched = FactorScheduler(step=100, base_lr=0.001)
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    tx = lars_optax.mxnet.create("adam", lr_scheduler=sched)
  ref = lars_optax.mxnet.adam(learning_rate=0.001)
  chex.assert_trees_all_close(_run(tx, jit=False), _run(ref, jit=False), rtol=1e-6)


def test_plain_scheduler_and_learning_rate_conflict():
  with pytest.raises(ValueError, match="learning_rate: give either learning_rate or a plain "
                     "lr_scheduler"):
    lars_optax.mxnet.create("sgd", learning_rate=0.1, lr_scheduler=lambda n: 0.1)


def test_begin_num_update_starts_adams_bias_correction():
  tx = lars_optax.mxnet.create("adam", learning_rate=0.1, begin_num_update=9)
  updates, _ = tx.update(_grads(), tx.init(_params()), _params())
  g = np.asarray(_grads()["fc1_bias"], np.float64)
  t = 10
  m, v = 0.1 * g, 0.001 * g**2
  expected = -0.1 * np.sqrt(1 - 0.999**t) / (1 - 0.9**t) * m / (np.sqrt(v) + 1e-8)
  np.testing.assert_allclose(updates["fc1_bias"], expected, rtol=1e-5)


def test_mxnet_schedule_directly():
  sched = lars_optax.mxnet.mxnet_schedule(lambda n: 1.0 / n, begin_num_update=1)
  np.testing.assert_allclose(sched(jnp.asarray(0)), 0.5)
  np.testing.assert_allclose(jax.jit(sched)(jnp.asarray(2)), 0.25)


@pytest.mark.parametrize("host", [False, True], ids=["traceable", "host"])
def test_scheduled_rate_is_float64_under_x64(host):
  # MXNet's rate is a Python float: in float64 runs it must not be rounded to float32.
  def make():
    return FactorScheduler(1, 1.0, base_lr=1 / 3) if host else (lambda n: 1 / 3 + 0 * n)

  assert lars_optax.mxnet.mxnet_schedule(make())(jnp.asarray(0)).dtype == jnp.float32
  with x64():
    lr = jax.jit(lars_optax.mxnet.mxnet_schedule(make()))(jnp.asarray(0))
    assert lr.dtype == jnp.float64
    assert float(lr) == 1 / 3
    kwargs = {"learning_rate": 1 / 3} if host else {}
    tx = lars_optax.mxnet.create("sgd", lr_scheduler=make(), **kwargs)
    g = {"w": jnp.ones(2, jnp.float64)}
    updates, _ = jax.jit(tx.update)(g, tx.init(g), g)
    assert float(updates["w"][0]) == -1 / 3


# --------------------------------------------------------------------------
# register
# --------------------------------------------------------------------------


@pytest.fixture
def clean_registry():
  saved = dict(lars_optax.mxnet.registry._REGISTRY)
  yield
  lars_optax.mxnet.registry._REGISTRY.clear()
  lars_optax.mxnet.registry._REGISTRY.update(saved)


def test_register_as_decorator(clean_registry):
  @lars_optax.mxnet.register("MyOpt")
  def my_opt(learning_rate=0.5, wd=0.0):
    return optax.chain(optax.add_decayed_weights(wd), optax.sgd(learning_rate))

  assert "myopt" in lars_optax.mxnet.registered()
  chex.assert_trees_all_close(_run(lars_optax.mxnet.create("myopt", wd=0.1)),
                              _run(my_opt(wd=0.1)), rtol=0, atol=0)


def test_register_gets_the_mxnet_schedule(clean_registry):
  lars_optax.mxnet.register("plain", factory=lambda learning_rate=0.1: optax.sgd(learning_rate))
  tx = lars_optax.mxnet.create("plain", lr_scheduler=lambda n: 2.0 * n)
  updates, _ = tx.update(_grads(), tx.init(_params()), _params())
  np.testing.assert_allclose(updates["fc1_bias"], -2.0 * _grads()["fc1_bias"], rtol=1e-6)


def test_register_duplicate_needs_overwrite(clean_registry):
  with pytest.raises(ValueError, match="name: an optimizer called 'adam' is already registered"):
    lars_optax.mxnet.register("adam", factory=lars_optax.mxnet.sgd)
  lars_optax.mxnet.register("adam", factory=lars_optax.mxnet.sgd, overwrite=True)
  chex.assert_trees_all_close(_run(lars_optax.mxnet.create("adam")), _run(lars_optax.mxnet.sgd()))


@pytest.mark.parametrize("name, factory, exc", [
    ("", optax.sgd, TypeError), (3, optax.sgd, TypeError), ("x", 3, TypeError)])
def test_register_bad_input(clean_registry, name, factory, exc):
  with pytest.raises(exc, match=r"name: expected|factory: expected"):
    lars_optax.mxnet.register(name, factory=factory)


def test_register_factory_without_a_base_argument(clean_registry):
  lars_optax.mxnet.register("plain", factory=lambda learning_rate=0.1: optax.sgd(learning_rate))
  lars_optax.mxnet.create("plain", wd=0.0, rescale_grad=1.0)  # neutral values are fine
  with pytest.raises(ValueError, match="wd: 'plain' does not support this argument"):
    lars_optax.mxnet.create("plain", wd=1e-4)


def test_register_factory_gets_multi_precision_from_the_wrapper(clean_registry):
  lars_optax.mxnet.register("plain", factory=lambda learning_rate=0.1: optax.sgd(learning_rate))
  tx = lars_optax.mxnet.create("plain", multi_precision=True)
  state = tx.init({"w": jnp.ones(3, jnp.float16)})
  assert isinstance(state, lars_optax.MultiPrecisionState)


def test_readme_example():
  opt = lars_optax.mxnet.create("adam", wd=1e-4, lazy_update=True,
                          lr_scheduler=lambda n: 1e-3 * 0.5 ** (n // 1000),
                          wd_mult={"fc1_bias": 0.0}, multi_precision=True)
  params = jax.tree.map(lambda x: x.astype(jnp.float16), _params())
  state = opt.init(params)
  updates, state = jax.jit(opt.update)(_grads(), state, params)
  params = optax.apply_updates(params, updates)
  chex.assert_trees_all_equal_dtypes(params, jax.tree.map(lambda x: x.astype(jnp.float16),
                                                          _params()))
  assert isinstance(state, lars_optax.MultiPrecisionState)


def test_learning_rate_none_means_mxnets_fallback():
  tx = lars_optax.mxnet.create("sgd", learning_rate=None)
  updates, _ = tx.update(_grads(), tx.init(_params()), _params())
  np.testing.assert_allclose(updates["fc1_bias"], -0.01 * _grads()["fc1_bias"], rtol=1e-6)
  # With a scheduler object, None keeps the scheduler's own base_lr.
  sched = FactorScheduler(step=100, base_lr=0.3)
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    tx = lars_optax.mxnet.create("sgd", learning_rate=None, lr_scheduler=sched)
  updates, _ = tx.update(_grads(), tx.init(_params()), _params())
  np.testing.assert_allclose(updates["fc1_bias"], -0.3 * _grads()["fc1_bias"], rtol=1e-6)


class _ReadOnlyScheduler:
  """An MXNet-style scheduler whose base_lr cannot be set."""

  def __init__(self, base_lr=0.1):
    self._base_lr = base_lr

  @property
  def base_lr(self):
    return self._base_lr

  def __call__(self, num_update):
    return self._base_lr * (0.5 if num_update > 2 else 1.0)


class _UncopyableScheduler:
  def __init__(self):
    self.base_lr = 0.1

  def __deepcopy__(self, memo):
    raise RuntimeError("holds a lock")

  def __call__(self, num_update):
    return self.base_lr


@pytest.mark.parametrize("scheduler, msg", [
    (_ReadOnlyScheduler(), r"^lr_scheduler: cannot set base_lr on _ReadOnlyScheduler"),
    (_UncopyableScheduler(), r"^lr_scheduler: cannot copy _UncopyableScheduler"),
])
def test_scheduler_whose_base_lr_cannot_be_set_names_the_argument(scheduler, msg):
  with pytest.raises(TypeError, match=msg + ".*learning_rate=None"):
    lars_optax.mxnet.create("sgd", learning_rate=0.2, lr_scheduler=scheduler)
  lars_optax.mxnet.create("sgd", learning_rate=None, lr_scheduler=scheduler)  # keeps base_lr


def test_register_rejects_a_factory_annotated_to_return_none(clean_registry):
  def bad(learning_rate=0.1) -> None:
    optax.sgd(learning_rate)

  with pytest.raises(TypeError, match=r"^factory: 'bad' is annotated to return None"):
    lars_optax.mxnet.register("bad", factory=bad)


def test_create_rejects_a_factory_that_returns_none(clean_registry):
  def forgot(learning_rate=0.1):
    optax.sgd(learning_rate)

  lars_optax.mxnet.register("forgot", factory=forgot)
  with pytest.raises(TypeError, match=r"^name: the factory registered as 'forgot' returned "
                                      r"NoneType, not an optax.GradientTransformation"):
    lars_optax.mxnet.create("forgot")


class _FactorScheduler:
  """MXNet's ``FactorScheduler``: keeps state, so a call changes later calls."""

  def __init__(self, step, factor=0.5, base_lr=0.1):
    self.step, self.factor, self.base_lr, self.count = step, factor, base_lr, 0

  def __call__(self, num_update):
    while num_update > self.count + self.step:
      self.count += self.step
      self.base_lr *= self.factor
    return self.base_lr


class _CallCounter:
  """A scheduler whose rate depends on how often it was called, not on the count."""

  def __init__(self):
    self.base_lr = 0.1
    self.calls = 0

  def __call__(self, num_update):
    int(num_update)  # a Python function of the count: called on the host
    self.calls += 1
    return self.base_lr / self.calls


@pytest.mark.parametrize("scheduler", [lambda: _FactorScheduler(2), _CallCounter],
                         ids=["factor", "call_counter"])
@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_host_scheduler_replays_exactly_after_restoring_an_earlier_state(scheduler, jit):
  tx = lars_optax.mxnet.create("sgd", momentum=0.9, learning_rate=None, lr_scheduler=scheduler())
  update = jax.jit(tx.update) if jit else tx.update
  params = _params()
  states, first = [tx.init(params)], []
  for _ in range(6):
    updates, state = update(_grads(), states[-1], params)
    states.append(state)
    first.append(updates)
  for restore in (2, 0, 4):  # roll back and replay from there
    state = states[restore]
    for step in range(restore, 6):
      updates, state = update(_grads(), state, params)
      chex.assert_trees_all_equal(updates, first[step])


def test_host_scheduler_rates_follow_the_count_from_a_fresh_copy():
  sched = _FactorScheduler(2)
  schedule = lars_optax.mxnet.mxnet_schedule(sched)
  rates = [float(schedule(jnp.asarray(n))) for n in (0, 1, 2, 3, 4, 5, 1, 5, 5)]
  np.testing.assert_allclose(rates, [0.1, 0.1, 0.05, 0.05, 0.025, 0.025, 0.1, 0.025, 0.025],
                             rtol=1e-6)
  # The first time through, the object passed in is the one called (as before).
  assert sched.count == 4


def test_uncopyable_host_scheduler_warns_on_rollback():
  class Uncopyable(_CallCounter):
    def __deepcopy__(self, memo):
      raise RuntimeError("holds a lock")

  schedule = lars_optax.mxnet.mxnet_schedule(Uncopyable())
  schedule(jnp.asarray(0))
  schedule(jnp.asarray(1))
  with pytest.warns(UserWarning, match="^lr_scheduler: the optimizer went back"):
    schedule(jnp.asarray(0))


class _ForgetfulScheduler:
  """An MXNet-style scheduler object that forgets to return its rate from
  ``bad_from`` on (it branches on the count, so it runs on the host)."""

  def __init__(self, bad_from):
    self.base_lr, self.bad_from = 0.1, bad_from

  def __call__(self, num_update):
    if num_update >= self.bad_from:
      return None
    return self.base_lr


@pytest.mark.parametrize("rate, shown", [
    (None, "None when traced"),
    (np.ones(2, np.float32), "an array of shape (2,) and dtype float32 when traced"),
    (1j, "1j (complex) when traced"),
    (True, "True (bool) when traced"),
    ("0.1", "'0.1' (str) when traced"),
], ids=["none", "vector", "complex", "bool", "str"])
def test_traceable_scheduler_returning_no_real_scalar_raises_at_create(rate, shown):
  # Before, None and a string became a NaN rate, a complex its real part.
  with pytest.raises(TypeError, match=rf"^lr_scheduler: returned {re.escape(shown)}; it "
                                      "must return the learning rate as a real scalar"):
    lars_optax.mxnet.create("sgd", learning_rate=None, lr_scheduler=lambda n: rate)


def test_host_scheduler_returning_none_raises_at_create():
  sched = _ForgetfulScheduler(bad_from=1)
  with pytest.raises(TypeError, match=r"^lr_scheduler: returned None for update count 1; "
                                      "it must return the learning rate as a real scalar"):
    lars_optax.mxnet.create("sgd", learning_rate=None, lr_scheduler=sched)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_host_scheduler_returning_none_later_raises_in_update_naming_lr_scheduler(jit):
  tx = lars_optax.mxnet.create("sgd", learning_rate=None, lr_scheduler=_ForgetfulScheduler(3))
  update = jax.jit(tx.update) if jit else tx.update
  params, g = _params(), _grads()
  state = tx.init(params)
  for _ in range(2):  # counts 1 and 2: the rate is 0.1
    updates, state = update(g, state, params)
    np.testing.assert_allclose(updates["fc1_bias"], -0.1 * g["fc1_bias"], rtol=1e-6)
  with pytest.raises(Exception, match=r"lr_scheduler: returned None for update count 3"):
    jax.block_until_ready(update(g, state, params))


# --------------------------------------------------------------------------
# create under optax.inject_hyperparams
# --------------------------------------------------------------------------


def test_create_works_under_inject_hyperparams():
  tx = optax.inject_hyperparams(functools.partial(lars_optax.mxnet.create,
                                                  "adam"))(learning_rate=0.1)
  params = {"w": jnp.array([1.0, -2.0, 3.0]), "b": jnp.array([0.5])}
  state = tx.init(params)
  assert set(state.hyperparams) == {"learning_rate"}
  ref = optax.inject_hyperparams(lars_optax.mxnet.adam)(learning_rate=0.1)
  ref_state = ref.init(params)
  step = jax.jit(lambda g, s, p: tx.update(g, s, p))
  for i in range(3):
    grads = jax.tree.map(lambda p, i=i: jnp.sin(p + i), params)
    updates, state = step(grads, state, params)
    ref_updates, ref_state = ref.update(grads, ref_state, params)
    chex.assert_trees_all_close(updates, ref_updates)
  # The learning rate is a hyperparameter in the state: 0 stops the updates.
  state.hyperparams["learning_rate"] = jnp.zeros([])
  updates, _ = step(params, state, params)
  chex.assert_trees_all_equal(updates, jax.tree.map(jnp.zeros_like, params))


def test_create_under_inject_hyperparams_passes_the_optimizers_own_arguments():
  factory = functools.partial(lars_optax.mxnet.create, "lars")
  tx = optax.inject_hyperparams(factory)(learning_rate=0.5, wd=1e-3, momentum=0.9,
                                         skip="flax", wd_skip="flax")
  want = lars_optax.lars(0.5, momentum=0.9, wd=1e-3, skip="flax", wd_skip="flax")
  params = {"Dense_0": {"kernel": jnp.ones((2, 3)), "bias": jnp.ones(3)}}
  state, want_state = tx.init(params), want.init(params)
  assert set(state.hyperparams) == {"learning_rate", "wd"}
  for _ in range(2):
    grads = jax.tree.map(lambda p: 0.1 * p + 0.2, params)
    updates, state = tx.update(grads, state, params)
    want_updates, want_state = want.update(grads, want_state, params)
    chex.assert_trees_all_close(updates, want_updates, rtol=1e-6)


def test_create_signature_names_the_base_arguments():
  params = inspect.signature(lars_optax.mxnet.create).parameters
  assert [p for p in params if p in BASE_ARGS] == list(BASE_ARGS)
  assert repr(params["learning_rate"].default) == "unset"
