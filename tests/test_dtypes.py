"""The dtype matrix: every optimizer on float32, float64 (x64), bfloat16 and float16.

For each optimizer, with and without ``multi_precision``, on a tree holding
leaves of every dtype at once, after jitted steps:

* params keep their dtypes (no silent upcast);
* updates have the param dtype (with ``multi_precision``, float16/bfloat16
  leaves get float32 updates, by design);
* every params-shaped state buffer has the param dtype (with
  ``multi_precision``: float32 for float16/bfloat16 leaves, whose masters are
  float32 too), and the state's dtypes never change from step to step;
* trust ratios are float32 (float64 when a leaf is float64), and norms
  accumulate in float32 or wider.
"""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import public, x64

import lars_optax
import optimizers
from lars_optax._utils import LOW_PRECISION

# Not the one table's rows: each carries the options whose casts the dtypes test (rescale,
# clip, multipliers, bounds), which the canonical configurations leave out.
OPTIMIZERS = {
    "lars": lambda **kw: lars_optax.lars(0.1, momentum=0.9, wd=1e-3, rescale_grad=0.5,
                                         clip_gradient=1.0, **kw),
    "tf_lars": lambda **kw: lars_optax.tf_lars(0.1, skip_list=["bias"]),
    "signum": lambda **kw: lars_optax.signum(0.01, wd=1e-3, wd_lh=1e-3, **kw),
    "signsgd": lambda **kw: lars_optax.signsgd(0.01, wd=1e-3, **kw),
    "adam": lambda **kw: lars_optax.mxnet.adam(0.01, wd=1e-3, clip_gradient=1.0, **kw),
    "adam_lazy": lambda **kw: lars_optax.mxnet.adam(0.01, lazy_update=True, **kw),
    "sgd": lambda **kw: lars_optax.mxnet.sgd(0.1, momentum=0.9, wd=1e-3, rescale_grad=0.5, **kw),
    "sgd_lazy": lambda **kw: lars_optax.mxnet.sgd(0.1, momentum=0.9, lazy_update=True, **kw),
    "nag": lambda **kw: lars_optax.mxnet.nag(0.1, momentum=0.9, wd=1e-3, rescale_grad=0.5,
                                       clip_gradient=1.0, **kw),
    "dcasgd": lambda **kw: lars_optax.mxnet.dcasgd(0.1, momentum=0.9, lamda=0.5, wd=1e-3,
                                             rescale_grad=0.5, clip_gradient=1.0, **kw),
    "sgld": lambda **kw: lars_optax.mxnet.sgld(0.01, wd=1e-3, rescale_grad=0.5, clip_gradient=1.0,
                                         key=3, **kw),
    "adagrad": lambda **kw: lars_optax.mxnet.adagrad(0.01, wd=1e-3, clip_gradient=1.0, **kw),
    "groupadagrad": lambda **kw: lars_optax.mxnet.groupadagrad(0.01, rescale_grad=0.5, **kw),
    "rmsprop": lambda **kw: lars_optax.mxnet.rmsprop(0.01, wd=1e-3, clip_weights=2.0, **kw),
    "rmsprop_centered": lambda **kw: lars_optax.mxnet.rmsprop(0.01, centered=True, wd=1e-3, **kw),
    "adadelta": lambda **kw: lars_optax.mxnet.adadelta(wd=1e-3, clip_gradient=1.0, **kw),
    "ftrl": lambda **kw: lars_optax.mxnet.ftrl(0.1, wd=1e-3, rescale_grad=0.5, **kw),
    "lamb": lambda **kw: lars_optax.lamb(0.01, wd=1e-3, clip_gradient=1.0, lower_bound=0.1,
                                         upper_bound=5.0, skip="mxnet", **kw),
    "lamb_uncorrected": lambda **kw: lars_optax.lamb(0.01, bias_correction=False, wd=1e-3,
                                                     **kw),
    "lans": lambda **kw: lars_optax.lans(0.01, wd=1e-3, clip_gradient=0.5, upper_bound=5.0,
                                         **kw),
    "adamw": lambda **kw: lars_optax.mxnet.adamw(0.01, wd=1e-2, clip_gradient=1.0, **kw),
    "adamax": lambda **kw: lars_optax.mxnet.adamax(0.01, wd=1e-3, clip_gradient=1.0, **kw),
    "nadam": lambda **kw: lars_optax.mxnet.nadam(0.01, wd=1e-3, clip_gradient=1.0, **kw),
    "adabelief": lambda **kw: lars_optax.mxnet.adabelief(0.01, wd=1e-3, clip_gradient=1.0, **kw),
    "ftml": lambda **kw: lars_optax.mxnet.ftml(0.01, wd=1e-3, clip_gradient=1.0, **kw),
}

