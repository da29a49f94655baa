"""Layer-wise rules on stacked (scanned) layers equal the unrolled model.

A stack of L blocks is one leaf with a leading layer axis. Each test trains
the same model twice from the same initial values, once stacked (a
``lax.scan`` over the blocks) and once unrolled (one leaf per block), and
asserts the parameters agree to float32 noise. Framework tests (Flax linen
``nn.scan``, nnx ``vmap`` + ``scan``, Haiku ``layer_stack``, Equinox
``filter_vmap``) are in ``test_stacked_frameworks.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lars_optax
import optimizers
from conftest import launched_kernels, step_lowered_for
from lars_optax import masks

L, D, STEPS = 4, 8, 6
RTOL = 1e-5  # float32 noise after STEPS steps (issue: <= 1e-5 relative)


def stacked_params(key=0):
  k1, k2, k3 = jax.random.split(jax.random.key(key), 3)
  scales = jnp.array([0.3, 1.0, 0.05, 2.0])[:, None, None]  # very different layer norms
  return {"blocks": {"kernel": jax.random.normal(k1, (L, D, D)) * scales,
                     "bias": jax.random.normal(k2, (L, D)) * 0.1},
          "head": {"kernel": jax.random.normal(k3, (D, 3)) * 0.5, "bias": jnp.zeros((3,))}}


def unroll(p):
  out = {f"blocks_{i}": {"kernel": p["blocks"]["kernel"][i], "bias": p["blocks"]["bias"][i]}
         for i in range(L)}
  out["head"] = p["head"]
  return out


def restack(u):
  return {"blocks": {n: jnp.stack([u[f"blocks_{i}"][n] for i in range(L)])
                     for n in ("kernel", "bias")}, "head": u["head"]}


def _block(x, k, b):
  return x + jnp.tanh(x @ k + b)


def loss_stacked(p, x, y):
  x, _ = jax.lax.scan(lambda h, kb: (_block(h, *kb), None), x,
                      (p["blocks"]["kernel"], p["blocks"]["bias"]))
  return jnp.mean((x @ p["head"]["kernel"] + p["head"]["bias"] - y) ** 2)


def loss_unrolled(p, x, y):
  for i in range(L):
    x = _block(x, p[f"blocks_{i}"]["kernel"], p[f"blocks_{i}"]["bias"])
  return jnp.mean((x @ p["head"]["kernel"] + p["head"]["bias"] - y) ** 2)


def data(step):
  kx, ky = jax.random.split(jax.random.key(100 + step))
  return jax.random.normal(kx, (16, D)), jax.random.normal(ky, (16, 3))


def train(tx, params, loss, steps=STEPS):
  state = tx.init(params)

  @jax.jit
  def step(params, state, x, y):
    g = jax.grad(loss)(params, x, y)
    u, state = tx.update(g, state, params)
    return optax.apply_updates(params, u), state

  for i in range(steps):
    params, state = step(params, state, *data(i))
  return params, state


def assert_close(a, b, rtol=RTOL):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    np.testing.assert_allclose(x, y, rtol=rtol, atol=rtol * np.abs(y).max())


STACK = masks.by_regex(r"^blocks/")
PER_LAYER_LR = np.array([1.0, 0.8, 0.64, 0.512])


def _per_layer(value_of_layer):
  """lr_mult-style dicts for the stacked and the unrolled model."""
  return ({"blocks/kernel": np.array([value_of_layer(i) for i in range(L)])},
          {f"blocks_{i}/kernel": value_of_layer(i) for i in range(L)})


# The layer-wise rules with the options stacking changes (skip, Nesterov, bounds); the
# table's other stacked rows are added below.
CASES = {
  "lars": lambda **kw: lars_optax.lars(0.5, momentum=0.9, eta=0.01, wd=1e-3, **kw),
  "lars_skip_flax": lambda **kw: lars_optax.lars(0.5, momentum=0.9, wd=1e-3, skip="flax", **kw),
  "tf_lars": lambda **kw: lars_optax.tf_lars(0.5, momentum=0.9, weight_decay=1e-3, **kw),
  "tf_lars_nesterov_skip": lambda **kw: lars_optax.tf_lars(
      0.5, use_nesterov=True, skip=masks.by_ndim(1), **kw),
  "lamb": lambda **kw: lars_optax.lamb(0.05, wd=0.01, **kw),
  "lamb_bounds_skip": lambda **kw: lars_optax.lamb(
      0.05, wd=0.01, lower_bound=0.5, upper_bound=3.0, skip="flax", **kw),
  "lans": lambda **kw: lars_optax.lans(0.05, wd=0.01, **kw),
  # The flavours of timm, optax and Keras (docs/porting.md), with a schedule.
  "timm_nlarc_dampened": lambda **kw: lars_optax.porting.timm_optimizer(
      "nlarc", lr=optax.linear_schedule(0.05, 0.5, 4), momentum=0.9, trust_coeff=0.05,
      weight_decay=1e-3, **kw),
  "timm_lars_dampened_always_adapt": lambda **kw: lars_optax.porting.timm_lars(
      optax.linear_schedule(0.05, 0.5, 4), momentum=0.9, dampening=0.1, weight_decay=1e-3,
      always_adapt=True, **kw),
  "optax_lars_nesterov": lambda **kw: lars_optax.porting.optax_lars(
      optax.linear_schedule(0.05, 0.5, 4), weight_decay=1e-3, nesterov=True, **kw),
  "timm_lamb_cautious_decoupled_clipped": lambda **kw: lars_optax.porting.timm_lamb(
      optax.linear_schedule(0.005, 0.05, 4), weight_decay=0.01, caution=True,
      decoupled_decay=True, trust_clip=True, grad_averaging=False, **kw),
  "optax_lamb_eps_root": lambda **kw: lars_optax.porting.optax_lamb(
      optax.linear_schedule(0.005, 0.05, 4), weight_decay=0.01, eps_root=1e-8, **kw),
  "lans_bounds_clip": lambda **kw: lars_optax.lans(
      0.05, wd=0.01, lower_bound=0.5, upper_bound=3.0, clip_gradient=0.3, skip="flax", **kw),
  "create_lars": lambda **kw: lars_optax.mxnet.create("lars", learning_rate=0.5, momentum=0.9,
                                                wd=1e-3, **kw),
  "create_lamb": lambda **kw: lars_optax.mxnet.create("lamb", learning_rate=0.05, wd=0.01, **kw),
  "create_lans": lambda **kw: lars_optax.mxnet.create("lans", learning_rate=0.05, wd=0.01, **kw),
}
# Every other optimizer of the one table that takes stacked=, in its table configuration.
_COVERED = {"lars", "tf_lars", "lamb", "lans", "porting.timm_optimizer", "porting.timm_lars",
            "porting.optax_lars", "porting.timm_lamb", "porting.optax_lamb"}
CASES.update({o.name: lambda o=o, **kw: o.make(**kw) for o in optimizers.TABLE
              if o.stacked and o.name not in _COVERED})


@pytest.mark.op_by_op
@pytest.mark.parametrize("name", sorted(CASES))
def test_stacked_blocks_equal_unrolled_blocks(name):
  p0 = stacked_params()
  stacked, _ = train(CASES[name](stacked=STACK), p0, loss_stacked)
  unrolled, _ = train(CASES[name](), unroll(p0), loss_unrolled)
  assert_close(stacked, restack(unrolled))


@pytest.mark.op_by_op
@pytest.mark.quick
def test_without_stacked_one_norm_over_the_stack_differs():
  """The defect this fixes: the stack is one leaf, with one ratio for all layers."""
  p0 = stacked_params()
  flat, _ = train(lars_optax.lamb(0.05, wd=0.01, stacked=None), p0, loss_stacked)
  unrolled, _ = train(lars_optax.lamb(0.05, wd=0.01), unroll(p0), loss_unrolled)
  diff = np.abs(np.asarray(flat["blocks"]["kernel"] - restack(unrolled)["blocks"]["kernel"]))
  assert diff.max() > 1e-3


@pytest.mark.op_by_op
@pytest.mark.parametrize("make", [
  lambda **kw: lars_optax.lars(0.5, momentum=0.9, wd=1e-3, **kw),
  lambda **kw: lars_optax.lamb(0.05, wd=0.01, **kw),
  lambda **kw: lars_optax.lans(0.05, wd=0.01, **kw),
], ids=["lars", "lamb", "lans"])
def test_per_layer_lr_mult_and_wd_mult_equal_one_multiplier_per_unrolled_layer(make):
  lr_s, lr_u = _per_layer(lambda i: float(PER_LAYER_LR[i]))
  wd_s, wd_u = _per_layer(lambda i: 0.5 * i)
  p0 = stacked_params()
  stacked, _ = train(make(stacked=STACK, lr_mult=lr_s, wd_mult=wd_s), p0, loss_stacked)
  unrolled, _ = train(make(lr_mult=lr_u, wd_mult=wd_u), unroll(p0), loss_unrolled)
  assert_close(stacked, restack(unrolled))


@pytest.mark.op_by_op
@pytest.mark.parametrize("make", [
  lambda **kw: lars_optax.lars(0.5, momentum=0.9, wd=1e-3, skip="flax", **kw),
  lambda **kw: lars_optax.lamb(0.05, wd=0.01, **kw),
  lambda **kw: lars_optax.lans(0.05, wd=0.01, **kw),
], ids=["lars", "lamb", "lans"])
def test_multi_precision_bfloat16_stacked_equals_unrolled(make):
  p0 = jax.tree.map(lambda x: x.astype(jnp.bfloat16), stacked_params())
  stacked, s_state = train(make(stacked=STACK, multi_precision=True), p0, loss_stacked)
  unrolled, u_state = train(make(multi_precision=True), unroll(p0), loss_unrolled)
  # The masters are float32: compare them at float32 noise.
  assert_close(lars_optax.master_params(s_state, stacked),
               restack(lars_optax.master_params(u_state, unrolled)))


def test_rules_with_k_layer_axes_equal_unrolled_stages_times_layers():
  """{name: 2}: a (stages, layers) grid of blocks, each its own layer."""
  p0 = stacked_params()
  grid = {"blocks": {"kernel": p0["blocks"]["kernel"].reshape(2, 2, D, D),
                     "bias": p0["blocks"]["bias"].reshape(2, 2, D)}, "head": p0["head"]}

  def loss_grid(p, x, y):
    flat = {"blocks": {n: v.reshape((L, *v.shape[2:])) for n, v in p["blocks"].items()},
            "head": p["head"]}
    return loss_stacked(flat, x, y)

  for rules in ({"blocks/kernel": 2, "blocks/bias": 2}, [(STACK, 2)]):
    tx = lars_optax.lamb(0.05, wd=0.01, stacked=rules)
    got, state = train(tx, grid, loss_grid)
    unrolled, u_state = train(lars_optax.lamb(0.05, wd=0.01), unroll(p0), loss_unrolled)
    want = restack(unrolled)
    assert_close(got["blocks"]["kernel"].reshape(L, D, D), want["blocks"]["kernel"])
    ratios = lars_optax.trust_ratios(state, got)
    assert ratios["blocks/kernel"].shape == (2, 2)
    u_ratios = lars_optax.trust_ratios(u_state, unrolled)
    np.testing.assert_allclose(
        np.ravel(ratios["blocks/kernel"]),
        [float(u_ratios[f"blocks_{i}/kernel"]) for i in range(L)], rtol=RTOL)


@pytest.mark.op_by_op
@pytest.mark.quick
@pytest.mark.parametrize("make", [
  lambda **kw: lars_optax.lars(0.5, momentum=0.9, wd=1e-3, **kw),
  lambda **kw: lars_optax.tf_lars(0.5, **kw),
  lambda **kw: lars_optax.lamb(0.05, wd=0.01, **kw),
  lambda **kw: lars_optax.lans(0.05, wd=0.01, **kw),
], ids=["lars", "tf_lars", "lamb", "lans"])
def test_trust_ratios_of_a_stacked_leaf_are_the_unrolled_layers_ratios(make):
  p0 = stacked_params()
  stacked, s_state = train(make(stacked=STACK), p0, loss_stacked, steps=3)
  unrolled, u_state = train(make(), unroll(p0), loss_unrolled, steps=3)
  got = lars_optax.trust_ratios(s_state, stacked)
  want = lars_optax.trust_ratios(u_state, unrolled)
  assert got["blocks/kernel"].shape == (L,)
  for leaf in ("kernel", "bias"):
    np.testing.assert_allclose(got[f"blocks/{leaf}"],
                               [float(want[f"blocks_{i}/{leaf}"]) for i in range(L)], rtol=RTOL)
  # The layers differ (that is the point), and the head is a scalar as before.
  assert np.ptp(np.asarray(got["blocks/kernel"])) > 0
  assert np.ndim(got["head/kernel"]) == 0
  # The vector form: each stacked leaf's layers in place of its one entry.
  vec = lars_optax.trust_ratios(s_state)
  expect = np.concatenate([np.ravel(got[n]) for n, _ in lars_optax.named_leaves(stacked)])
  np.testing.assert_allclose(vec, expect)


def test_trust_ratios_under_jit_and_without_stacking_keep_their_form():
  p0 = stacked_params()
  tx = lars_optax.lars(0.5, stacked=STACK)
  _, state = train(tx, p0, loss_stacked, steps=1)
  got = jax.jit(lars_optax.trust_ratios)(state)
  assert got.shape == (2 * L + 2,)
  _, state = train(lars_optax.lars(0.5, stacked=None), p0, loss_stacked, steps=1)
  assert lars_optax.trust_ratios(state).shape == (4,)
  assert state[1].layer_trust_ratio == ()  # nothing stacked: the state is as before


@pytest.mark.op_by_op
def test_skip_mask_selecting_a_stacked_leaf_skips_all_its_layers():
  p0 = stacked_params()
  tx = lars_optax.lars(0.5, skip=masks.by_leaf_name("kernel"), stacked=STACK)
  params, state = train(tx, p0, loss_stacked, steps=2)
  ratios = lars_optax.trust_ratios(state, params)
  np.testing.assert_array_equal(ratios["blocks/kernel"], np.ones(L))
  assert np.all(np.asarray(ratios["blocks/bias"]) != 1)


@pytest.mark.op_by_op
def test_masks_judge_one_layer_of_a_stacked_leaf():
  """by_ndim(1) selects the stacked bias (L, D), as it selects each unrolled bias."""
  p0 = stacked_params()
  tx = lars_optax.lamb(0.05, skip=masks.by_ndim(1), stacked=STACK)
  params, state = train(tx, p0, loss_stacked, steps=2)
  ratios = lars_optax.trust_ratios(state, params)
  np.testing.assert_array_equal(ratios["blocks/bias"], np.ones(L))
  assert np.all(np.asarray(ratios["blocks/kernel"]) != 1)
  # The same for lr_mult rules.
  lr_rules = [(masks.by_ndim(1), 0.0)]
  params, _ = train(lars_optax.lamb(0.05, stacked=STACK, lr_mult=lr_rules), p0, loss_stacked)
  np.testing.assert_array_equal(params["blocks"]["bias"], p0["blocks"]["bias"])


def test_zero_layer_in_a_stack_falls_back_to_ratio_one_for_that_layer_only():
  p0 = stacked_params()
  p0["blocks"]["kernel"] = p0["blocks"]["kernel"].at[2].set(0.0)
  tx = lars_optax.lars(0.5, stacked=STACK)
  _, state = train(tx, p0, loss_stacked, steps=1)
  r = np.asarray(lars_optax.trust_ratios(state, p0)["blocks/kernel"])
  assert r[2] == 1.0 and np.all(r[[0, 1, 3]] < 0.1)


@pytest.mark.op_by_op
def test_global_norm_clipping_and_schedules_stay_global():
  """clip_by_global_norm and the step count see the whole tree, stacked or not."""
  p0 = stacked_params()
  sched = optax.linear_schedule(0.5, 0.1, 4)
  make = lambda **kw: optax.chain(optax.clip_by_global_norm(0.1),
                                  lars_optax.lars(sched, momentum=0.9, **kw))
  stacked, _ = train(make(stacked=STACK), p0, loss_stacked)
  unrolled, _ = train(make(), unroll(p0), loss_unrolled)
  assert_close(stacked, restack(unrolled))


@pytest.mark.op_by_op
def test_building_blocks_take_stacked():
  p0 = stacked_params()
  g = jax.grad(loss_stacked)(p0, *data(0))
  gu = jax.grad(loss_unrolled)(unroll(p0), *data(0))
  for make in (lambda **kw: lars_optax.normalize_per_leaf(**kw),
               lambda **kw: lars_optax.scale_by_lamb_trust_ratio(**kw),
               lambda **kw: lars_optax.scale_by_lars_trust_ratio(trust_coefficient=0.01, **kw)):
    tx = make(stacked=STACK)
    u, _ = tx.update(g, tx.init(p0), p0)
    txu = make()
    uu, _ = txu.update(gu, txu.init(unroll(p0)), unroll(p0))
    assert_close(u, restack(uu))
  ratio = lars_optax.lars_trust_ratio(p0["blocks"]["kernel"], g["blocks"]["kernel"],
                                      trust_coefficient=0.01, layer_axes=1)
  want = [lars_optax.lars_trust_ratio(p0["blocks"]["kernel"][i], g["blocks"]["kernel"][i],
                                      trust_coefficient=0.01) for i in range(L)]
  np.testing.assert_allclose(ratio, want, rtol=1e-6)


def test_layer_axes_reports_what_stacked_selects():
  p0 = stacked_params()
  assert lars_optax.stacked.layer_axes(p0) == {n: 0 for n, _ in lars_optax.named_leaves(p0)}
  assert lars_optax.stacked.layer_axes(p0, STACK) == {
      "blocks/bias": 1, "blocks/kernel": 1, "head/bias": 0, "head/kernel": 0}
  assert lars_optax.stacked.layer_axes(p0, {"blocks/kernel": 2})["blocks/kernel"] == 2


# --------------------------------------------------------------------------
# Bad input: a clear error at construction or init, naming the leaf.
# --------------------------------------------------------------------------


def test_stacked_rule_that_matches_no_leaf_is_an_error():
  p0 = stacked_params()
  with pytest.raises(ValueError, match="stacked: no parameter name matches"):
    lars_optax.lamb(stacked=masks.by_regex("^blokcs/")).init(p0)
  with pytest.raises(ValueError, match="stacked: no parameter is named 'blocks/kernal'"):
    lars_optax.lars(stacked={"blocks/kernal": 1}).init(p0)
  with pytest.raises(ValueError, match="selects no parameter"):
    lars_optax.lans(stacked=masks.by_ndim(0)).init(p0)


def test_stacked_with_k_not_below_the_leaf_ndim_is_an_error():
  p0 = stacked_params()
  with pytest.raises(ValueError, match="'blocks/bias' of shape \\(4, 8\\) cannot have 2 layer"):
    lars_optax.lars(stacked=[(STACK, 2)]).init(p0)


def test_stacked_bad_forms_are_rejected_at_construction():
  with pytest.raises(ValueError, match="stacked: the number of layer axes for 'w' must be >= 1"):
    lars_optax.lamb(stacked={"w": 0})
  with pytest.raises(ValueError, match="stacked: unknown preset"):
    lars_optax.lars(stacked="layers")
  with pytest.raises(TypeError, match="stacked: expected a mask"):
    lars_optax.lans(stacked=3)
  with pytest.raises(TypeError, match="partition_names"):
    lars_optax.stacked.from_metadata("")


def test_per_layer_multiplier_of_the_wrong_length_names_both_lengths():
  p0 = stacked_params()
  tx = lars_optax.lamb(stacked=STACK, lr_mult={"blocks/kernel": np.ones(3)})
  with pytest.raises(ValueError, match=r"lr_mult: .*'blocks/kernel' has 3 per-layer entries, "
                                       r"but the leaf \(shape \(4, 8, 8\)\) has 4 layers"):
    tx.init(p0)
  tx = lars_optax.lars(stacked=STACK, wd=0.1, wd_mult={"head/kernel": np.ones(8)})
  with pytest.raises(ValueError, match=r"wd_mult: .*'head/kernel'.*is not stacked"):
    tx.init(p0)
  with pytest.raises(ValueError, match="lr_mult: the per-layer values for 'b' must be finite"):
    lars_optax.lamb(lr_mult={"b": np.array([1.0, -1.0])})


def test_per_layer_multiplier_on_an_unstacked_leaf_is_a_clear_error():
  p0 = stacked_params()
  with pytest.raises(ValueError, match=r"lr_mult: the value for 'blocks/kernel' has 4 per-layer "
                                       r"entries, but the leaf .* is not stacked"):
    lars_optax.mxnet.adamw(lr_mult={"blocks/kernel": np.ones(L)}).init(p0)


def test_create_takes_stacked_for_the_layer_wise_names_only():
  p0 = stacked_params()
  for name in ("lars", "lamb", "lans"):
    lars_optax.mxnet.create(name, stacked=STACK).init(p0)
  with pytest.raises(ValueError, match="stacked: not an argument of 'adam'"):
    lars_optax.mxnet.create("adam", stacked=STACK)


@pytest.mark.op_by_op
def test_stacked_under_optax_masked_and_partition():
  p0 = stacked_params()
  labels = {"blocks": {"kernel": "lamb", "bias": "adam"}, "head": {"kernel": "lamb",
                                                                   "bias": "adam"}}
  tx = optax.partition({"lamb": lars_optax.lamb(0.05, stacked=STACK), "adam": optax.adam(0.01)},
                       labels)
  params, state = train(tx, p0, loss_stacked, steps=2)
  ratios = lars_optax.trust_ratios(state, params)
  assert set(ratios) == {"blocks/kernel", "head/kernel"}
  assert ratios["blocks/kernel"].shape == (L,)
  vec = lars_optax.trust_ratios(state)
  assert vec.shape == (1 + L + 1 + 1,)  # bias, kernel layers, head bias, head kernel


@pytest.mark.op_by_op
def test_no_change_without_metadata_and_a_warning_where_shapes_show_a_stack():
  """Without metadata the default stacks nothing (the same numbers as stacked=None);
  a tree whose biases share the kernels' leading size looks stacked, and init says so."""
  p0 = stacked_params()
  with pytest.warns(UserWarning, match=r"^stacked: \['blocks/bias', 'blocks/kernel'\] look "
                    r"like a stack of layers"):
    a, _ = train(lars_optax.lamb(0.05), p0, loss_stacked, steps=2)
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    b, _ = train(lars_optax.lamb(0.05, stacked=None), p0, loss_stacked, steps=2)
  chex.assert_trees_all_equal(a, b)


