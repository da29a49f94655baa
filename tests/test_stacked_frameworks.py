"""Scanned layers as each framework documents them equal the unrolled model.

Flax linen ``nn.scan`` (with an explicit ``stacked`` and with partition
boxes), nnx ``nnx.vmap`` + ``nnx.scan`` trained through ``nnx.Optimizer``,
Haiku ``hk.layer_stack`` and Equinox ``eqx.filter_vmap`` + ``lax.scan`` (with
lars, lamb and lans; every other ``stacked=`` optimizer of ``tests/optimizers.py``
with linen's boxes); and
the stack sharded over 8 virtual devices, split along a feature axis and
along the layer axis (``jit`` with ``NamedSharding``, ``shard_map`` with
``axis_name``). Each model is trained stacked and unrolled from the same
initial values; the parameters must agree to float32 noise.
"""

from __future__ import annotations

import contextlib
import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import lars_optax
import optimizers
from conftest import explicit_mesh, use_mesh
from lars_optax import masks

L, D, STEPS = 4, 8, 5
RTOL = 1e-5

# The framework models' own presets (skip="flax") at rates these small models train with;
# the table's other stacked rows are OTHER_STACKED below.
OPTIMIZERS = {
  "lars": lambda **kw: lars_optax.lars(0.5, momentum=0.9, eta=0.01, wd=1e-3, skip="flax", **kw),
  "lamb": lambda **kw: lars_optax.lamb(0.05, wd=0.01, skip="flax", **kw),
  "lans": lambda **kw: lars_optax.lans(0.05, wd=0.01, **kw),
}


def batch(i):
  kx, ky = jax.random.split(jax.random.key(50 + i))
  return jax.random.normal(kx, (16, D)), jax.random.normal(ky, (16, 3))


def assert_close(a, b):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    np.testing.assert_allclose(x, y, rtol=RTOL, atol=RTOL * np.abs(y).max())


def fit(tx, params, loss):
  """Trains ``params`` with ``loss(params, x, y)``: the plain optax loop."""
  state = tx.init(params)

  @jax.jit
  def step(params, state, x, y):
    grads = jax.grad(loss)(params, x, y)
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  for i in range(STEPS):
    params, state = step(params, state, *batch(i))
  return params, state


# --------------------------------------------------------------------------
# Flax linen: nn.scan over a block, unrolled: the same block L times.
# --------------------------------------------------------------------------


def _linen_models(partitioned: bool):
  nn = pytest.importorskip("flax.linen")
  kernel_init, bias_init = nn.initializers.lecun_normal(), nn.initializers.normal(0.1)
  if partitioned:
    kernel_init = nn.with_partitioning(kernel_init, (None, "mlp"))
    bias_init = nn.with_partitioning(bias_init, ("mlp",))

  class Block(nn.Module):
    @nn.compact
    def __call__(self, x, _=None):
      return x + jnp.tanh(nn.Dense(D, kernel_init=kernel_init, bias_init=bias_init)(x)), None

  class Scanned(nn.Module):
    @nn.compact
    def __call__(self, x):
      blocks = nn.scan(Block, variable_axes={"params": 0}, split_rngs={"params": True},
                       length=L, metadata_params={nn.PARTITION_NAME: "layers"})
      x, _ = blocks(name="blocks")(x, None)
      return nn.Dense(3, name="head")(x)

  class Unrolled(nn.Module):
    @nn.compact
    def __call__(self, x):
      for i in range(L):
        x, _ = Block(name=f"block_{i}")(x)
      return nn.Dense(3, name="head")(x)

  return Scanned(), Unrolled()


def _linen_unroll(stacked_params):
  nn = pytest.importorskip("flax.linen")
  p = nn.meta.unbox(stacked_params)
  out = {f"block_{i}": jax.tree.map(lambda x, i=i: x[i], p["blocks"]) for i in range(L)}
  out["head"] = p["head"]
  return out


def _linen_restack(unrolled):
  return {"blocks": jax.tree.map(lambda *xs: jnp.stack(xs),
                                 *[unrolled[f"block_{i}"] for i in range(L)]),
          "head": unrolled["head"]}