DTYPES = [jnp.float32, jnp.bfloat16, jnp.float16]
# The dtype matrix's cells that also run jitted (every optimizer runs jitted in the
# reference tests, and on bfloat16 arrays as hyperparameters below).
JITTED = {"lars", "tf_lars", "lamb", "lans", "signum", "adam"}
DTYPES_X64 = [jnp.float64, *DTYPES]


def _make(name, mp):
  # tf_lars has no multi_precision argument, and sgd takes it or lazy_update, not both
  # (as MXNet's SGD asserts): use the wrapper
  if name == "tf_lars" or (name == "sgd_lazy" and mp):
    tx = OPTIMIZERS[name]()
    return lars_optax.multi_precision(tx) if mp else tx
  return OPTIMIZERS[name](multi_precision=mp)


def _params(dtypes):
  rng = np.random.default_rng(0)
  out = {}
  for dt in dtypes:
    n = jnp.dtype(dt).name
    out[f"{n}_weight"] = jnp.asarray(rng.normal(size=(3, 4)), dt)
    out[f"{n}_bias"] = jnp.asarray(rng.normal(size=(4,)), dt)
  return out


def _grads(params, k):
  rng = np.random.default_rng(k + 1)
  return jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape), p.dtype), params)


def _buffers(state, params):
  """The state's subtrees shaped like the params (momentum, moments, masters, ...)."""
  treedef = jax.tree.structure(params)
  shapes = [p.shape for p in jax.tree.leaves(params)]

  def is_buffer(node):
    try:
      subs = treedef.flatten_up_to(node)
    except (ValueError, TypeError):
      return False
    return (any(hasattr(x, "shape") for x in subs)
            and all(isinstance(x, optax.MaskedNode) or np.shape(x) == s
                    for x, s in zip(subs, shapes)))

  return [treedef.flatten_up_to(n) for n in jax.tree.leaves(state, is_leaf=is_buffer)
          if is_buffer(n)]


def _step(tx):
  def step(params, state, grads):
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), updates, state
  return step


def _avals(tree):
  return jax.tree.map(lambda x: (x.shape, jnp.dtype(x.dtype), x.weak_type), tree)


def _assert_traced_once(tx, params):
  """A jitted step is traced again when its state comes back with other avals (shape,
  dtype or weak type) than it went in with. ``jax.eval_shape`` traces the step as ``jit``
  does, without compiling it: the state's and the params' avals must come back unchanged."""
  state = tx.init(params)
  p, updates, new_state = jax.eval_shape(_step(tx), params, state, _grads(params, 0))
  assert _avals(new_state) == _avals(state), "a jitted step would be traced again"
  assert _avals(p) == _avals(params)
  assert _avals(updates) == jax.tree.map(lambda x: (x.shape, x.dtype, False), updates)


def _eager_steps(tx, params, steps=3):
  """(params, updates, state) after each of ``steps`` updates, op by op: the small programs
  it compiles are shared by every test in the process (each jitted step is a new one)."""
  with jax.disable_jit():
    state, p, out = tx.init(params), params, []
    for k in range(steps):
      updates, state = tx.update(_grads(params, k), state, p)
      p = optax.apply_updates(p, updates)
      out.append((p, updates, state))
  return out


# No params-shaped buffer (without multi_precision); groupadagrad's are per row
# (test_adagrad_family.py checks their dtypes).
STATELESS = {"signsgd", "sgld", "groupadagrad"}