def _ordinary_models():
  """Models with no stack in them, whose shapes must not look stacked."""
  import pathlib
  import sys

  import equinox as eqx
  import flax.linen as nn

  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))
  from resnet50_tree import resnet50_params

  class Conv(eqx.Module):  # Equinox's conv bias is (out, 1, 1)
    conv: eqx.nn.Conv2d
    norm: eqx.nn.LayerNorm
    head: eqx.nn.Linear

    def __init__(self, key):
      k1, k2 = jax.random.split(key)
      self.conv = eqx.nn.Conv2d(3, 8, 3, key=k1)
      self.norm = eqx.nn.LayerNorm((8, 6, 6))
      self.head = eqx.nn.Linear(8, 2, key=k2)

  class Attention(nn.Module):  # per-head query/key/value biases are (heads, head_dim)
    @nn.compact
    def __call__(self, x):
      return nn.LayerNorm()(nn.MultiHeadDotProductAttention(num_heads=4, qkv_features=16)(x))

  return {
      "resnet50": resnet50_params(),
      "equinox_conv": eqx.filter(Conv(jax.random.key(0)), eqx.is_array),
      "linen_attention": Attention().init(jax.random.key(0), jnp.ones((2, 5, 16)))["params"],
  }


@pytest.mark.op_by_op
def test_ordinary_models_do_not_look_stacked():
  """ResNet-50, an Equinox conv net and a linen attention block: no stack warning."""
  for name, params in _ordinary_models().items():
    with warnings.catch_warnings(record=True) as record:
      warnings.simplefilter("always")
      lars_optax.lamb(1e-3).init(params)
    assert not [str(w.message) for w in record if "stacked" in str(w.message)], name


