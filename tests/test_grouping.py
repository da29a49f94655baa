"""``group_by_shape=True`` (lars_optax/_grouping.py): the layer-wise step on leaves
stacked by shape gives the per-leaf step's numbers with fewer kernels."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

import lars_optax
from conftest import launched_kernels, step_lowered_for

KEY = jax.random.PRNGKey(0)


def _unrolled(blocks=3, d=8, dtype=jnp.float32):
  """An unrolled transformer-like tree: each block repeats the same shapes."""
  tree = {}
  for i in range(blocks):
    k = jax.random.fold_in(KEY, i)
    tree[f"block_{i}"] = {
        "attn": {"kernel": jax.random.normal(k, (d, d)), "bias": jnp.zeros((d,))},
        "LayerNorm_0": {"scale": jnp.ones((d,)), "bias": jnp.zeros((d,))},
        "mlp": {"kernel": jax.random.normal(jax.random.fold_in(k, 1), (d, 2 * d)),
                "bias": jnp.full((2 * d,), 0.1)}}
  tree["head"] = jax.random.normal(KEY, (d, 2))
  return jax.tree.map(lambda x: x.astype(dtype), tree)


def _run(tx, params, steps=3):
  @jax.jit
  def step(p, s, i):
    g = jax.tree.map(lambda x: jnp.sin(x.astype(jnp.float32) * (i + 1.0)).astype(x.dtype)
                     + jnp.asarray(0.01, x.dtype), p)
    u, s = tx.update(g, s, p)
    return optax.apply_updates(p, u), s

  p, s = params, tx.init(params)
  for i in range(steps):
    p, s = step(p, s, i)
  return p, s


CASES = {
    "lamb": lambda **kw: lars_optax.lamb(1e-2, **kw),
    "lamb(wd, skip, wd_skip)": lambda **kw: lars_optax.lamb(
        1e-2, wd=0.01, skip="flax", wd_skip="flax", **kw),
    "lamb(lr_mult, wd_mult)": lambda **kw: lars_optax.lamb(
        1e-2, wd=0.01, lr_mult={"head": 0.5},
        wd_mult=[(lars_optax.by_regex("mlp"), 2.0)], **kw),
    "lamb(bounds, clip, rescale)": lambda **kw: lars_optax.lamb(
        1e-2, wd=0.01, lower_bound=0.1, upper_bound=10.0, clip_gradient=1.0,
        rescale_grad=0.5, **kw),
    "lars": lambda **kw: lars_optax.lars(0.1, momentum=0.9, skip="flax", **kw),
    "lars(wd, skip=None, wd_skip, clip, rescale)": lambda **kw: lars_optax.lars(
        0.1, momentum=0.9, wd=1e-3, skip=None, wd_skip="flax", clip_gradient=1.0,
        rescale_grad=0.5, **kw),
    "lars(lr_mult)": lambda **kw: lars_optax.lars(
        0.1, momentum=0.9, skip="flax", lr_mult=[(lars_optax.by_regex("block_2"), 0.5)],
        **kw),
    "tf_lars": lambda **kw: lars_optax.tf_lars(0.1, **kw),
    "tf_lars(skip_list, nesterov)": lambda **kw: lars_optax.tf_lars(
        0.1, skip_list=["bias", "scale"], use_nesterov=True, **kw),
    "porting.timm_lars": lambda **kw: lars_optax.porting.timm_lars(
        0.1, momentum=0.9, weight_decay=1e-4, **kw),
    "porting.timm_lamb": lambda **kw: lars_optax.porting.timm_lamb(1e-2, **kw),
    "porting.timm_lamb(decoupled, caution, trust_clip)": lambda **kw: (
        lars_optax.porting.timm_lamb(1e-2, decoupled_decay=True, caution=True,
                                     trust_clip=True, **kw)),
    "porting.timm_optimizer('lamb')": lambda **kw: lars_optax.porting.timm_optimizer(
        "lamb", lr=1e-2, weight_decay=0.01, **kw),
    "porting.keras_lamb": lambda **kw: lars_optax.porting.keras_lamb(
        1e-2, weight_decay=0.01, exclude_from_weight_decay=["bias"], **kw),
    "porting.optax_lars": lambda **kw: lars_optax.porting.optax_lars(
        0.1, weight_decay=1e-4,
        trust_ratio_mask=lambda p: jax.tree.map(lambda x: x.ndim > 1, p), **kw),
    "porting.optax_lamb": lambda **kw: lars_optax.porting.optax_lamb(
        1e-2, weight_decay=0.01, mask=lambda p: jax.tree.map(lambda x: x.ndim > 1, p), **kw),
    "porting.byol_lars": lambda **kw: lars_optax.porting.byol_lars(
        0.1, weight_decay=1e-4, weight_decay_filter=lambda path, x: path[-1] != "bias",
        lars_adaptation_filter=lambda path, x: path[-1] != "bias", **kw),
    "porting.simclr_lars": lambda **kw: lars_optax.porting.simclr_lars(
        0.1, weight_decay=1e-4, exclude_from_weight_decay=["bias", "scale"], **kw),
    "porting.simclr_lars(classic_momentum=False)": lambda **kw: (
        lars_optax.porting.simclr_lars(0.1, weight_decay=1e-4, classic_momentum=False,
                                       exclude_from_weight_decay=["bias"], **kw)),
    "porting.albert_lamb": lambda **kw: lars_optax.porting.albert_lamb(
        1e-2, weight_decay_rate=0.01, exclude_from_weight_decay=["LayerNorm", "bias"], **kw),
    "lans": lambda **kw: lars_optax.lans(1e-2, **kw),
    "lans(wd, skip, clip)": lambda **kw: lars_optax.lans(
        1e-2, wd=0.01, skip="flax", wd_skip="flax", clip_gradient=1.0, **kw),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_grouped_step_equals_the_per_leaf_step(name):
  params = _unrolled()
  expected, expected_state = _run(CASES[name](), params)
  got, state = _run(CASES[name](group_by_shape=True), params)
  chex.assert_trees_all_close(got, expected, rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(lars_optax.trust_ratios(state),
                             lars_optax.trust_ratios(expected_state), rtol=1e-6)
  named = lars_optax.trust_ratios(state, params)
  assert named.keys() == lars_optax.trust_ratios(expected_state, params).keys()


@pytest.mark.parametrize("name", ["lamb", "lars", "porting.timm_lamb"])
def test_0d_leaves_share_a_stack_and_keep_their_shape(name):
  """A 0-d leaf (a CLIP temperature) is stacked as a (1,) one (the stacking every rule
  shares, so a few rules show it): the per-leaf step, and 0-d updates."""
  params = {**_unrolled(blocks=1), "logit_scale": jnp.asarray(2.6),
            "bias_scale": jnp.asarray(-0.5)}
  expected, _ = _run(CASES[name](), params)
  got, _ = _run(CASES[name](group_by_shape=True), params)
  chex.assert_trees_all_close(got, expected, rtol=1e-6, atol=1e-7)
  assert got["logit_scale"].shape == ()


def test_leaves_share_a_stack_only_when_shape_and_settings_agree():
  params = _unrolled(blocks=3)
  tx = lars_optax.lamb(1e-2, wd=0.01, skip="flax", lr_mult={"block_1/mlp/kernel": 0.5})
  grouped = lars_optax.lamb(1e-2, wd=0.01, skip="flax", lr_mult={"block_1/mlp/kernel": 0.5},
                            group_by_shape=True)
  state = grouped.init(params)
  mu = state[-1].inner[0].mu
  # Nine (8,) biases and scales share a stack (all skipped); block_1's MLP
  # kernel has its own multiplier, so it is alone.
  assert {k: v.shape[0] for k, v in mu.items()} == {
      "block_0/LayerNorm_0/bias": 9, "block_0/attn/kernel": 3, "block_0/mlp/bias": 3,
      "block_0/mlp/kernel": 2, "block_1/mlp/kernel": 1, "head": 1}
  chex.assert_trees_all_close(_run(grouped, params)[0], _run(tx, params)[0],
                              rtol=1e-6, atol=1e-7)


@pytest.mark.skipif(jax.device_count() < 2, reason="needs 2 devices (see conftest.py)")
@pytest.mark.parametrize("axis_type", ["Explicit", "Auto"])
def test_leaves_split_differently_share_a_stack_only_where_shardings_are_not_typed(axis_type):
  """With explicit mesh axes a leaf's sharding is part of its type, and a stack
  of differently split leaves a type error: those stacks follow the sharding.
  With auto axes a traced leaf does not show it, and leaves of one shape share
  a stack (XLA moves one of them to the stack's sharding)."""
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P
  mesh = jax.make_mesh((2,), ("x",), axis_types=(getattr(jax.sharding.AxisType, axis_type),),
                       devices=jax.devices()[:2])
  specs = {"a": P("x", None), "b": P(None, "x"), "c": P("x", None)}
  params = {k: jax.device_put(jax.random.normal(jax.random.fold_in(KEY, i), (8, 8)),
                              NamedSharding(mesh, spec))
            for i, (k, spec) in enumerate(specs.items())}
  grouped = lars_optax.lamb(1e-2, wd=0.01, group_by_shape=True)
  state = grouped.init(params)
  stacks = {k: v.shape[0] for k, v in state[-1].inner[0].mu.items()}
  assert stacks == ({"a": 2, "b": 1} if axis_type == "Explicit" else {"a": 3})
  step = jax.jit(lambda p, s: grouped.update(p, s, p))
  updates, _ = step(params, state)
  expected, _ = lars_optax.lamb(1e-2, wd=0.01).update(params, lars_optax.lamb(
      1e-2, wd=0.01).init(params), params)
  chex.assert_trees_all_close(updates, expected, rtol=1e-6, atol=1e-7)


def test_stacked_leaves_and_per_layer_multipliers():
  params = {"blocks": {"kernel": jax.random.normal(KEY, (4, 8, 8)), "bias": jnp.zeros((4, 8))},
            "blocks2": {"kernel": jax.random.normal(jax.random.fold_in(KEY, 1), (4, 8, 8))},
            "head": jnp.ones((8, 2))}
  stacked = {"blocks/kernel": 1, "blocks/bias": 1, "blocks2/kernel": 1}
  kw = {"wd": 0.1, "stacked": stacked,
        "lr_mult": {"blocks/kernel": np.array([1.0, 0.9, 0.8, 0.7])}}
  expected, expected_state = _run(lars_optax.lamb(1e-2, **kw), params)
  got, state = _run(lars_optax.lamb(1e-2, group_by_shape=True, **kw), params)
  chex.assert_trees_all_close(got, expected, rtol=1e-6, atol=1e-7)
  # One ratio per layer of each stacked leaf, as without grouping.
  np.testing.assert_allclose(lars_optax.trust_ratios(state),
                             lars_optax.trust_ratios(expected_state), rtol=1e-6)
  assert lars_optax.trust_ratios(state).shape == (4 + 4 + 4 + 1,)


def test_master_weights_bfloat16():
  params = _unrolled(dtype=jnp.bfloat16)
  expected, _ = _run(lars_optax.lamb(1e-2, wd=0.01, multi_precision=True), params)
  got, _ = _run(lars_optax.lamb(1e-2, wd=0.01, multi_precision=True, group_by_shape=True),
                params)
  chex.assert_trees_all_equal_dtypes(got, params)
  chex.assert_trees_all_close(got, expected, rtol=1e-6, atol=1e-7)


def _kernels(tx, params) -> int:
  """The kernels one compiled step launches."""
  def step(p, s, g):
    u, s = tx.update(g, s, p)
    return optax.apply_updates(p, u), s

  return launched_kernels(jax.jit(step, donate_argnums=(0, 1)).lower(
      params, jax.eval_shape(tx.init, params), params).compile().as_text())


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="kernel counts of the CPU backend")
def test_fewer_kernels_per_leaf():
  params = _unrolled(blocks=6)
  n = len(jax.tree.leaves(params))
  per_leaf = _kernels(lars_optax.lamb(1e-3, wd=0.01), params) / n
  grouped = _kernels(lars_optax.lamb(1e-3, wd=0.01, group_by_shape=True), params) / n
  assert grouped < 2.5 and grouped < per_leaf / 2, (grouped, per_leaf)