@pytest.mark.op_by_op
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("how", ["explicit", "partition_boxes"])
def test_flax_linen_scan_equals_unrolled_blocks(name, how):
  nn = pytest.importorskip("flax.linen")
  scanned, unrolled = _linen_models(partitioned=how == "partition_boxes")
  x0 = jnp.ones((2, D))
  params = scanned.init(jax.random.key(0), x0)["params"]
  if how == "partition_boxes":
    assert isinstance(params["blocks"]["Dense_0"]["kernel"], nn.Partitioned)
    assert lars_optax.stacked.layer_axes(params)["blocks/Dense_0/kernel"] == 1
    tx = OPTIMIZERS[name]()  # the default: read from the boxes
  else:
    tx = OPTIMIZERS[name](stacked=masks.by_regex(r"^blocks/"))

  def loss(model):
    return lambda p, x, y: jnp.mean((model.apply({"params": p}, x) - y) ** 2)

  got, state = fit(tx, params, loss(scanned))
  want, u_state = fit(OPTIMIZERS[name](), _linen_unroll(params), loss(unrolled))
  assert_close(nn.meta.unbox(got), _linen_restack(want))
  ratios = lars_optax.trust_ratios(state, got)["blocks/Dense_0/kernel"]
  want_ratios = lars_optax.trust_ratios(u_state, want)
  np.testing.assert_allclose(
      ratios, [float(want_ratios[f"block_{i}/Dense_0/kernel"]) for i in range(L)], rtol=RTOL)


# Every other optimizer of the table that takes stacked=: with stacked=FROM_METADATA (the
# default of most; optax's ports default to optax's one ratio per stack, and warn), it
# reads the scanned layers from linen's partition boxes.
OTHER_STACKED = sorted(o.name for o in optimizers.TABLE if o.stacked and o.name not in OPTIMIZERS)


@pytest.mark.op_by_op
@pytest.mark.parametrize("name", OTHER_STACKED)
def test_every_stacked_optimizer_of_the_table_reads_linen_scans_boxes(name):
  nn = pytest.importorskip("flax.linen")
  scanned, unrolled = _linen_models(partitioned=True)
  params = scanned.init(jax.random.key(0), jnp.ones((2, D)))["params"]
  make = optimizers.BY_NAME[name].make

  def loss(model):
    return lambda p, x, y: jnp.mean((model.apply({"params": p}, x) - y) ** 2)

  got, _ = fit(make(stacked=lars_optax.stacked.FROM_METADATA), params, loss(scanned))
  want, _ = fit(make(), _linen_unroll(params), loss(unrolled))
  assert_close(nn.meta.unbox(got), _linen_restack(want))


def test_flax_linen_layer_axis_not_leading_is_an_error():
  nn = pytest.importorskip("flax.linen")
  box = nn.Partitioned(jnp.ones((D, L, D)), names=("mlp", "layers", None))
  with pytest.raises(ValueError, match="stacked: leaf 'w' has the layer axis 'layers' at "
                                       "position 1"):
    lars_optax.lamb().init({"w": box})


# --------------------------------------------------------------------------
# Flax nnx: nnx.vmap builds the stack, nnx.scan runs it; nnx.Optimizer trains.
# --------------------------------------------------------------------------