# Run here (8 virtual devices: small leaves' norms over a stack) and in a fresh
# process with one CPU device (one variadic reduction per small leaf).
_SMALL_LEAVES_RUN = r'''
import jax, jax.numpy as jnp, numpy as np, optax, lars_optax

def _params():
  rng = np.random.default_rng(0)
  shapes = {"w": (16, 32), "b": (128,), "scale": (128,), "big": (64, 128)}
  p = {k: jnp.asarray(rng.normal(size=s) * 0.5, jnp.float32) for k, s in shapes.items()}
  p["b"] = jnp.zeros((128,), jnp.float32)  # a zero norm: ratio 1 at the first step
  p["stack"] = {"kernel": jnp.asarray(rng.normal(size=(3, 16, 16)), jnp.float32)}
  return p

# Stacks named by stacked= on this module's tree ("stack/kernel"), which the table's
# configurations do not name.
OPTIMIZERS = {
    "lamb": lambda: lars_optax.lamb(1e-2, wd=0.01, stacked={"stack/kernel": 1}),
    "lamb_by_shape": lambda: lars_optax.lamb(1e-2, wd=0.01, group_by_shape=True),
    "lans": lambda: lars_optax.lans(1e-2, wd=0.01),
    "lars": lambda: lars_optax.lars(0.1, momentum=0.9, wd=1e-4, stacked={"stack/kernel": 1}),
    "tf_lars": lambda: lars_optax.tf_lars(0.1),
}

def step_hlo(tx, params):
  def step(p, s, g):
    u, s = tx.update(g, s, p)
    return optax.apply_updates(p, u), s
  return jax.jit(step).lower(params, tx.init(params), params).compile().as_text()

def run():
  out = {"devices": jax.device_count(), "hlo": step_hlo(OPTIMIZERS["lamb"](), _params())}
  for name, make in OPTIMIZERS.items():
    tx, p = make(), _params()
    s = tx.init(p)

    @jax.jit
    def step(p, s, i):
      g = jax.tree.map(lambda x: jnp.sin(x * (i + 1.0)) + 0.01, p)
      u, s = tx.update(g, s, p)
      return optax.apply_updates(p, u), s

    for i in range(3):
      p, s = step(p, s, i)
    out[name] = {"params": {k: np.asarray(v).tolist() for k, v in
                            lars_optax.named_leaves(p)},
                 "ratios": {k: np.asarray(v).tolist() for k, v in
                            lars_optax.trust_ratios(s, p).items()}}
  return out
'''