def test_checkpoint_round_trip_resumes_the_same_run():
  serialization = pytest.importorskip("flax.serialization")
  params = _unrolled()
  tx = lars_optax.lamb(1e-2, wd=0.01, group_by_shape=True)
  p, s = _run(tx, params, steps=2)
  restored = serialization.from_bytes(tx.init(params), serialization.to_bytes(s))
  chex.assert_trees_all_equal(restored, s)
  uninterrupted = _run(tx, params, steps=4)[0]

  @jax.jit
  def step(p, s, i):  # _run's step 2 and 3, from the restored state
    g = jax.tree.map(lambda x: jnp.sin(x * (i + 1.0)) + 0.01, p)
    u, s = tx.update(g, s, p)
    return optax.apply_updates(p, u), s

  for i in (2, 3):
    p, restored = step(p, restored, i)
  chex.assert_trees_all_close(p, uninterrupted, rtol=1e-6, atol=1e-7)


def test_errors_name_the_argument():
  with pytest.raises(ValueError, match="group_by_shape: not with axis_name"):
    lars_optax.lamb(group_by_shape=True, axis_name="batch")
  for make in (lars_optax.lans, lars_optax.lars, lars_optax.tf_lars):
    with pytest.raises(ValueError, match="group_by_shape: not with axis_name"):
      make(0.1, group_by_shape=True, axis_name="batch")
  with pytest.raises(ValueError, match="group_by_shape: not with axis_name"):
    lars_optax.porting.timm_lamb(group_by_shape=True, axis_name="batch")
  with pytest.raises(ValueError, match="group_by_shape: timm's 'cadamw'"):
    lars_optax.porting.timm_optimizer("cadamw", lr=1e-3, group_by_shape=True)
  with pytest.raises(TypeError, match="group_by_shape: expected a bool"):
    lars_optax.lamb(group_by_shape=1)
  tx = lars_optax.lamb(group_by_shape=True)
  params = _unrolled(blocks=1)
  with pytest.raises(ValueError, match="params: group_by_shape needs the params"):
    tx.update(params, tx.init(params))


