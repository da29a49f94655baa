"""The optimizers inside the training loops of Flax (linen, nnx), Haiku and Equinox.

For each framework a small model with kernels, biases and normalisation layers
is trained for a few full-batch steps with ``lars``, ``tf_lars``, ``signum``
and ``adam``, the way that framework's users write the loop (``TrainState``,
``nnx.Optimizer``, ``hk.transform_with_state`` with a plain optax loop,
``eqx.filter``). The loss must go down. For the two LARS optimizers the logged
ratios, ``lars_optax.trust_ratios(state, params)``, must show that the
framework's skip rule skips exactly its biases and norm parameters (ratio
exactly 1) while every kernel gets a real trust ratio (finite, > 0, != 1).
``signum`` and ``adam`` get the same rule as ``wd_mult=[(rule, 0.0)]``.

Leaf names, as ``lars_optax.leaf_names`` gives them:

* linen ``TrainState.params``: ``Dense_0/kernel``, ``BatchNorm_0/scale``, ...
  (no ``params/`` prefix: ``TrainState`` hands ``tx`` the ``params``
  collection only);
* nnx, ``nnx.as_pure(nnx.state(model, nnx.Param))``: ``lin1/kernel``,
  ``bn/scale``, ... (what ``nnx.Optimizer.update`` hands ``tx``). The
  Variable-holding state that ``nnx.Optimizer.__init__`` hands ``tx.init``
  has ``lin1/kernel/value`` instead; see
  ``test_nnx_optimizer_init_sees_other_names_than_update``;
* Haiku: ``mlp/~/linear_0/w``, ``batch_norm/offset``, ``layer_norm/scale``, ...;
* Equinox, ``eqx.filter(model, eqx.is_array)``: ``mlp/layers/0/weight``,
  ``norm/weight``, ``head/bias``, ... There is no Equinox preset: a norm's
  ``weight`` has the same leaf name as a linear layer's, so the rule here is
  ``by_leaf_name("bias") | (by_leaf_name("weight") & by_ndim(1))``.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable
from typing import Any

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lars_optax
from lars_optax import masks
import optimizers

STEPS = 8
# The training loops of each framework, on four representatives (the whole table runs
# through every framework's tree below, TABLE_NAMES).
OPTIMIZERS = ("lars", "tf_lars", "signum", "adam")
LARS_LIKE = ("lars", "tf_lars")


def _data(n=64, d=4, seed=0):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(n, d)).astype(np.float32)
  y = (np.sin(x).sum(-1, keepdims=True) + 0.5 * x[:, :1] * x[:, 1:2] + 1.0).astype(np.float32)
  return jnp.asarray(x), jnp.asarray(y)


X, Y = _data()


def _mse(pred, y):
  return jnp.mean((pred - y) ** 2)


@dataclasses.dataclass(frozen=True)
class Framework:
  """How one framework names its parameters and runs a training loop.

  Attributes:
    skip: the rule for ``lars``'s ``skip`` (a preset name or a mask).
    skip_list: TF-style substrings for ``tf_lars``.
    kernels: leaf names that must get a real trust ratio.
    skipped: leaf names of biases and norm parameters (ratio exactly 1).
    train: ``train(tx, steps) -> (losses, opt_state, params)``, with the
      state and params as plain pytrees of arrays, as ``tx`` saw them.
  """

  skip: Any
  skip_list: list[str]
  kernels: tuple[str, ...]
  skipped: tuple[str, ...]
  train: Callable[[optax.GradientTransformation, int], tuple[list[float], Any, Any]]
  init_params: Callable[[], Any]


def _make_tx(name: str, fw: Framework) -> optax.GradientTransformation:
  if name == "lars":
    return lars_optax.lars(0.1, momentum=0.9, eta=1.0, wd=1e-4, skip=fw.skip)
  if name == "tf_lars":
    return lars_optax.tf_lars(0.05, momentum=0.9, eeta=1.0, skip_list=fw.skip_list)
  if name == "signum":
    return lars_optax.signum(0.01, momentum=0.9, wd=1e-4, wd_mult=[(fw.skip, 0.0)])
  if name == "adam":
    return lars_optax.mxnet.adam(0.01, wd=1e-4, wd_mult=[(fw.skip, 0.0)])
  if name == "lars_flavours":  # timm-style: the rate after the buffer, Nesterov
    # timm's no-decay group (ndim <= 1) is the Flax preset's leaves here.
    return lars_optax.porting.timm_optimizer("nlars", lr=optax.linear_schedule(0.02, 0.1, 5),
                                             momentum=0.9, trust_coeff=1.0, weight_decay=1e-4)
  if name == "lamb_flavours":  # timm-style: decoupled decay, caution
    return lars_optax.porting.timm_optimizer("lambw", lr=optax.linear_schedule(0.005, 0.02, 5),
                                             weight_decay=1e-2, caution=True)
  raise ValueError(name)


# --------------------------------------------------------------------------
# Flax linen: flax.training.train_state.TrainState, BatchNorm + LayerNorm
# --------------------------------------------------------------------------


def _linen_model():
  import flax.linen as nn

  class Net(nn.Module):

    @nn.compact
    def __call__(self, x, train: bool):
      h = nn.Dense(16)(x)
      h = nn.BatchNorm(use_running_average=not train, momentum=0.9)(h)
      h = nn.LayerNorm()(nn.relu(h))
      return nn.Dense(1)(h)

  return Net()


def _linen_init_params():
  return _linen_model().init(jax.random.key(0), X, train=False)["params"]


def _linen_train(tx, steps):
  from flax.training import train_state

  class TrainState(train_state.TrainState):
    batch_stats: Any

  model = _linen_model()
  variables = model.init(jax.random.key(0), X, train=False)
  state = TrainState.create(apply_fn=model.apply, params=variables["params"], tx=tx,
                            batch_stats=variables["batch_stats"])

  @jax.jit
  def step(state):
    def loss_fn(params):
      pred, updates = state.apply_fn({"params": params, "batch_stats": state.batch_stats},
                                     X, train=True, mutable=["batch_stats"])
      return _mse(pred, Y), updates

    (loss, updates), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    state = state.apply_gradients(grads=grads)  # calls tx.update(grads, opt_state, params)
    return state.replace(batch_stats=updates["batch_stats"]), loss

  losses = []
  for _ in range(steps):
    state, loss = step(state)
    losses.append(float(loss))
  return losses, state.opt_state, state.params


LINEN = Framework(
    skip="flax", skip_list=["bias", "scale"],
    kernels=("Dense_0/kernel", "Dense_1/kernel"),
    skipped=("BatchNorm_0/bias", "BatchNorm_0/scale", "Dense_0/bias", "Dense_1/bias",
             "LayerNorm_0/bias", "LayerNorm_0/scale"),
    train=_linen_train, init_params=_linen_init_params)


# --------------------------------------------------------------------------
# Flax nnx: nnx.Optimizer, nnx.BatchNorm + nnx.LayerNorm
# --------------------------------------------------------------------------


def _nnx_model():
  from flax import nnx

  class Net(nnx.Module):

    def __init__(self, rngs):
      self.lin1 = nnx.Linear(4, 16, rngs=rngs)
      self.bn = nnx.BatchNorm(16, momentum=0.9, rngs=rngs)
      self.ln = nnx.LayerNorm(16, rngs=rngs)
      self.lin2 = nnx.Linear(16, 1, rngs=rngs)

    def __call__(self, x):
      return self.lin2(self.ln(nnx.relu(self.bn(self.lin1(x)))))

  return Net(nnx.Rngs(0))


def _nnx_pure_params(model):
  from flax import nnx
  return nnx.as_pure(nnx.state(model, nnx.Param))


def _nnx_init_params():
  return _nnx_pure_params(_nnx_model())


def _nnx_train(tx, steps):
  from flax import nnx

  model = _nnx_model()
  model.train()
  optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)

  @nnx.jit
  def step(model, optimizer):
    loss, grads = nnx.value_and_grad(lambda m: _mse(m(X), Y))(model)
    optimizer.update(model, grads)  # tx.update(grads, opt_state, params), pure arrays
    return loss

  losses = [float(step(model, optimizer)) for _ in range(steps)]
  # The names tx.update saw are those of the pure (Variable-free) trees.
  return losses, nnx.as_pure(optimizer.opt_state), _nnx_pure_params(model)


NNX = Framework(
    skip="flax", skip_list=["bias", "scale"],
    kernels=("lin1/kernel", "lin2/kernel"),
    skipped=("bn/bias", "bn/scale", "lin1/bias", "lin2/bias", "ln/bias", "ln/scale"),
    train=_nnx_train, init_params=_nnx_init_params)


# --------------------------------------------------------------------------
# Haiku: hk.transform_with_state, hk.BatchNorm + hk.LayerNorm, an optax loop
# --------------------------------------------------------------------------


def _haiku_model():
  import haiku as hk

  def forward(x, is_training):
    h = hk.nets.MLP([16, 16], activate_final=True)(x)
    h = hk.BatchNorm(create_scale=True, create_offset=True, decay_rate=0.9)(h, is_training)
    h = hk.LayerNorm(axis=-1, create_scale=True, create_offset=True)(h)
    return hk.Linear(1)(h)

  return hk.without_apply_rng(hk.transform_with_state(forward))


def _haiku_init_params():
  params, _ = _haiku_model().init(jax.random.key(0), X, True)
  return params


def _haiku_train(tx, steps):
  model = _haiku_model()
  params, model_state = model.init(jax.random.key(0), X, True)
  opt_state = tx.init(params)

  @jax.jit
  def step(params, model_state, opt_state):
    def loss_fn(params):
      pred, model_state_ = model.apply(params, model_state, X, True)
      return _mse(pred, Y), model_state_

    (loss, model_state), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), model_state, opt_state, loss

  losses = []
  for _ in range(steps):
    params, model_state, opt_state, loss = step(params, model_state, opt_state)
    losses.append(float(loss))
  return losses, opt_state, params


HAIKU = Framework(
    skip="haiku", skip_list=["/b", "/scale", "/offset"],
    kernels=("linear/w", "mlp/~/linear_0/w", "mlp/~/linear_1/w"),
    skipped=("batch_norm/offset", "batch_norm/scale", "layer_norm/offset", "layer_norm/scale",
             "linear/b", "mlp/~/linear_0/b", "mlp/~/linear_1/b"),
    train=_haiku_train, init_params=_haiku_init_params)


# --------------------------------------------------------------------------
# Equinox: eqx.filter(model, eqx.is_array), eqx.nn.MLP + eqx.nn.LayerNorm
# --------------------------------------------------------------------------

# The preset: a LayerNorm's scale is called "weight", like a Linear's kernel,
# so norm weights are told apart by rank (kernels are >= 2-D).
EQUINOX_SKIP = masks.EQUINOX_SKIP


def _equinox_model():
  import equinox as eqx

  class Net(eqx.Module):
    mlp: eqx.nn.MLP
    norm: eqx.nn.LayerNorm
    head: eqx.nn.Linear

    def __init__(self, key):
      k1, k2 = jax.random.split(key)
      self.mlp = eqx.nn.MLP(4, 16, 16, 1, activation=jax.nn.relu,
                            final_activation=jax.nn.relu, key=k1)
      self.norm = eqx.nn.LayerNorm(16)
      self.head = eqx.nn.Linear(16, 1, key=k2)

    def __call__(self, x):
      return self.head(self.norm(self.mlp(x)))

  return Net(jax.random.key(0))


def _equinox_init_params():
  import equinox as eqx
  return eqx.filter(_equinox_model(), eqx.is_array)


def _equinox_train(tx, steps):
  import equinox as eqx

  model = _equinox_model()
  opt_state = tx.init(eqx.filter(model, eqx.is_array))

  @eqx.filter_jit
  def step(model, opt_state):
    loss, grads = eqx.filter_value_and_grad(lambda m: _mse(jax.vmap(m)(X), Y))(model)
    updates, opt_state = tx.update(grads, opt_state, eqx.filter(model, eqx.is_array))
    return eqx.apply_updates(model, updates), opt_state, loss

  losses = []
  for _ in range(steps):
    model, opt_state, loss = step(model, opt_state)
    losses.append(float(loss))
  return losses, opt_state, eqx.filter(model, eqx.is_array)


EQUINOX = Framework(
    skip=EQUINOX_SKIP, skip_list=["bias", "norm"],
    kernels=("head/weight", "mlp/layers/0/weight", "mlp/layers/1/weight"),
    skipped=("head/bias", "mlp/layers/0/bias", "mlp/layers/1/bias", "norm/bias",
             "norm/weight"),
    train=_equinox_train, init_params=_equinox_init_params)


FRAMEWORKS = {"linen": LINEN, "nnx": NNX, "haiku": HAIKU, "equinox": EQUINOX}
_IMPORTS = {"linen": "flax", "nnx": "flax", "haiku": "haiku", "equinox": "equinox"}
# The nnx tests use a recent flax's nnx (nnx.as_pure, optimizer.update(model,
# grads), a Variable named by its own path). Checked with flax 0.12.8; flax
# 0.12.0 and older name a Variable's leaf ".../value" and fail them, so an older
# flax (the demo's floor is 0.10.0) skips them.
NNX_MIN_FLAX = (0, 12, 8)


def _require_nnx():
  flax = pytest.importorskip("flax", reason="flax is not installed (the demo extra)")
  version = tuple(int(part) for part in re.findall(r"[0-9]+", flax.__version__)[:3])
  if version < NNX_MIN_FLAX:
    pytest.skip(f"the nnx tests are checked with flax >= {'.'.join(map(str, NNX_MIN_FLAX))}; "
                f"flax {flax.__version__} is installed")


def _framework(name: str) -> Framework:
  if name == "nnx":
    _require_nnx()
  pytest.importorskip(_IMPORTS[name], reason=f"{_IMPORTS[name]} is not installed (the test extra)")
  return FRAMEWORKS[name]


# --------------------------------------------------------------------------
# Tests
# --------------------------------------------------------------------------


@pytest.mark.parametrize("fw_name", list(FRAMEWORKS))
def test_leaf_names_and_skip_rules(fw_name):
  fw = _framework(fw_name)
  params = fw.init_params()
  names = sorted(n for n, _ in lars_optax.named_leaves(params))
  assert names == sorted(fw.kernels + fw.skipped)
  skip = masks.PRESETS[fw.skip] if isinstance(fw.skip, str) else fw.skip
  assert sorted(skip.select(params)) == sorted(fw.skipped)
  tf_skip = masks.by_substring(*fw.skip_list)
  assert sorted(tf_skip.select(params)) == sorted(fw.skipped)


@pytest.mark.parametrize("opt_name", OPTIMIZERS)
@pytest.mark.parametrize("fw_name", list(FRAMEWORKS))
def test_training_loop(fw_name, opt_name):
  fw = _framework(fw_name)
  losses, opt_state, params = fw.train(_make_tx(opt_name, fw), STEPS)
  assert all(math.isfinite(v) for v in losses), losses
  assert losses[-1] < 0.8 * losses[0], losses

  if opt_name not in LARS_LIKE:
    with pytest.raises(ValueError, match="no ScaleByLarsTrustRatioState"):
      lars_optax.trust_ratios(opt_state, params)
    return
  ratios = {n: float(r) for n, r in lars_optax.trust_ratios(opt_state, params).items()}
  assert sorted(ratios) == sorted(fw.kernels + fw.skipped)
  for name in fw.skipped:
    assert ratios[name] == 1.0, (name, ratios)
  for name in fw.kernels:
    assert math.isfinite(ratios[name]) and ratios[name] > 0, (name, ratios)
    assert ratios[name] != 1.0, (name, ratios)


def test_nnx_names_are_the_same_for_variables_and_pure_arrays():
  """A Variable is named by its own path: no ``/value`` suffix."""
  _require_nnx()
  from flax import nnx

  model = _nnx_model()
  optimizer = nnx.Optimizer(model, _make_tx("lars", NNX), wrt=nnx.Param)
  expected = sorted(NNX.kernels + NNX.skipped)
  ratios = lars_optax.trust_ratios(optimizer.opt_state, nnx.state(model, nnx.Param))
  assert sorted(ratios) == expected
  ratios = lars_optax.trust_ratios(nnx.as_pure(optimizer.opt_state), _nnx_pure_params(model))
  assert sorted(ratios) == expected


@pytest.mark.parametrize("kwargs", [
    {"skip": masks.by_leaf_name("bias", "scale")},
    {"lr_mult": {"lin1/kernel": 0.5}},
], ids=["skip_mask", "lr_mult_dict"])
def test_nnx_optimizer_checks_the_same_names_at_init_and_update(kwargs):
  """nnx.Optimizer calls init on Variables and update on arrays: one set of names."""
  _require_nnx()
  from flax import nnx

  model = _nnx_model()
  kwargs = {"skip": "flax", **kwargs}
  nnx.Optimizer(model, lars_optax.lars(0.1, momentum=0.9, **kwargs), wrt=nnx.Param)


# --------------------------------------------------------------------------
# Flax linen with partitioning metadata: params hold nn.Partitioned boxes
# --------------------------------------------------------------------------


def _boxed_linen_model():
  import flax.linen as nn

  def part(init, names):
    return nn.with_logical_partitioning(init, names)

  class Net(nn.Module):

    @nn.compact
    def __call__(self, x):
      h = nn.Dense(16, kernel_init=part(nn.initializers.lecun_normal(), ("embed", "mlp")),
                   bias_init=part(nn.initializers.zeros, ("mlp",)))(x)
      h = nn.LayerNorm(scale_init=part(nn.initializers.ones, ("mlp",)),
                       bias_init=part(nn.initializers.zeros, ("mlp",)))(nn.relu(h))
      return nn.Dense(1, kernel_init=part(nn.initializers.lecun_normal(), ("mlp", "out")),
                      bias_init=part(nn.initializers.zeros, ("out",)))(h)

  return Net()


BOXED_KERNELS = ("Dense_0/kernel", "Dense_1/kernel")
BOXED_SKIPPED = ("Dense_0/bias", "Dense_1/bias", "LayerNorm_0/bias", "LayerNorm_0/scale")


def test_linen_partitioned_boxes_are_named_by_the_box():
  """``nn.with_logical_partitioning`` params: ``Dense_0/kernel``, not ``.../value``."""
  pytest.importorskip("flax")
  import flax.linen as nn

  params = _boxed_linen_model().init(jax.random.key(0), X)["params"]
  assert isinstance(params["LayerNorm_0"]["scale"], nn.Partitioned)
  names = sorted(n for n, _ in lars_optax.named_leaves(params))
  assert names == sorted(BOXED_KERNELS + BOXED_SKIPPED)
  assert sorted(masks.FLAX_SKIP.select(params)) == sorted(BOXED_SKIPPED)
  assert names == sorted(n for n, _ in lars_optax.named_leaves(nn.meta.unbox(params)))


@pytest.mark.parametrize("opt_name", [*LARS_LIKE, "lars_flavours", "lamb_flavours"])
def test_linen_partitioned_boxes_train_with_the_flax_preset(opt_name):
  """Boxed params as ``init`` returns them: norm scales and biases keep ratio 1."""
  pytest.importorskip("flax")
  import flax.linen as nn

  model = _boxed_linen_model()
  params = model.init(jax.random.key(0), X)["params"]
  tx = (lars_optax.lars(0.1, momentum=0.9, eta=1.0, wd=1e-4, skip="flax") if opt_name == "lars"
        else lars_optax.tf_lars(0.05, eeta=1.0, skip="flax") if opt_name == "tf_lars"
        else _make_tx(opt_name, LINEN))
  opt_state = tx.init(params)

  @jax.jit
  def step(params, opt_state):
    loss, grads = jax.value_and_grad(
        lambda p: _mse(model.apply({"params": p}, X), Y))(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  losses = []
  for _ in range(STEPS):
    params, opt_state, loss = step(params, opt_state)
    losses.append(float(loss))
  assert isinstance(params["Dense_0"]["kernel"], nn.Partitioned)  # still boxed
  assert losses[-1] < 0.8 * losses[0], losses
  ratios = {n: float(r) for n, r in lars_optax.trust_ratios(opt_state, params).items()}
  assert sorted(ratios) == sorted(BOXED_KERNELS + BOXED_SKIPPED)
  for name in BOXED_SKIPPED:
    assert ratios[name] == 1.0, (name, ratios)
  for name in BOXED_KERNELS:
    assert math.isfinite(ratios[name]) and ratios[name] > 0 and ratios[name] != 1.0
  # The same ratios as for the unboxed params.
  plain = nn.meta.unbox(model.init(jax.random.key(0), X)["params"])
  plain_state = tx.init(plain)
  for _ in range(STEPS):
    grads = jax.grad(lambda p: _mse(model.apply({"params": p}, X), Y))(plain)
    updates, plain_state = tx.update(grads, plain_state, plain)
    plain = optax.apply_updates(plain, updates)
  chex.assert_trees_all_close(nn.meta.unbox(params), plain, rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------
# Equinox's documented loop: update(grads, state, model) with the whole model
# --------------------------------------------------------------------------


@pytest.mark.parametrize("opt_name", ["lars", "tf_lars", "signum", "adam", "sgd",
                                      "lars_flavours", "lamb_flavours"])
def test_equinox_update_with_the_model_as_params(opt_name):
  """The model's non-array leaves (activations) sit where the grads hold None."""
  pytest.importorskip("equinox")
  import equinox as eqx

  tx = (lars_optax.mxnet.sgd(0.05, momentum=0.9, wd=1e-4) if opt_name == "sgd"
        else _make_tx(opt_name, EQUINOX))
  model = _equinox_model()
  opt_state = tx.init(eqx.filter(model, eqx.is_array))

  @eqx.filter_jit
  def step(model, opt_state):
    loss, grads = eqx.filter_value_and_grad(lambda m: _mse(jax.vmap(m)(X), Y))(model)
    updates, opt_state = tx.update(grads, opt_state, model)  # the model, unfiltered
    return eqx.apply_updates(model, updates), opt_state, loss

  losses = []
  for _ in range(STEPS):
    model, opt_state, loss = step(model, opt_state)
    losses.append(float(loss))
  assert all(math.isfinite(v) for v in losses), losses
  assert losses[-1] < 0.8 * losses[0], losses
  # Identical to the loop that passes eqx.filter(model, eqx.is_array).
  ref_losses, _, ref_params = _equinox_train(tx, STEPS)
  np.testing.assert_allclose(losses, ref_losses, rtol=1e-6)
  chex.assert_trees_all_close(jax.tree.leaves(eqx.filter(model, eqx.is_array)),
                              jax.tree.leaves(ref_params), rtol=1e-6)