@pytest.mark.slow  # (a second process)
@pytest.mark.skipif(jax.default_backend() != "cpu", reason="a path of the CPU backend")
def test_one_cpu_device_sums_small_leaves_in_one_reduction_with_the_same_numbers():
  """On one CPU device, a small leaf's two norms (up to 1,024 elements a layer)
  are one variadic reduction: one kernel where their stack's reduction costs
  three. This suite runs on 8 virtual devices, where they are reduced over the
  stack (the SPMD partitioner would all-gather a variadic reduction's
  operands), so a fresh one-device process runs the same steps: the same
  params and ratios, with fewer kernels."""
  namespace: dict = {}
  exec(_SMALL_LEAVES_RUN, namespace)  # the same code as the child's
  here = namespace["run"]()
  env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_NUM_CPU_DEVICES")}
  env["JAX_PLATFORMS"] = "cpu"
  child = subprocess.run(
      [sys.executable, "-c", _SMALL_LEAVES_RUN + "\nimport json\nprint(json.dumps(run()))"],
      env=env, capture_output=True, text=True, timeout=600, check=True)
  there = json.loads(child.stdout.strip().splitlines()[-1])
  assert here["devices"] > 1 and there["devices"] == 1
  fewer, more = launched_kernels(there["hlo"]), launched_kernels(here["hlo"])
  assert fewer < more, (fewer, more)
  for name in namespace["OPTIMIZERS"]:
    for part in ("params", "ratios"):
      for leaf, value in here[name][part].items():
        np.testing.assert_allclose(there[name][part][leaf], value, rtol=2e-6, atol=1e-7,
                                   err_msg=f"{name} {part} {leaf}")