def _check(name, mp, dtypes, *, jit):
  params = _params(dtypes)
  tx = _make(name, mp)
  if jit:
    state = tx.init(params)
    init_dtypes = jax.tree.map(lambda x: x.dtype, state)
    step = jax.jit(_step(tx))
    p = params
    for k in range(2):
      p, updates, state = step(p, state, _grads(params, k))
      assert jax.tree.map(lambda x: x.dtype, state) == init_dtypes, "state dtypes changed"
  else:
    _assert_traced_once(tx, params)
    p, updates, state = _eager_steps(tx, params, steps=2)[-1]

  p_dtypes = [x.dtype for x in jax.tree.leaves(params)]
  low = [mp and dt in LOW_PRECISION for dt in p_dtypes]
  work = [jnp.dtype(jnp.float32) if lo else dt for lo, dt in zip(low, p_dtypes)]
  # Params keep their dtypes; updates have the param dtype (float32 under mp).
  assert [x.dtype for x in jax.tree.leaves(p)] == p_dtypes
  assert [x.dtype for x in jax.tree.leaves(updates)] == work
  chex.assert_tree_all_finite((p, updates, state))
  assert any(float(jnp.max(jnp.abs(u))) > 0 for u in jax.tree.leaves(updates))
  # Every params-shaped buffer of the state has the working dtype.
  buffers = _buffers(state, params)
  assert buffers or (name in STATELESS and not mp)
  for buf in buffers:
    assert [x.dtype for x in buf if not isinstance(x, optax.MaskedNode)] == [
        w for x, w in zip(buf, work) if not isinstance(x, optax.MaskedNode)]
  if name in ("lars", "tf_lars"):
    wide = jnp.float64 if jnp.dtype(jnp.float64) in p_dtypes else jnp.float32
    assert lars_optax.trust_ratios(state).dtype == wide
  if mp:  # low-precision params are their masters cast down
    masters = lars_optax.master_params(state, p)
    for q, m, lo in zip(jax.tree.leaves(p), jax.tree.leaves(masters), low):
      if lo:
        assert m.dtype == jnp.float32
        np.testing.assert_array_equal(np.asarray(m.astype(q.dtype), np.float32),
                                      np.asarray(q, np.float32))


@pytest.mark.filterwarnings("ignore::lars_optax.LowPrecisionWarning")  # float16 Adam
@pytest.mark.parametrize("mp", [False, True], ids=["plain", "multi_precision"])
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_dtype_matrix(name, mp):
  """float32, bfloat16 and float16 leaves in one tree: op-by-op steps, and a traced step's
  avals; the library's own optimizers also run jitted without master weights."""
  _check(name, mp, DTYPES, jit=not mp and name in JITTED)


@pytest.mark.filterwarnings("ignore::lars_optax.LowPrecisionWarning")  # float16 Adam
@pytest.mark.parametrize("mp", [False, True], ids=["plain", "multi_precision"])
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_dtype_matrix_x64(name, mp):
  """float64 next to float32, bfloat16 and float16, with x64 enabled."""
  with x64():
    _check(name, mp, DTYPES_X64, jit=False)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_norms_accumulate_in_float32(dtype):
  # In bfloat16 a running sum of 4096 ones stops at 256; in float16 300^2 * 4 overflows.
  w = jnp.ones((4096,), dtype)
  g = jnp.full((4096,), 0.5, dtype)
  ratio = lars_optax.lars_trust_ratio(w, g, trust_coefficient=1.0, eps=1.0)
  assert ratio.dtype == jnp.float32
  np.testing.assert_allclose(float(ratio), 64.0 / 33.0, rtol=1e-6)
  w = jnp.full((4, 4), 300.0, dtype)
  tx = lars_optax.lars(0.1, eta=0.01, skip=None)
  params = {"w": w}
  _, state = jax.jit(tx.update)({"w": jnp.ones((4, 4), dtype)}, tx.init(params), params)
  np.testing.assert_allclose(float(lars_optax.trust_ratios(state)[0]), 0.01 * 1200.0 / 4.0,
                             rtol=1e-6)


def test_float64_norms_are_float64():
  with x64():
    w = jnp.full((3,), 1.0 + 1e-12, jnp.float64)
    ratio = lars_optax.lars_trust_ratio(w, jnp.ones((3,), jnp.float64), trust_coefficient=1.0)
    assert ratio.dtype == jnp.float64
    np.testing.assert_allclose(float(ratio), 1.0 + 1e-12, rtol=1e-15)