def _nnx_models(partitioned=True):
  """The nnx stack and its unrolled twin; ``partitioned``: the layers carry partition
  names (nnx.with_partitioning), so that nnx.vmap adds the 'layers' axis to them."""
  nnx = pytest.importorskip("flax.nnx")

  def init(fn, names):
    return nnx.with_partitioning(fn, names) if partitioned else fn

  class Block(nnx.Module):
    def __init__(self, rngs):
      self.linear = nnx.Linear(
          D, D, rngs=rngs,
          kernel_init=init(nnx.initializers.lecun_normal(), (None, "mlp")),
          bias_init=init(nnx.initializers.normal(0.1), ("mlp",)))

    def __call__(self, x):
      return x + jnp.tanh(self.linear(x))

  class Scanned(nnx.Module):
    def __init__(self, rngs):
      @nnx.split_rngs(splits=L)
      @nnx.vmap(in_axes=(0,), out_axes=0, transform_metadata={nnx.PARTITION_NAME: "layers"})
      def make(rngs):
        return Block(rngs)

      self.blocks = make(rngs)
      self.head = nnx.Linear(D, 3, rngs=rngs)

    def __call__(self, x):
      @nnx.scan(in_axes=(0, nnx.Carry), out_axes=nnx.Carry)
      def run(block, x):
        return block(x)

      return self.head(run(self.blocks, x))

  class Unrolled(nnx.Module):
    def __init__(self, rngs):
      self.blocks = nnx.List([Block(rngs) for _ in range(L)])
      self.head = nnx.Linear(D, 3, rngs=rngs)

    def __call__(self, x):
      for block in self.blocks:
        x = block(x)
      return self.head(x)

  return nnx, Scanned, Unrolled


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_flax_nnx_vmap_scan_through_nnx_optimizer_equals_unrolled(name):
  nnx, Scanned, Unrolled = _nnx_models()
  # Partition names need a mesh that knows them (one device here).
  with jax.set_mesh(Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("layers", "mlp"))):
    _nnx_train_and_compare(nnx, Scanned, Unrolled, name)


def _nnx_train_and_compare(nnx, Scanned, Unrolled, name, stacked=None):
  """Trains both; ``stacked``: passed to the optimizer (None: the default, metadata)."""
  scanned, unrolled = Scanned(nnx.Rngs(0)), Unrolled(nnx.Rngs(1))
  kwargs = {} if stacked is None else {"stacked": stacked}
  # The same initial values in both.
  for i in range(L):
    for leaf in ("kernel", "bias"):
      getattr(unrolled.blocks[i].linear, leaf)[...] = getattr(scanned.blocks.linear, leaf)[i]
  unrolled.head.kernel[...], unrolled.head.bias[...] = scanned.head.kernel[...], \
      scanned.head.bias[...]
  state = nnx.state(scanned, nnx.Param)
  assert lars_optax.stacked.layer_axes(state, **kwargs)["blocks/linear/kernel"] == 1

  def train(model, **kwargs):
    optimizer = nnx.Optimizer(model, OPTIMIZERS[name](**kwargs), wrt=nnx.Param)

    @nnx.jit
    def step(model, optimizer, x, y):
      grads = nnx.grad(lambda m: jnp.mean((m(x) - y) ** 2))(model)
      optimizer.update(model, grads)

    for i in range(STEPS):
      step(model, optimizer, *batch(i))
    return optimizer

  opt_s, opt_u = train(scanned, **kwargs), train(unrolled)
  for leaf in ("kernel", "bias"):
    got = getattr(scanned.blocks.linear, leaf)[...]
    want = jnp.stack([getattr(unrolled.blocks[i].linear, leaf)[...] for i in range(L)])
    assert_close(got, want)
  ratios = lars_optax.trust_ratios(nnx.as_pure(opt_s.opt_state),
                                   nnx.as_pure(nnx.state(scanned, nnx.Param)))
  u_ratios = lars_optax.trust_ratios(nnx.as_pure(opt_u.opt_state),
                                     nnx.as_pure(nnx.state(unrolled, nnx.Param)))
  np.testing.assert_allclose(
      ratios["blocks/linear/kernel"],
      [float(u_ratios[f"blocks/{i}/linear/kernel"]) for i in range(L)], rtol=RTOL)


@pytest.mark.op_by_op
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_an_nnx_stack_without_partition_names_warns_and_its_advice_equals_unrolled(name):
  """nnx.vmap gives plain layers (no nnx.with_partitioning) no 'layers' metadata: the
  default then takes one ratio per stack, and init says so (#37 item 3); the rule it
  names trains the stack as the unrolled model."""
  nnx, Scanned, Unrolled = _nnx_models(partitioned=False)
  model = Scanned(nnx.Rngs(0))
  assert not any(lars_optax.stacked.layer_axes(nnx.state(model, nnx.Param)).values())
  with pytest.warns(UserWarning, match=r"^stacked: \['blocks/linear/bias', "
                    r"'blocks/linear/kernel'\] look like a stack of layers .*"
                    r"stacked=lars_optax.by_regex\('\^blocks/'\)") as record:
    nnx.Optimizer(model, OPTIMIZERS[name](), wrt=nnx.Param)
  rule = eval(str(record[0].message).split("stacked=")[2].split(" (one")[0],
              {"lars_optax": lars_optax})
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    _nnx_train_and_compare(nnx, Scanned, Unrolled, name, stacked=rule)