def test_inside_optax_masked():
  params = _unrolled()
  mask = jax.tree.map(lambda x: x.ndim > 1, params)
  expected, expected_state = _run(optax.masked(lars_optax.lamb(1e-2, wd=0.01), mask), params)
  got, state = _run(optax.masked(lars_optax.lamb(1e-2, wd=0.01, group_by_shape=True), mask),
                    params)
  chex.assert_trees_all_close(got, expected, rtol=1e-6, atol=1e-7)
  # -1 for the leaves optax.masked routes elsewhere, as without grouping.
  np.testing.assert_allclose(lars_optax.trust_ratios(state),
                             lars_optax.trust_ratios(expected_state), rtol=1e-6)


def test_flax_linen_partitioned_boxes():
  nn = pytest.importorskip("flax.linen")

  class Net(nn.Module):
    @nn.compact
    def __call__(self, x):
      for _ in range(3):
        x = nn.Dense(8, kernel_init=nn.with_logical_partitioning(
            nn.initializers.lecun_normal(), ("embed", "mlp")),
                     bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("mlp",)))(x)
        x = nn.tanh(x)
      return x

  x = jax.random.normal(KEY, (16, 8))
  params = Net().init(KEY, x)["params"]
  assert isinstance(params["Dense_0"]["kernel"], nn.Partitioned)

  def loss(p):
    return jnp.mean(Net().apply({"params": p}, x) ** 2)

  def train(tx):
    p, s = params, tx.init(params)  # boxed params, as init returns them
    for _ in range(3):
      u, s = jax.jit(tx.update)(jax.grad(loss)(p), s, p)
      p = optax.apply_updates(p, u)
    return nn.meta.unbox(p)

  chex.assert_trees_all_close(
      train(lars_optax.lamb(1e-2, wd=0.01, skip="flax", group_by_shape=True)),
      train(lars_optax.lamb(1e-2, wd=0.01, skip="flax")), rtol=1e-6, atol=1e-7)
  # The stacks keep their members' partition names, the stacking axis unnamed,
  # so that nn.get_partition_spec shards the state as the per-leaf state.
  state = lars_optax.lamb(1e-2, wd=0.01, skip="flax", group_by_shape=True).init(params)
  specs = nn.get_partition_spec(optax.tree_utils.tree_get(state, "mu"))
  assert specs == {"Dense_0/kernel": P(None, "embed", "mlp"), "Dense_0/bias": P(None, "mlp")}