# --------------------------------------------------------------------------
# Typed hyperparameters: numpy, jax and bfloat16 scalars, not only Python floats
# --------------------------------------------------------------------------

# Every float hyperparameter of every optimizer, at values that bfloat16 keeps
# inside their ranges (bfloat16(0.999) is 1.0).
HYPER = {
    "lars": (lars_optax.lars, {"learning_rate": 0.1, "momentum": 0.9, "eta": 0.01,
                               "epsilon": 1e-8, "wd": 1e-3, "rescale_grad": 0.5,
                               "clip_gradient": 1.0}),
    "tf_lars": (lars_optax.tf_lars, {"learning_rate": 0.1, "momentum": 0.9,
                                     "weight_decay": 1e-4, "eeta": 0.01, "epsilon": 1e-8}),
    "signum": (lars_optax.signum, {"learning_rate": 0.01, "momentum": 0.9, "wd_lh": 1e-3,
                                   "wd": 1e-3, "rescale_grad": 0.5, "clip_gradient": 1.0}),
    "signsgd": (lars_optax.signsgd, {"learning_rate": 0.01, "wd_lh": 1e-3, "wd": 1e-3,
                                     "rescale_grad": 0.5, "clip_gradient": 1.0}),
    "adam": (lars_optax.mxnet.adam, {"learning_rate": 0.01, "beta1": 0.9, "beta2": 0.99,
                               "epsilon": 1e-8, "wd": 1e-3, "rescale_grad": 0.5,
                               "clip_gradient": 1.0}),
    "sgd": (lars_optax.mxnet.sgd, {"learning_rate": 0.1, "momentum": 0.9, "wd": 1e-3,
                             "rescale_grad": 0.5, "clip_gradient": 1.0}),
    "nag": (lars_optax.mxnet.nag, {"learning_rate": 0.1, "momentum": 0.9, "wd": 1e-3,
                             "rescale_grad": 0.5, "clip_gradient": 1.0}),
    "dcasgd": (lars_optax.mxnet.dcasgd, {"learning_rate": 0.1, "momentum": 0.9, "lamda": 0.5,
                                   "wd": 1e-3, "rescale_grad": 0.5, "clip_gradient": 1.0}),
    "sgld": (lars_optax.mxnet.sgld, {"learning_rate": 0.01, "wd": 1e-3, "rescale_grad": 0.5,
                               "clip_gradient": 1.0}),
    "adagrad": (lars_optax.mxnet.adagrad, {"learning_rate": 0.01, "epsilon": 1e-6, "wd": 1e-3,
                                     "rescale_grad": 0.5, "clip_gradient": 1.0}),
    "groupadagrad": (lars_optax.mxnet.groupadagrad, {"learning_rate": 0.01, "epsilon": 1e-6,
                                               "rescale_grad": 0.5, "clip_gradient": 1.0}),
    "rmsprop": (lars_optax.mxnet.rmsprop, {"learning_rate": 0.01, "rho": 0.9, "epsilon": 1e-4,
                                     "clip_weights": 2.0, "wd": 1e-3, "rescale_grad": 0.5,
                                     "clip_gradient": 1.0}),
    "rmsprop_centered": (functools.partial(lars_optax.mxnet.rmsprop, centered=True),
                         {"learning_rate": 0.01, "rho": 0.9, "momentum": 0.9, "epsilon": 1e-4,
                          "wd": 1e-3, "rescale_grad": 0.5, "clip_gradient": 1.0}),
    "adadelta": (lars_optax.mxnet.adadelta, {"learning_rate": 1.0, "rho": 0.9, "epsilon": 1e-4,
                                       "wd": 1e-3, "rescale_grad": 0.5, "clip_gradient": 1.0}),
    "ftrl": (lars_optax.mxnet.ftrl, {"learning_rate": 0.1, "lamda1": 0.01, "beta": 1.0, "wd": 1e-3,
                               "rescale_grad": 0.5, "clip_gradient": 1.0}),
    "lamb": (lars_optax.lamb, {"learning_rate": 0.01, "beta1": 0.9, "beta2": 0.99,
                               "epsilon": 1e-6, "lower_bound": 0.01, "upper_bound": 10.0,
                               "wd": 1e-3, "rescale_grad": 0.5, "clip_gradient": 1.0}),
    "lans": (lars_optax.lans, {"learning_rate": 0.01, "beta1": 0.9, "beta2": 0.99,
                               "epsilon": 1e-6, "lower_bound": 0.01, "upper_bound": 10.0,
                               "wd": 1e-3, "rescale_grad": 0.5, "clip_gradient": 0.5}),
    **{name: (public(name),
              {"learning_rate": 0.01, "beta1": 0.9, "beta2": 0.99, "epsilon": 1e-6,
               "wd": 1e-3, "rescale_grad": 0.5, "clip_gradient": 1.0})
       for name in ("adamw", "adamax", "adabelief")},
    "nadam": (lars_optax.mxnet.nadam, {"learning_rate": 0.01, "beta1": 0.9, "beta2": 0.99,
                                 "epsilon": 1e-6, "schedule_decay": 0.01, "wd": 1e-3,
                                 "rescale_grad": 0.5, "clip_gradient": 1.0}),
    "ftml": (lars_optax.mxnet.ftml, {"learning_rate": 0.01, "beta1": 0.6, "beta2": 0.99,
                               "epsilon": 1e-6, "wd": 1e-3, "rescale_grad": 0.5,
                               "clip_gradient": 1.0}),
}