# --------------------------------------------------------------------------
# The rest of MXNet's registry: boxed Flax params and whole Equinox models
# --------------------------------------------------------------------------

# Every public optimizer, in its canonical configuration (tests/optimizers.py).
TABLE_NAMES = [o.name for o in optimizers.TABLE]


def _table_tx(name):
  return optimizers.BY_NAME[name].make()


# (Boxes and whole models meet every optimizer in the wrapper they share: one row per
# family in the default tier, the others in the slow one.)
@pytest.mark.op_by_op
@pytest.mark.parametrize("name", optimizers.tiered(TABLE_NAMES))
def test_every_optimizer_on_boxed_flax_params_equals_the_unboxed_run(name):
  pytest.importorskip("flax")
  import flax.linen as nn

  model = _boxed_linen_model()
  tx = _table_tx(name)

  def run(params):
    state = tx.init(params)

    @jax.jit
    def step(params, state):
      grads = jax.grad(lambda p: _mse(model.apply({"params": p}, X), Y))(params)
      updates, state = tx.update(grads, state, params)
      return optax.apply_updates(params, updates), state

    for _ in range(3):
      params, state = step(params, state)
    return params

  boxed = run(model.init(jax.random.key(0), X)["params"])
  assert isinstance(boxed["Dense_0"]["kernel"], nn.Partitioned)  # still boxed
  plain = run(nn.meta.unbox(model.init(jax.random.key(0), X)["params"]))
  chex.assert_tree_all_finite(plain)
  chex.assert_trees_all_close(nn.meta.unbox(boxed), plain, rtol=1e-6, atol=1e-7)


@pytest.mark.op_by_op
@pytest.mark.parametrize("name", optimizers.tiered(TABLE_NAMES))
def test_every_optimizer_takes_the_whole_equinox_model(name):
  pytest.importorskip("equinox")
  import equinox as eqx

  tx = _table_tx(name)
  model = _equinox_model()
  opt_state = tx.init(eqx.filter(model, eqx.is_array))

  @eqx.filter_jit
  def step(model, opt_state):
    loss, grads = eqx.filter_value_and_grad(lambda m: _mse(jax.vmap(m)(X), Y))(model)
    updates, opt_state = tx.update(grads, opt_state, model)  # the model, unfiltered
    return eqx.apply_updates(model, updates), opt_state, loss

  losses = []
  for _ in range(3):
    model, opt_state, loss = step(model, opt_state)
    losses.append(float(loss))
  ref_losses, _, ref_params = _equinox_train(tx, 3)
  assert all(math.isfinite(v) for v in losses), losses
  np.testing.assert_allclose(losses, ref_losses, rtol=1e-6)
  chex.assert_trees_all_close(jax.tree.leaves(eqx.filter(model, eqx.is_array)),
                              jax.tree.leaves(ref_params), rtol=1e-6)