def test_flax_linen_boxes_of_different_names_share_a_stack_bare():
  """Leaves of one shape whose partition names differ share a stack as before,
  with no names: no one sharding fits all of them."""
  nn = pytest.importorskip("flax.linen")
  box = nn.Partitioned
  params = {"q": box(jnp.ones((8, 8)), names=("embed", "heads")),
            "o": box(jnp.ones((8, 8)) * 2, names=("heads", "embed")),
            "k": box(jnp.ones((8, 8)) * 3, names=("embed", "heads"))}
  tx = lars_optax.lamb(1e-2, wd=0.01, group_by_shape=True)
  state = tx.init(params)
  mu = optax.tree_utils.tree_get(state, "mu")
  assert list(mu) == ["k"]  # named after its first leaf (k, o, q in tree order)
  assert not isinstance(mu["k"], box) and mu["k"].shape == (3, 8, 8)
  updates, _ = tx.update(params, state, params)
  expected, _ = lars_optax.lamb(1e-2, wd=0.01).update(
      params, lars_optax.lamb(1e-2, wd=0.01).init(params), params)
  chex.assert_trees_all_close(nn.meta.unbox(updates), nn.meta.unbox(expected), rtol=1e-6)


def test_nnx_optimizer():
  nnx = pytest.importorskip("flax.nnx")
  if not hasattr(nnx, "as_pure"):
    pytest.skip("nnx.as_pure is newer than this flax")

  class Net(nnx.Module):
    def __init__(self, rngs):
      self.a = nnx.Linear(8, 8, rngs=rngs)
      self.b = nnx.Linear(8, 8, rngs=rngs)
      self.c = nnx.Linear(8, 8, rngs=rngs)

    def __call__(self, x):
      return self.c(jnp.tanh(self.b(jnp.tanh(self.a(x)))))

  x = jax.random.normal(KEY, (16, 8))

  def train(tx):
    model = Net(nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)

    @nnx.jit
    def step(model, optimizer):
      grads = nnx.grad(lambda m: jnp.mean(m(x) ** 2))(model)
      optimizer.update(model, grads)

    for _ in range(3):
      step(model, optimizer)
    return nnx.as_pure(nnx.state(model, nnx.Param))

  chex.assert_trees_all_close(
      train(lars_optax.lamb(1e-2, wd=0.01, skip="flax", group_by_shape=True)),
      train(lars_optax.lamb(1e-2, wd=0.01, skip="flax")), rtol=1e-6, atol=1e-7)