SCALAR_TYPES = {
    "python": float,
    "np_float32": np.float32,
    "np_float64": np.float64,
    "jnp_float32": jnp.float32,
    "jnp_bfloat16": jnp.bfloat16,
}


def _typed(kwargs, to):
  return {k: to(x) for k, x in kwargs.items()}


def _traced_steps(tx, params, steps=3):
  """Jitted steps, counting traces; the updates and states after each."""
  traces = []
  step = _step(tx)

  @jax.jit
  def counted(params, state, grads):
    traces.append(1)
    return step(params, state, grads)

  state = tx.init(params)
  out, p = [], params
  for k in range(steps):
    p, updates, state = counted(p, state, _grads(params, k))
    out.append((p, updates, state))
  return out, len(traces)


def _assert_dtypes_kept(params, out):
  p_dtypes = jax.tree.map(lambda x: x.dtype, params)
  state_dtypes = jax.tree.map(lambda x: x.dtype, out[0][2])
  for p, updates, state in out:
    assert jax.tree.map(lambda x: x.dtype, p) == p_dtypes
    assert jax.tree.map(lambda x: x.dtype, updates) == p_dtypes
    assert jax.tree.map(lambda x: x.dtype, state) == state_dtypes
    chex.assert_tree_all_finite((p, updates, state))
  for buf in _buffers(out[-1][2], params):
    assert [x.dtype for x in buf] == [x.dtype for x in jax.tree.leaves(params)]


# The typed-hyperparameter tests trace each step as jit does (the avals must come back
# unchanged: one trace) and run the steps op by op; test_dtype_matrix runs every optimizer
# jitted on the same mixed tree, and test_inject_hyperparams_on_bfloat16_params counts the
# traces of a jitted step whose hyperparameters are bfloat16 arrays.
@pytest.mark.filterwarnings("ignore::lars_optax.LowPrecisionWarning")  # float16 Adam
@pytest.mark.parametrize("name", sorted(HYPER))
def test_typed_hyperparameters_keep_dtypes_and_trace_once(name):
  """State and updates keep the parameter dtypes whatever type the hyperparameters have
  (every kind of SCALAR_TYPES), and give the steps of the same numbers as Python floats."""
  make, kwargs = HYPER[name]
  params = _params(DTYPES)
  references: dict[tuple[float, ...], list] = {}  # by the values, as Python floats
  for kind, to in SCALAR_TYPES.items():
    tx = make(**_typed(kwargs, to))
    _assert_traced_once(tx, params)
    out = _eager_steps(tx, params)
    _assert_dtypes_kept(params, out)
    # The same numbers as Python floats (to the dtype's rounding) give the same steps.
    same = _typed(kwargs, lambda x, to=to: float(np.asarray(to(x), np.float64)))
    key = tuple(same.values())
    if key not in references:
      references[key] = out if kind == "python" else _eager_steps(make(**same), params)
    for (p, _, _), (q, _, _) in zip(out, references[key]):
      for a, b in zip(jax.tree.leaves(p), jax.tree.leaves(q)):
        tol = 1e-6 if a.dtype == jnp.float32 else 2e-2
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32),
                                   rtol=tol, atol=tol, err_msg=kind)