# --------------------------------------------------------------------------
# Haiku: hk.layer_stack.
# --------------------------------------------------------------------------


@pytest.mark.op_by_op
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_haiku_layer_stack_equals_unrolled(name):
  hk = pytest.importorskip("haiku")

  def block(x):
    return x + jnp.tanh(hk.Linear(D, b_init=hk.initializers.RandomNormal(0.1))(x))

  def scanned(x):
    return hk.Linear(3, name="head")(hk.layer_stack(L, name="blocks")(block)(x))

  def unrolled(x):
    for i in range(L):
      with hk.name_scope(f"block_{i}"):
        x = block(x)
    return hk.Linear(3, name="head")(x)

  fs, fu = hk.without_apply_rng(hk.transform(scanned)), hk.without_apply_rng(
      hk.transform(unrolled))
  ps = fs.init(jax.random.key(0), jnp.ones((2, D)))
  stack = next(k for k in ps if k != "head")
  pu = {f"block_{i}/linear": jax.tree.map(lambda x, i=i: x[i], ps[stack]) for i in range(L)}
  pu["head"] = ps["head"]
  assert set(pu) == set(fu.init(jax.random.key(1), jnp.ones((2, D))))

  def loss(f):
    return lambda p, x, y: jnp.mean((f.apply(p, x) - y) ** 2)

  make = {**OPTIMIZERS, "lars": lambda **kw: lars_optax.lars(0.5, momentum=0.9, eta=0.01,
                                                             wd=1e-3, skip="haiku", **kw)}[name]
  got, _ = fit(make(stacked=masks.by_regex("^" + stack)), ps, loss(fs))
  want, _ = fit(make(), pu, loss(fu))
  assert_close(got[stack], jax.tree.map(lambda *xs: jnp.stack(xs),
                                        *[want[f"block_{i}/linear"] for i in range(L)]))


# --------------------------------------------------------------------------
# Equinox: eqx.filter_vmap builds the stack, lax.scan runs it.
# --------------------------------------------------------------------------


@pytest.mark.op_by_op
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_equinox_filter_vmap_equals_unrolled(name):
  eqx = pytest.importorskip("equinox")

  class Scanned(eqx.Module):
    blocks: eqx.nn.Linear
    head: eqx.nn.Linear

    def __call__(self, x):
      dynamic, static = eqx.partition(self.blocks, eqx.is_array)

      def run(x, d):
        return x + jnp.tanh(eqx.combine(d, static)(x)), None

      return self.head(jax.lax.scan(run, x, dynamic)[0])

  class Unrolled(eqx.Module):
    blocks: list
    head: eqx.nn.Linear

    def __call__(self, x):
      for b in self.blocks:
        x = x + jnp.tanh(b(x))
      return self.head(x)

  keys = jax.random.split(jax.random.key(0), L + 1)
  blocks = eqx.filter_vmap(lambda k: eqx.nn.Linear(D, D, key=k))(keys[:L])
  scanned = Scanned(blocks, eqx.nn.Linear(D, 3, key=keys[L]))
  unrolled = Unrolled([jax.tree.map(lambda x, i=i: x[i] if eqx.is_array(x) else x, blocks)
                       for i in range(L)], scanned.head)

  def loss(model, x, y):
    return jnp.mean((jax.vmap(model)(x) - y) ** 2)

  make = {**OPTIMIZERS, "lars": lambda **kw: lars_optax.lars(0.5, momentum=0.9, eta=0.01,
                                                             wd=1e-3, skip="equinox", **kw)}[name]

  def train(model, tx):
    state = tx.init(eqx.filter(model, eqx.is_array))

    @eqx.filter_jit
    def step(model, state, x, y):
      grads = eqx.filter_grad(loss)(model, x, y)
      updates, state = tx.update(grads, state, model)  # the whole model, as Equinox does
      return eqx.apply_updates(model, updates), state

    for i in range(STEPS):
      model, state = step(model, state, *batch(i))
    return model

  got = train(scanned, make(stacked=masks.by_regex(r"^blocks/")))
  want = train(unrolled, make())
  for leaf in ("weight", "bias"):
    assert_close(getattr(got.blocks, leaf),
                 jnp.stack([getattr(b, leaf) for b in want.blocks]))