def test_a_nan_gradient_shows_in_its_leaf_as_without_grouping():
  params = _unrolled()
  grads = jax.tree.map(lambda x: jnp.full_like(x, 0.1), params)
  grads["block_1"]["attn"]["kernel"] = grads["block_1"]["attn"]["kernel"].at[0, 0].set(jnp.nan)
  for make in (CASES["lamb"], CASES["lars"]):
    expected = make().update(grads, make().init(params), params)[0]
    tx = make(group_by_shape=True)
    got = tx.update(grads, tx.init(params), params)[0]
    assert np.isnan(got["block_1"]["attn"]["kernel"]).any()
    # Its stack-mates take their own steps, as per leaf.
    assert np.isfinite(got["block_0"]["attn"]["kernel"]).all()
    chex.assert_trees_all_close(jax.tree.map(jnp.nan_to_num, got),
                                jax.tree.map(jnp.nan_to_num, expected), rtol=1e-6, atol=1e-7)


def test_updates_are_read_back_as_the_lowering_platform_compiles_best():
  """By index on a CPU (one kernel for all members), by constant slices for a
  GPU or TPU (fused there); the platform the step is lowered for decides, so an
  ahead-of-time compile for a GPU from this CPU process gets the slices."""
  tx = lars_optax.lamb(1e-3, wd=0.01, group_by_shape=True)
  params = {f"block_{i}": {"kernel": jnp.ones((8, 16)), "bias": jnp.zeros((16,))}
            for i in range(3)}

  def reads_by_index(platform):
    return "stablehlo.dynamic_slice" in step_lowered_for(tx, params, platform)

  assert reads_by_index("cpu")
  assert not reads_by_index("cuda") and not reads_by_index("tpu")