@pytest.mark.parametrize("make", [lambda: lars_optax.lamb(1e-3, wd=0.01),
                                  lambda: lars_optax.lans(1e-3, wd=0.01),
                                  lambda: lars_optax.tf_lars(0.1)],
                         ids=["lamb", "lans", "tf_lars"])
def test_small_leaves_norms_are_chosen_for_the_platform_the_step_is_lowered_for(make):
  """A small leaf's two norms: a stack for GPUs (and for this 8-device CPU
  process), each on its own for a TPU, where XLA fuses both sums with the
  moments. The choice follows the lowering platform, not this process's
  backend: an ahead-of-time compile for a TPU from a CPU host gets the TPU's."""
  import re

  tx = make()
  params = {"w": jnp.ones((64, 96)), "b": jnp.full((128,), 0.5)}  # 6,144 and 128 elements

  def lowered(platform):
    text = step_lowered_for(tx, params, platform)
    stacks = re.findall(r"tensor<[23]x128xf32>", text)  # the bias's arrays (lans: 3)
    return len(stacks), len(re.findall(r"stablehlo\.reduce\(", text))

  stacked, _ = lowered("cuda")
  assert stacked > 0
  assert lowered("cpu")[0] == (stacked if jax.device_count() > 1 else 0)
  on_tpu, sums = lowered("tpu")
  assert on_tpu == 0 and sums > lowered("cuda")[1]  # the bias's sums, each on its own