@pytest.mark.filterwarnings("ignore::lars_optax.LowPrecisionWarning")
@pytest.mark.parametrize("name", sorted(HYPER))
def test_float64_hyperparameters_under_x64_keep_dtypes_and_trace_once(name):
  make, kwargs = HYPER[name]
  with x64():
    params = _params(DTYPES_X64)
    for to in (np.float64, jnp.float64):
      tx = make(**_typed(kwargs, to))
      _assert_traced_once(tx, params)
      _assert_dtypes_kept(params, _eager_steps(tx, params))


@pytest.mark.parametrize("name", sorted(HYPER))
def test_inject_hyperparams_on_bfloat16_params(name):
  """optax.inject_hyperparams casts the hyperparameters to bfloat16 here."""
  make, kwargs = HYPER[name]
  tx = optax.inject_hyperparams(make)(**kwargs)
  params = _params([jnp.bfloat16])
  out, traces = _traced_steps(tx, params)
  assert traces == 1
  for p, updates, _ in out:
    assert {x.dtype for x in jax.tree.leaves((p, updates))} == {jnp.dtype(jnp.bfloat16)}
    chex.assert_tree_all_finite(updates)
  assert (jax.tree.map(lambda x: x.dtype, out[0][2].inner_state)
          == jax.tree.map(lambda x: x.dtype, out[-1][2].inner_state))


def test_inject_hyperparams_adam_default_beta2_names_the_fix_on_bfloat16():
  # bfloat16(0.999) is 1.0: out of range, and v would never be updated.
  params = _params([jnp.bfloat16])
  with pytest.raises(ValueError, match=r"^beta2: must be in \[0, 1\), got 1 \(a bfloat16 "
                     r"scalar.*hyperparam_dtype=jnp.float32"):
    optax.inject_hyperparams(lars_optax.mxnet.adam)(learning_rate=0.01).init(params)
  tx = optax.inject_hyperparams(lars_optax.mxnet.adam, hyperparam_dtype=jnp.float32)(0.01)
  out, _ = _traced_steps(tx, params)
  assert {x.dtype for x in jax.tree.leaves(out[-1][:2])} == {jnp.dtype(jnp.bfloat16)}


# --------------------------------------------------------------------------
# float16 trust ratios
# --------------------------------------------------------------------------


@pytest.mark.parametrize("make", [
    lambda: lars_optax.lars(0.1, eta=1.0, epsilon=0.0, skip=None),
    lambda: lars_optax.tf_lars(0.1, momentum=0.0, weight_decay=0.0, eeta=1.0),
], ids=["lars", "tf_lars"])
def test_float16_trust_ratio_above_the_float16_maximum_does_not_overflow(make):
  # w = 10, g = 1e-7: the ratio is about 8.4e7, beyond float16's 65504.
  params = {"w": jnp.full((4,), 10.0, jnp.float16)}
  grads = {"w": jnp.full((4,), 1e-7, jnp.float16)}
  tx = make()
  updates, state = jax.jit(tx.update)(grads, tx.init(params), params)
  g = float(np.float16(1e-7))
  ratio = 20.0 / (2 * g)
  np.testing.assert_allclose(float(lars_optax.trust_ratios(state)[0]), ratio, rtol=1e-6)
  assert updates["w"].dtype == jnp.float16
  np.testing.assert_allclose(np.asarray(updates["w"], np.float64), -0.1 * ratio * g,
                             rtol=1e-3)


# --------------------------------------------------------------------------
# Complex params, where the rule is defined (as optax.sgd and optax.adam take them)
# --------------------------------------------------------------------------


def _complex_params(dtype):
  k = jax.random.split(jax.random.key(0), 3)
  real = jnp.float64 if dtype == jnp.complex128 else jnp.float32
  w = jax.random.normal(k[0], (3, 4), real) + 1j * jax.random.normal(k[1], (3, 4), real)
  return {"w": w.astype(dtype), "b": jax.random.normal(k[2], (4,), real)}