# --------------------------------------------------------------------------
# Sharded over 8 virtual devices: jit with NamedSharding, shard_map + axis_name.
# --------------------------------------------------------------------------

N_LAYERS = 8  # divisible by the mesh for the layer-axis split


def _sharded_params():
  k1, k2 = jax.random.split(jax.random.key(3))
  scales = jnp.linspace(0.1, 2.0, N_LAYERS)[:, None, None]
  return {"blocks": {"kernel": jax.random.normal(k1, (N_LAYERS, D, D)) * scales,
                     "bias": jax.random.normal(k2, (N_LAYERS, D)) * 0.1}}


def _grads(p):
  return jax.tree.map(lambda x: 0.3 * x + 0.01 * jnp.cos(jnp.arange(x.size).reshape(x.shape)), p)


_needs_8 = pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 devices (conftest.py)")
STACK = masks.by_regex(r"^blocks/")


@_needs_8
@pytest.mark.parametrize("name", [*sorted(OPTIMIZERS), "lamb_by_shape"])
@pytest.mark.parametrize("split", ["feature", "layer"])
@pytest.mark.parametrize("axes", ["auto", "explicit"])
def test_jit_with_a_sharded_stack_equals_one_device(name, split, axes):
  """Also with explicit mesh axes, where the per-layer norms of a stack split by
  layers are typed as split, and are replicated before they meet the others."""
  mesh = (Mesh(np.array(jax.devices()[:8]), ("x",)) if axes == "auto"
          else explicit_mesh((8,), ("x",)))
  spec = {"blocks": {"kernel": P(None, None, "x") if split == "feature" else P("x"),
                     "bias": P(None, "x") if split == "feature" else P("x")},
          "head": P()}
  params = {**_sharded_params(), "head": jax.random.normal(jax.random.key(4), (D, 3))}
  tx = (OPTIMIZERS[name](stacked=STACK) if name in OPTIMIZERS
        else OPTIMIZERS["lamb"](stacked=STACK, group_by_shape=True))
  want, want_state = tx.update(_grads(params), tx.init(params), params)
  sharded = jax.device_put(params, jax.tree.map(lambda s: NamedSharding(mesh, s), spec))
  with use_mesh(mesh) if axes == "explicit" else contextlib.nullcontext():
    got, state = jax.jit(lambda p: tx.update(_grads(p), tx.init(p), p))(sharded)
  assert_close(got, want)
  np.testing.assert_allclose(lars_optax.trust_ratios(state), lars_optax.trust_ratios(want_state),
                             rtol=1e-5)


@_needs_8
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_shard_map_feature_split_with_axis_name_equals_one_device(name):
  """A stack split along a feature axis: per-layer norms are summed over the mesh axis."""
  mesh = Mesh(np.array(jax.devices()[:8]), ("x",))
  spec = {"blocks": {"kernel": P(None, None, "x"), "bias": P(None, "x")}}
  params = _sharded_params()
  tx = OPTIMIZERS[name](stacked=STACK)
  want, _ = tx.update(_grads(params), tx.init(params), params)
  split = OPTIMIZERS[name](stacked=STACK, axis_name="x")

  @jax.jit
  @functools.partial(jax.shard_map, mesh=mesh, in_specs=(spec, spec), out_specs=spec)
  def step(p, g):
    return split.update(g, split.init(p), p)[0]

  assert_close(step(params, _grads(params)), want)


@_needs_8
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_shard_map_layer_split_needs_no_axis_name(name):
  """A stack split along its layer axis: each device holds whole layers."""
  mesh = Mesh(np.array(jax.devices()[:8]), ("x",))
  spec = {"blocks": {"kernel": P("x"), "bias": P("x")}}
  params = _sharded_params()
  tx = OPTIMIZERS[name](stacked=STACK)
  want, _ = tx.update(_grads(params), tx.init(params), params)

  @jax.jit
  @functools.partial(jax.shard_map, mesh=mesh, in_specs=(spec, spec), out_specs=spec)
  def step(p, g):
    return tx.update(g, tx.init(p), p)[0]

  assert_close(step(params, _grads(params)), want)