def _real_view(tree):
  return jax.tree.map(
      lambda x: jnp.stack([x.real, x.imag], -1) if jnp.iscomplexobj(x) else x, tree)


def _complex_grads(params, i):
  """Gradients that depend on the real and imaginary parts alike (same on the real view)."""
  def g(x):
    if jnp.iscomplexobj(x):
      r = g(jnp.stack([x.real, x.imag], -1))
      return (r[..., 0] + 1j * r[..., 1]).astype(x.dtype)
    return jnp.sin(x + i) + 0.3 * x

  return jax.tree.map(g, params)


def _train_complex(tx, params, steps=4):
  state = tx.init(params)
  for i in range(steps):
    grads = _complex_grads(params, i)
    updates, state = jax.jit(tx.update)(grads, state, params)
    chex.assert_trees_all_equal_dtypes(updates, params)
    params = optax.apply_updates(params, updates)
  return params


_T = optimizers.BY_NAME
COMPLEX_VS_OPTAX = {  # every optimizer the one table marks complex, with optax's own rule
    "mxnet.sgd": (lambda: _T["mxnet.sgd"].fn(0.1, momentum=0.9),
                  lambda: optax.sgd(0.1, momentum=0.9)),
    "mxnet.nag": (lambda: _T["mxnet.nag"].fn(0.1, momentum=0.9),
                  lambda: optax.sgd(0.1, momentum=0.9, nesterov=True)),
    # MXNet's epsilon sits outside the bias correction (optax's inside): 0 for both.
    "mxnet.adam": (lambda: _T["mxnet.adam"].fn(0.1, epsilon=0.0),
                   lambda: optax.adam(0.1, eps=0.0)),
    "mxnet.adam_lazy": (lambda: _T["mxnet.adam"].fn(0.1, epsilon=0.0, lazy_update=True),
                        lambda: optax.adam(0.1, eps=0.0)),
    "lamb": (lambda: _T["lamb"].fn(0.1, wd=1e-2),
             lambda: optax.lamb(0.1, eps=1e-6, weight_decay=1e-2)),
    # torch's epsilon, like MXNet's, sits outside the bias correction: 0 for both.
    "porting.torch_sparse_adam": (lambda: _T["porting.torch_sparse_adam"].fn(0.1, eps=0.0),
                                  lambda: optax.adam(0.1, eps=0.0)),
}


def test_every_complex_optimizer_of_the_table_is_compared_with_optax():
  assert {n.removesuffix("_lazy") for n in COMPLEX_VS_OPTAX} == set(optimizers.COMPLEX)


@pytest.mark.parametrize("dtype", [jnp.complex64, jnp.complex128])
@pytest.mark.parametrize("name", list(COMPLEX_VS_OPTAX))
def test_complex_params_match_optax(name, dtype):
  ours, theirs = COMPLEX_VS_OPTAX[name]
  with x64():
    params = _complex_params(dtype)
    got = _train_complex(ours(), params)
    assert got["w"].dtype == dtype
    rtol = 1e-5 if dtype == jnp.complex64 else 1e-10
    chex.assert_trees_all_close(got, _train_complex(theirs(), params), rtol=rtol, atol=rtol)


@pytest.mark.parametrize("make", [
    lambda: lars_optax.lars(0.5, momentum=0.9, wd=1e-3, eta=0.01, skip="flax"),
    lambda: lars_optax.tf_lars(0.5, momentum=0.9, weight_decay=1e-3, eeta=0.01),
], ids=["lars", "tf_lars"])
def test_lars_on_complex_params_takes_norms_of_abs(make):
  """||w|| of a complex leaf is the norm of its real and imaginary parts together, and
  the rest of the rule is linear: the step equals the step on the real view."""
  params = _complex_params(jnp.complex64)
  got = _train_complex(make(), params)
  want = _train_complex(make(), _real_view(params))
  chex.assert_trees_all_close(_real_view(got), want, rtol=1e-5, atol=1e-6)
  tx = make()
  _, state = tx.update(_complex_grads(params, 0), tx.init(params), params)
  ratio = lars_optax.trust_ratios(state, params)["w"]
  assert ratio.dtype == jnp.float32 and ratio != 1.0