# --------------------------------------------------------------------------
# A scanned model that forgot stacked=: a warning at init.
# --------------------------------------------------------------------------


def _scanned_without_metadata():
  nn = pytest.importorskip("flax.linen")

  class Block(nn.Module):
    @nn.compact
    def __call__(self, x, _=None):
      return x + jnp.tanh(nn.Dense(D)(x)), None

  class Model(nn.Module):
    @nn.compact
    def __call__(self, x):
      x, _ = nn.scan(Block, variable_axes={"params": 0}, split_rngs={"params": True},
                     length=L)()(x, None)  # no metadata_params: nothing marks the stack
      return nn.Dense(3)(x)

  return Model().init(jax.random.key(0), jnp.ones((2, D)))["params"]


def _haiku_layer_stack_params():
  hk = pytest.importorskip("haiku")

  def f(x):
    return hk.layer_stack(L)(lambda x: x + jnp.tanh(hk.Linear(D)(x)))(x)

  return hk.transform(f).init(jax.random.key(0), jnp.ones((2, D)))


WARNS = {
    "lars": lambda **kw: lars_optax.lars(0.1, momentum=0.9, skip=None, **kw),
    "tf_lars": lambda **kw: lars_optax.tf_lars(0.1, **kw),
    "lamb": lambda **kw: lars_optax.lamb(1e-3, **kw),
    "lans": lambda **kw: lars_optax.lans(1e-3, **kw),
    "create_lamb": lambda **kw: lars_optax.mxnet.create("lamb", learning_rate=1e-3, **kw),
}


@pytest.mark.parametrize("name", sorted(WARNS))
@pytest.mark.parametrize("params", [_scanned_without_metadata, _haiku_layer_stack_params],
                         ids=["flax_nn_scan", "haiku_layer_stack"])
def test_a_scanned_model_without_stacked_warns_at_init(name, params):
  p = params()
  with pytest.warns(UserWarning, match=r"^stacked: .* look like a stack of layers"):
    WARNS[name]().init(p)
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    WARNS[name](stacked=None).init(p)  # one ratio per stack, on purpose: silent


@pytest.mark.parametrize("params", [_scanned_without_metadata, _haiku_layer_stack_params],
                         ids=["flax_nn_scan", "haiku_layer_stack"])
def test_the_warning_names_a_stacked_rule_that_silences_it(params):
  p = params()
  with pytest.warns(UserWarning) as record:
    lars_optax.lamb(1e-3).init(p)
  rule = eval(str(record[0].message).split("stacked=")[2].split(" (one")[0],
              {"lars_optax": lars_optax})
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    lars_optax.lamb(1e-3, stacked=rule).init(p)
  assert lars_optax.stacked.layer_axes(p, rule)  # the stack's leaves, one layer axis each



def _own_scan_named_models():
  """User classes whose names start with Scan, with nothing scanned (#37 item 5)."""
  nn = pytest.importorskip("flax.linen")

  class ScanNet(nn.Module):  # Dense with a bias: the bias is 1-d
    @nn.compact
    def __call__(self, x):
      return nn.Dense(D)(x)

  class ScanEncoder(nn.Module):  # Dense without a bias: one 2-d kernel
    @nn.compact
    def __call__(self, x):
      return nn.Dense(D, use_bias=False)(x)

  class Model(nn.Module):
    @nn.compact
    def __call__(self, x):
      return ScanEncoder()(ScanNet()(x))

  return Model().init(jax.random.key(0), jnp.ones((2, D)))["params"]


@pytest.mark.op_by_op
@pytest.mark.parametrize("name", sorted(WARNS))
def test_a_module_named_scan_that_scans_nothing_does_not_warn(name):
  p = _own_scan_named_models()
  assert {"ScanNet_0/Dense_0/kernel", "ScanEncoder_0/Dense_0/kernel"} <= {
      n for n, _ in lars_optax.named_leaves(p)}
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    WARNS[name]().init(p)
