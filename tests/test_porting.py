"""The porting constructors: each peer's rule in its own words.

``tests/test_reference_peers.py`` checks every row of docs/porting.md against
the peer's own numbers; here are the rules' properties, the peers' defaults,
the argument checks and what users pass (numpy, JAX and bfloat16 scalars,
bfloat16 params, optax's mask forms).
"""

from __future__ import annotations

import pathlib

import warnings

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lars_optax
from lars_optax import masks

P = lars_optax.porting


def _run(tx, steps=4, dtype=jnp.float32):
  params = {"w": jnp.array([[1.0, -2.0], [0.5, 3.0]], dtype), "b": jnp.array([0.1, -0.2], dtype)}
  state = tx.init(params)
  step = jax.jit(tx.update)
  for k in range(steps):
    g = {"w": jnp.array([[0.3, -0.1], [0.0, 0.4]], dtype) * (k + 1),
         "b": jnp.array([0.5, -0.5], dtype)}
    updates, state = step(g, state, params)
    params = optax.apply_updates(params, updates)
  return params, state


def _random_run(tx, steps=5):
  key = jax.random.key(0)
  params = {"dense": {"kernel": jax.random.normal(key, (4, 3)), "bias": jnp.full((3,), 0.2)},
            "norm": {"scale": jnp.ones((3,))}}
  state = tx.init(params)
  for i in range(steps):
    g = jax.tree.map(lambda p, i=i: jax.random.normal(jax.random.fold_in(key, i + 1), p.shape),
                     params)
    updates, state = tx.update(g, state, params)
    params = optax.apply_updates(params, updates)
  return params


# --------------------------------------------------------------------------
# timm
# --------------------------------------------------------------------------


@pytest.mark.op_by_op
def test_timm_lars_without_weight_decay_is_plain_sgd_as_in_timm():
  # timm adapts only a group whose weight_decay is not 0 (or with always_adapt).
  sched = optax.linear_schedule(0.01, 0.1, 3)
  ours, _ = _run(P.timm_lars(sched, momentum=0.9))
  ref, _ = _run(optax.sgd(sched, momentum=0.9))
  chex.assert_trees_all_close(ours, ref, rtol=1e-6)
  adapted, _ = _run(P.timm_lars(sched, momentum=0.9, always_adapt=True))
  assert float(jnp.max(jnp.abs(adapted["w"] - ref["w"]))) > 1e-3


@pytest.mark.op_by_op
def test_timm_lars_rate_after_the_buffer_only_matters_when_the_rate_changes():
  kw = {"momentum": 0.9, "weight_decay": 1e-3, "trust_coeff": 0.1}
  mxnet_kw = {"momentum": 0.9, "wd": 1e-3, "eta": 0.1, "skip": None}
  timm, _ = _run(P.timm_lars(0.5, **kw))
  mxnet, _ = _run(lars_optax.lars(0.5, **mxnet_kw))
  chex.assert_trees_all_close(timm, mxnet, rtol=1e-5)
  sched = optax.linear_schedule(0.05, 0.5, 3)
  timm, _ = _run(P.timm_lars(sched, **kw))
  mxnet, _ = _run(lars_optax.lars(sched, **mxnet_kw))
  assert float(jnp.max(jnp.abs(timm["w"] - mxnet["w"]))) > 1e-3


def test_timm_trust_clip_bounds_the_ratio_by_the_rate_and_survives_a_zero_rate():
  sched = optax.linear_schedule(0.0, 0.5, 2)  # 0 at the first step: rho / 0 -> clipped to 1
  tx = P.timm_lars(sched, momentum=0.9, weight_decay=1e-3, trust_coeff=10.0, trust_clip=True)
  params, state = _run(tx, steps=1)
  assert all(float(r) == 1.0 for r in lars_optax.trust_ratios(state, params).values())
  params, state = _run(tx, steps=3)
  chex.assert_tree_all_finite(params)
  assert bool(jnp.all(lars_optax.trust_ratios(state) <= 1.0))


def test_timm_lamb_trust_clip_bounds_every_ratio_by_one():
  params = {"w": jnp.full((2, 2), 10.0), "b": jnp.array([0.1, -0.2])}  # ||w|| = 20 > ||adam||
  grads = jax.tree.map(jnp.ones_like, params)
  for clip, check in ((False, lambda r: r.max() > 1.0), (True, lambda r: r.max() == 1.0)):
    tx = P.timm_lamb(0.1, trust_clip=clip, max_grad_norm=None)
    _, state = tx.update(grads, tx.init(params), params)
    assert check(np.asarray(lars_optax.trust_ratios(state))), clip


@pytest.mark.op_by_op
def test_timm_lambw_with_a_zero_gradient_only_decays():
  """With g = 0 the Adam step is 0, so the whole update is -lr * wd * lr_mult * w."""
  params = {"w": jnp.array([[1.0, -2.0]]), "b": jnp.array([3.0])}
  zeros = jax.tree.map(jnp.zeros_like, params)
  tx = P.timm_optimizer("lambw", lr=0.1, weight_decay=0.5, lr_mult={"w": 2.0})
  updates, _ = tx.update(zeros, tx.init(params), params)
  # "b" is 1-d: timm's no-decay group.
  chex.assert_trees_all_close(updates, {"w": -0.1 * 0.5 * 2.0 * params["w"], "b": jnp.zeros(1)})


def test_timm_optimizer_no_decay_group_takes_the_models_no_weight_decay_names():
  params = {"pos_embed": jnp.ones((3, 4)), "head": {"kernel": jnp.ones((4, 2))}}
  zeros = jax.tree.map(jnp.zeros_like, params)
  tx = P.timm_optimizer("lambw", lr=0.1, weight_decay=0.5, no_weight_decay=["pos_embed"])
  updates, _ = tx.update(zeros, tx.init(params), params)
  chex.assert_trees_all_close(updates["pos_embed"], jnp.zeros((3, 4)))
  chex.assert_trees_all_close(updates["head"]["kernel"], -0.05 * params["head"]["kernel"])
  tx = P.timm_optimizer("lambw", lr=0.1, weight_decay=0.5, filter_bias_and_bn=False)
  updates, _ = tx.update(zeros, tx.init(params), params)
  chex.assert_trees_all_close(updates["pos_embed"], -0.05 * params["pos_embed"])


@pytest.mark.op_by_op
def test_timm_optimizer_passes_the_class_arguments_and_its_defaults():
  a, _ = _run(P.timm_optimizer("lars", lr=0.5, weight_decay=1e-3, trust_coeff=0.1,
                               eps=1e-6, filter_bias_and_bn=False))
  b, _ = _run(P.timm_lars(0.5, momentum=0.9, weight_decay=1e-3, trust_coeff=0.1, eps=1e-6))
  chex.assert_trees_all_close(a, b, rtol=1e-6)
  a, _ = _run(P.timm_optimizer("lamb", weight_decay=0.01, filter_bias_and_bn=False))
  b, _ = _run(P.timm_lamb())  # lr=None: the class's 1e-3
  chex.assert_trees_all_close(a, b, rtol=1e-6)


@pytest.mark.op_by_op
@pytest.mark.parametrize("opt, kwargs, same", [
    ("larc", {"trust_clip": False}, ("lars", {})),
    ("nlars", {"nesterov": False}, ("lars", {})),
    ("nlarc", {"nesterov": False}, ("larc", {})),
    ("lambc", {"trust_clip": False}, ("lamb", {})),
    ("lambw", {"decoupled_decay": False}, ("lamb", {})),
])
def test_timm_optimizer_user_keywords_win_over_the_names_flags(opt, kwargs, same):
  """timm applies a name's flags as defaults (setdefault): the user's keyword wins."""
  common = {"lr": 0.5, "weight_decay": 1e-3, "filter_bias_and_bn": False}
  a, _ = _run(P.timm_optimizer(opt, **common, **kwargs))
  b, _ = _run(P.timm_optimizer(same[0], **common, **same[1]))
  chex.assert_trees_all_close(a, b, rtol=1e-6)


@pytest.mark.parametrize("call, error, match", [
    (lambda: P.timm_optimizer("adamw"), ValueError, "^opt: expected one of lars, larc"),
    (lambda: P.timm_optimizer("lars", trust_coef=0.1), TypeError,
     "^trust_coef: timm's 'lars' optimizer takes no such argument; it takes"),
    (lambda: P.timm_optimizer("cadamw", momentum_dtype=1), TypeError, "^momentum_dtype"),
    (lambda: P.timm_optimizer("lamb", weight_decay=0.1, no_weight_decay="pos_embed"),
     TypeError, "^no_weight_decay: expected a list"),
    (lambda: P.timm_lars(0.1, nesterov=True), ValueError, "^nesterov: Nesterov momentum needs"),
    (lambda: P.timm_lars(0.1, momentum=0.9, dampening=1.5), ValueError, "^dampening"),
    (lambda: P.timm_lars(-0.1), ValueError, "^lr"),
    (lambda: P.torch_sparse_adam(lr=-1), ValueError, "^lr: must be >= 0"),
    (lambda: P.torch_sparse_adam(eps=-1.0), ValueError, "^eps: must be >= 0"),
    (lambda: P.timm_lars(0.1, trust_coeff=-1.0), ValueError, "^trust_coeff"),
    (lambda: P.timm_lars(0.1, trust_clip=1), TypeError, "^trust_clip: expected a bool"),
    (lambda: P.timm_lamb(betas=(0.9,)), TypeError, "^betas: expected a pair"),
    (lambda: P.timm_lamb(betas=(0.9, 1.5)), ValueError, r"^betas\[1\]"),
    (lambda: P.timm_lamb(max_grad_norm=0.0), ValueError, "^max_grad_norm"),
    (lambda: P.timm_lamb(caution="yes"), TypeError, "^caution: expected a bool"),
    (lambda: P.keras_lamb(beta_1=1.0), ValueError, "^beta_1"),
    (lambda: P.keras_lamb(exclude_from_weight_decay="bias"), TypeError,
     "^exclude_from_weight_decay"),
    (lambda: P.optax_lars(0.1, trust_coefficient=-1.0), ValueError, "^trust_coefficient"),
    (lambda: P.optax_lamb(0.1, eps_root=-1.0), ValueError, "^eps_root"),
    (lambda: P.byol_lars(0.1, weight_decay_filter=3), TypeError, "^weight_decay_filter"),
    (lambda: P.simclr_lars(0.1, exclude_from_weight_decay="bias"), TypeError,
     "^exclude_from_weight_decay: expected a list"),
    (lambda: P.simclr_lars(0.1, exclude_from_weight_decay=["(bias"]), ValueError,
     "^exclude_from_weight_decay: not a valid regular expression"),
    (lambda: P.albert_lamb(0.1, weight_decay_rate=-1.0), ValueError, "^weight_decay_rate"),
    (lambda: P.torch_sparse_adam(betas=(1.0, 0.9)), ValueError, r"^betas\[0\]"),
])
def test_bad_arguments_are_named_at_construction(call, error, match):
  with pytest.raises(error, match=match):
    call()


@pytest.mark.op_by_op
@pytest.mark.parametrize("scalar", [float, np.float32, jnp.float32, jnp.bfloat16],
                         ids=["python", "numpy", "jax", "bfloat16"])
@pytest.mark.parametrize("make", [
    lambda s: P.timm_lars(s(0.25), momentum=s(0.75), dampening=s(0.5), trust_coeff=s(0.125),
                          weight_decay=s(0.0625), trust_clip=True),
    lambda s: P.timm_lamb(s(0.125), weight_decay=s(0.0625), betas=(s(0.75), s(0.875)),
                          decoupled_decay=True, caution=True, trust_clip=True,
                          grad_averaging=False),
    lambda s: P.optax_lamb(s(0.125), weight_decay=s(0.0625), eps_root=s(2.0**-20)),
    lambda s: P.optax_lars(s(0.25), weight_decay=s(0.0625), momentum=s(0.75), nesterov=True),
], ids=["timm_lars", "timm_lamb", "optax_lamb", "optax_lars"])
def test_scalars_of_any_kind_give_the_same_step(make, scalar):
  ours, _ = _run(make(scalar))
  ref, _ = _run(make(float))
  chex.assert_trees_all_close(ours, ref, rtol=1e-6)


@pytest.mark.op_by_op
@pytest.mark.parametrize("tx", [
    P.timm_lars(np.float32(0.1), momentum=np.float32(0.9), dampening=0.1, weight_decay=1e-3),
    P.timm_optimizer("nlarc", lr=0.1, weight_decay=1e-3),
    P.timm_lamb(np.float32(0.01), decoupled_decay=True, caution=True),
    P.keras_lamb(0.01, weight_decay=0.01),
    P.optax_lars(0.1, weight_decay=1e-3),
], ids=["timm_lars_dampened", "timm_nlarc", "timm_lamb_decoupled_cautious", "keras_lamb",
        "optax_lars"])
def test_bfloat16_params_keep_their_dtype_and_state(tx):
  params = {"w": jnp.ones((2, 3), jnp.bfloat16)}
  state = tx.init(params)
  updates, new_state = jax.jit(tx.update)(params, state, params)
  assert updates["w"].dtype == jnp.bfloat16
  chex.assert_trees_all_equal_dtypes(new_state, state)


# --------------------------------------------------------------------------
# optax: the same numbers as optax's own chains, optax's mask forms
# --------------------------------------------------------------------------


def _keep(params):
  return jax.tree.map(lambda x: x.ndim > 1, params)


@pytest.mark.parametrize("mask", ["callable", "pytree", "true"])
@pytest.mark.parametrize("nesterov", [False, True])
def test_optax_lars_equals_optax_lars_with_each_mask_form(mask, nesterov):
  sched = optax.warmup_cosine_decay_schedule(0.01, 0.5, 2, 5, 0.05)
  params = _random_run(optax.identity(), steps=0)
  form = {"callable": _keep, "pytree": _keep(params), "true": True}[mask]
  kw = {"weight_decay": 1e-3, "weight_decay_mask": form, "trust_coefficient": 0.01,
        "trust_ratio_mask": form, "momentum": 0.9, "nesterov": nesterov}
  chex.assert_trees_all_close(_random_run(P.optax_lars(sched, **kw)),
                              _random_run(optax.lars(sched, **kw)), rtol=2e-6, atol=1e-7)


def test_optax_lamb_equals_optax_lamb():
  sched = optax.linear_schedule(0.01, 0.1, 3)
  kw = {"weight_decay": 0.01, "mask": _keep, "eps_root": 1e-3, "b1": 0.8}
  chex.assert_trees_all_close(_random_run(P.optax_lamb(sched, **kw)),
                              _random_run(optax.lamb(sched, **kw)), rtol=2e-6, atol=1e-7)


def _stacked_run(tx, params, steps=4):
  """``steps`` updates of a stacked tree (boxes and Variables kept) with random gradients."""
  key = jax.random.key(3)
  state = tx.init(params)
  for i in range(steps):
    g = jax.tree.map(lambda p, i=i: jax.random.normal(jax.random.fold_in(key, i), p.shape),
                     params)
    updates, state = tx.update(g, state, params)
    params = optax.apply_updates(params, updates)
  return jax.tree.leaves(params)


def _linen_layers_stack():
  """Params as linen's nn.scan with metadata_params={nn.PARTITION_NAME: "layers"} boxes
  them: a stack of 4 layers, and a head."""
  nn = pytest.importorskip("flax.linen")
  key = jax.random.key(1)
  box = lambda shape, names, k: nn.Partitioned(
      jax.random.normal(jax.random.fold_in(key, k), shape), names=names)
  return {"blocks": {"Dense_0": {"kernel": box((4, 8, 8), ("layers", None, "mlp"), 0),
                                 "bias": box((4, 8), ("layers", "mlp"), 1)}},
          "head": {"kernel": jax.random.normal(key, (8, 3)), "bias": jnp.zeros(3)}}


def _nnx_layers_stack():
  """nnx.state of an nnx.vmap stack of 4 layers whose Variables carry 'layers'."""
  nnx = pytest.importorskip("flax.nnx")

  class Model(nnx.Module):
    def __init__(self, rngs):
      @nnx.split_rngs(splits=4)
      @nnx.vmap(in_axes=(0,), out_axes=0, transform_metadata={nnx.PARTITION_NAME: "layers"})
      def make(rngs):
        return nnx.Linear(8, 8, rngs=rngs, kernel_init=nnx.with_partitioning(
            nnx.initializers.lecun_normal(), (None, "mlp")), bias_init=nnx.with_partitioning(
                nnx.initializers.normal(0.1), ("mlp",)))

      self.blocks = make(rngs)
      self.head = nnx.Linear(8, 3, rngs=rngs)

  from jax.sharding import Mesh  # partition names need a mesh that knows them
  with jax.set_mesh(Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("layers", "mlp"))):
    return nnx.state(Model(nnx.Rngs(0)), nnx.Param)


@pytest.mark.parametrize("stack", ["linen_boxes", "nnx_variables"])
@pytest.mark.parametrize("name", ["optax_lars", "optax_lamb"])
def test_optax_drop_ins_equal_optax_on_a_scanned_stack_and_warn_at_init(name, stack):
  """#52 item 1: on a stack with 'layers' metadata the drop-ins take optax's one ratio
  per stack by default (they ended 0.31 and 0.25 of the move away from optax with the
  per-layer default), and init says so; stacked=FROM_METADATA gives one per layer."""
  params = (_linen_layers_stack if stack == "linen_boxes" else _nnx_layers_stack)()
  ours, peer = {"optax_lars": (P.optax_lars, optax.lars),
                "optax_lamb": (P.optax_lamb, optax.lamb)}[name]
  kw = {"weight_decay": 1e-3}
  with pytest.warns(UserWarning, match=rf"^stacked: \['blocks/.*carry Flax 'layers' "
                                       rf"partition metadata.*{name} takes one trust ratio "
                                       r"per stack, as optax\.la[mr][bs] does"):
    got = _stacked_run(ours(0.1, **kw), params)
  want = _stacked_run(peer(0.1, **kw), params)
  chex.assert_trees_all_close(got, want, rtol=2e-6, atol=1e-6)
  per_layer = _stacked_run(ours(0.1, stacked=lars_optax.stacked.FROM_METADATA, **kw), params)
  # One ratio per layer: the stacked kernel takes other steps (by 5% of its move at least).
  (k,) = [i for i, a in enumerate(want) if a.ndim == 3]
  start = jax.tree.leaves(params)[k]
  gap, move = jnp.max(jnp.abs(per_layer[k] - want[k])), jnp.max(jnp.abs(want[k] - start))
  assert gap > 0.05 * move, (gap, move)


def test_optax_lars_logs_ratios_and_takes_stacked_and_lr_mult():
  tx = P.optax_lars(0.1, weight_decay=1e-3, lr_mult={"w": 0.5}, stacked=None)
  params, state = _run(tx, steps=2)
  ratios = lars_optax.trust_ratios(state, params)
  assert set(ratios) == {"w", "b"} and all(float(r) > 0 for r in ratios.values())


# --------------------------------------------------------------------------
# Keras, BYOL, SimCLR, ALBERT
# --------------------------------------------------------------------------


def test_timm_layer_decay_numbers_the_layers_as_timm_and_checks_its_arguments():
  """#52 item 3: timm's layer ids from a ViT-style group_matcher (numbers captured by a
  regex order a group; a (99999,) suffix joins the previous layer; unmatched is the head),
  and its arguments checked when built (the fixtures check the numbers)."""
  params = {"patch_embed": {"kernel": jnp.ones((4, 2))},
            "blocks": {str(i): {"kernel": jnp.ones((2, 2))} for i in (0, 1, 10)},
            "norm": {"scale": jnp.ones(2)}, "head": {"kernel": jnp.ones((2, 2))}}
  matcher = {"stem": r"^patch_embed", "blocks": [(r"^blocks\.(\d+)", None),
                                                 (r"^norm", (99999,))]}
  tx = P.timm_optimizer("lamb", lr=0.1, weight_decay=0.05, layer_decay=0.5,
                        group_matcher=matcher)
  state = tx.init(params)
  g = jax.tree.map(jnp.ones_like, params)
  u, _ = tx.update(g, state, params)
  # Layers: stem 0, blocks 0/1/10 -> 1/2/3 (10 after 1, numerically), norm with block 10,
  # head 4: scales 0.5**4 .. 1. Every leaf here takes the same step but for its scale.
  got = {n: float(jnp.abs(x).max()) for n, x in masks.named_leaves(u)}
  head = got["head/kernel"]
  for name, layer in [("patch_embed/kernel", 0), ("blocks/0/kernel", 1), ("blocks/1/kernel", 2),
                      ("blocks/10/kernel", 3)]:
    np.testing.assert_allclose(got[name] / head, 0.5 ** (4 - layer), rtol=1e-5)
  with pytest.raises(TypeError, match=r"^group_matcher: expected the model's group_matcher"):
    P.timm_optimizer("lamb", layer_decay=0.75)
  with pytest.raises(ValueError, match=r"^group_matcher: group 'blocks' has the entry"):
    P.timm_optimizer("lamb", layer_decay=0.75, group_matcher={"blocks": [("^b",)]})
  with pytest.raises(ValueError, match=r"^layer_decay: must be > 0"):
    P.timm_optimizer("lamb", layer_decay=-1.0, group_matcher=matcher)
  with pytest.raises(ValueError, match=r"^layer_decay: takes a LARS or LAMB opt"):
    P.timm_optimizer("cadamw", layer_decay=0.75, group_matcher=matcher)
  with pytest.raises(TypeError, match=r"^betaz: timm's 'lamb' optimizer takes no such"):
    P.timm_optimizer("lamb", layer_decay=0.75, group_matcher=matcher, betaz=1)
  with pytest.raises(ValueError, match=r"^layer_decay: update needs params"):
    tx.update(g, state)
  with pytest.raises(TypeError, match=r"^fallback_list: expected a list"):
    P.timm_optimizer("lamb", fallback_list="x")


def test_keras_lamb_takes_the_base_optimizers_arguments_and_refuses_what_has_no_port():
  """#52 item 3: Keras's clips are ported (the fixtures check their numbers), ``name``
  and the EMA settings without ``use_ema`` change nothing, and what cannot be ported is
  refused with the optax way to do it."""
  params = {"dense": {"kernel": jnp.ones((2, 2)), "bias": jnp.ones(2)}}
  grads = jax.tree.map(lambda p: 3.0 * p, params)
  plain = P.keras_lamb(0.01).update(grads, P.keras_lamb(0.01).init(params), params)[0]
  named = P.keras_lamb(0.01, name="lamb", ema_momentum=0.9, ema_overwrite_frequency=3)
  chex.assert_trees_all_close(named.update(grads, named.init(params), params)[0], plain)
  with pytest.raises(ValueError, match=r"^clipnorm, global_clipnorm: Keras takes only one"):
    P.keras_lamb(clipnorm=1.0, global_clipnorm=1.0)
  with pytest.raises(ValueError, match=r"^clipvalue: must be > 0"):
    P.keras_lamb(clipvalue=0.0)
  with pytest.raises(ValueError, match=r"^use_ema: .*optax\.incremental_update"):
    P.keras_lamb(use_ema=True)
  with pytest.raises(ValueError, match=r"^loss_scale_factor: scale the loss"):
    P.keras_lamb(loss_scale_factor=128.0)
  with pytest.raises(ValueError, match=r"^gradient_accumulation_steps: must be an int >= 2"):
    P.keras_lamb(gradient_accumulation_steps=1)
  with pytest.raises(TypeError, match=r"^gradient_accumulation_steps: expected an int"):
    P.keras_lamb(gradient_accumulation_steps=True)
  with pytest.raises(TypeError, match=r"^name: expected a string"):
    P.keras_lamb(name=3)


def test_timm_classes_take_foreach_and_corrected_weight_decay_checks_its_peak_rate():
  """``foreach`` changes no number; ``corrected_weight_decay`` needs the peak rate under a
  schedule (the fixtures check its numbers), and ``max_lr`` means nothing without it."""
  for make in (P.timm_lars, P.timm_lamb):
    plain = _random_run(make(0.1, weight_decay=0.01), steps=2)
    chex.assert_trees_all_equal(_random_run(make(0.1, weight_decay=0.01, foreach=False),
                                            steps=2), plain)
    with pytest.raises(TypeError, match=r"^foreach"):
      make(0.1, foreach="yes")
  sched = optax.linear_schedule(0.1, 0.01, 10)
  with pytest.raises(ValueError, match=r"^max_lr: corrected_weight_decay=True with lr a "
                     r"schedule needs the peak rate"):
    P.timm_lamb(sched, decoupled_decay=True, corrected_weight_decay=True)
  with pytest.raises(ValueError, match=r"^max_lr: must be > 0"):
    P.timm_optimizer("lambw", lr=sched, corrected_weight_decay=True, max_lr=0.0)
  with pytest.raises(ValueError, match=r"^max_lr: it is the peak rate"):
    P.timm_lamb(0.1, max_lr=0.1)
  # A constant rate is its own peak: corrected decay is timm's plain decay then.
  chex.assert_trees_all_close(
      _random_run(P.timm_lamb(0.1, decoupled_decay=True, corrected_weight_decay=True), steps=2),
      _random_run(P.timm_lamb(0.1, decoupled_decay=True), steps=2), rtol=1e-6)


def test_optax_drop_ins_take_a_weight_decay_schedule_and_check_it():
  """optax's lars and lamb take ``weight_decay`` as a schedule (the fixtures check the
  numbers); a negative constant is still an error naming it."""
  sched = optax.linear_schedule(1e-3, 1e-4, 10)
  for make in (P.optax_lars, P.optax_lamb):
    params = _random_run(make(0.1, weight_decay=sched), steps=2)
    assert all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves(params))
    with pytest.raises(ValueError, match=r"^weight_decay"):
      make(0.1, weight_decay=-1.0)


def test_a_weight_decay_schedule_judges_a_stacked_leaf_as_one_layer():
  """A constant schedule decays the leaves the constant decays: on a stack of layers, the
  optax mask sees one layer (a stacked bias has one axis there, and is not decayed)."""
  key = jax.random.key(0)
  params = {"blocks": {"kernel": jax.random.normal(key, (4, 3, 3)),
                       "bias": jax.random.normal(jax.random.fold_in(key, 1), (4, 3))},
            "head": jax.random.normal(jax.random.fold_in(key, 2), (3, 2))}
  grads = jax.tree.map(lambda p: jnp.sin(3.0 * p), params)  # (not along the weights)
  kw = {"mask": _keep, "stacked": lars_optax.by_regex("^blocks/")}

  def run(tx):
    return tx.update(grads, tx.init(params), params)[0]

  chex.assert_trees_all_close(run(P.optax_lamb(0.1, weight_decay=lambda c: 0.5, **kw)),
                              run(P.optax_lamb(0.1, weight_decay=0.5, **kw)), rtol=1e-6)


def test_torch_sparse_adam_maximize_is_checked():
  with pytest.raises(TypeError, match=r"^maximize"):
    P.torch_sparse_adam(maximize="yes")


def test_keras_exclude_from_weight_decay_takes_name_parts():
  params = {"dense": {"kernel": jnp.ones((2, 2)), "bias": jnp.ones(2)}}
  zeros = jax.tree.map(jnp.zeros_like, params)
  tx = P.keras_lamb(0.1, weight_decay=0.5, exclude_from_weight_decay=["bias"])
  updates, _ = tx.update(zeros, tx.init(params), params)
  chex.assert_trees_all_close(updates, {"dense": {"kernel": -0.05 * jnp.ones((2, 2)),
                                                  "bias": jnp.zeros(2)}})


def test_keras_exclude_names_that_match_no_leaf_are_named_at_init():
  """#58 item 12: a Keras script's gamma and beta are not a Flax model's names; Keras
  skips such a name silently (its numbers are kept: the leaf decays), but init says
  which names matched nothing."""
  params = {"dense": {"kernel": jnp.ones((2, 2)), "bias": jnp.ones(2)},
            "layer_norm": {"scale": jnp.ones(2)}}
  zeros = jax.tree.map(jnp.zeros_like, params)
  tx = P.keras_lamb(0.1, weight_decay=0.5, exclude_from_weight_decay=["gamma", "beta", "bias"])
  with pytest.warns(UserWarning, match=r"^exclude_from_weight_decay: no parameter name "
                                       r"contains 'gamma', and none contains 'beta' "):
    state = tx.init(params)
  updates, _ = tx.update(zeros, state, params)
  chex.assert_trees_all_close(updates["layer_norm"]["scale"], -0.05 * jnp.ones(2))  # decayed
  chex.assert_trees_all_close(updates["dense"]["bias"], jnp.zeros(2))
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    P.keras_lamb(0.1, weight_decay=0.5, exclude_from_weight_decay=["bias"]).init(params)
    P.keras_lamb(0.1, weight_decay=0.5, exclude_from_weight_decay=["bias"],
                 gradient_accumulation_steps=2).init(params)


def test_byol_filter_gets_byols_path_tuple():
  seen = []

  def keep_kernels(path, value):
    seen.append(path)
    return path[-1] != "bias"

  tx = P.byol_lars(0.1, weight_decay=0.5, weight_decay_filter=keep_kernels)
  params = {"mlp/~/linear_0": {"kernel": jnp.ones((2, 2)), "bias": jnp.ones(2)}}
  tx.init(params)
  zeros = jax.tree.map(jnp.zeros_like, params)
  updates, _ = tx.update(zeros, tx.init(params), params)
  assert ("mlp/~/linear_0", "kernel") in seen
  assert float(jnp.abs(updates["mlp/~/linear_0"]["bias"]).max()) == 0.0
  assert float(jnp.abs(updates["mlp/~/linear_0"]["kernel"]).max()) > 0.0


def test_simclr_layer_adaptation_defaults_to_the_weight_decay_exclusions():
  params = {"dense": {"kernel": jnp.ones((2, 2))}, "batch_norm": {"scale": jnp.ones(2)}}
  grads = jax.tree.map(lambda p: 0.1 * jnp.ones_like(p), params)
  tx = P.simclr_lars(0.1, weight_decay=1e-3, exclude_from_weight_decay=["batch_norm"])
  _, state = tx.update(grads, tx.init(params), params)
  ratios = lars_optax.trust_ratios(state, params)
  assert float(ratios["batch_norm/scale"]) == 1.0
  assert float(ratios["dense/kernel"]) != 1.0


def test_simclr_popular_momentum_takes_the_ratio_of_the_buffer():
  # Without weight decay and with one step, the buffer is the gradient: the same ratio.
  classic = P.simclr_lars(0.1, classic_momentum=True)
  popular = P.simclr_lars(0.1, classic_momentum=False)
  a, _ = _run(classic, steps=1)
  b, _ = _run(popular, steps=1)
  chex.assert_trees_all_close(a, b, rtol=1e-6)
  a, _ = _run(classic, steps=3)
  b, _ = _run(popular, steps=3)
  assert float(jnp.max(jnp.abs(a["w"] - b["w"]))) > 1e-4


def test_albert_lamb_has_no_bias_correction():
  ours, _ = _run(P.albert_lamb(0.01))
  mxnet, _ = _run(lars_optax.lamb(0.01, bias_correction=False))
  chex.assert_trees_all_close(ours, mxnet, rtol=1e-6)


# --------------------------------------------------------------------------
# The BYOL / SimCLR / optax LARS recipe of docs/optimizers.md
# --------------------------------------------------------------------------


def _ndim_filter(path, value):
  """A BYOL-style filter: True (apply) for the leaves of more than one dimension."""
  return np.ndim(value) > 1


def _byol_lars(learning_rate, weight_decay=1e-2, eta=0.01, momentum=0.9):
  return P.byol_lars(learning_rate, weight_decay=weight_decay, momentum=momentum, eta=eta,
                     weight_decay_filter=_ndim_filter, lars_adaptation_filter=_ndim_filter)


def _byol_problem():
  rng = np.random.default_rng(7)
  params = {"conv": {"kernel": rng.normal(size=(3, 4)), "bias": rng.normal(size=4)},
            "BatchNorm_0": {"scale": 1.0 + 0.1 * rng.normal(size=4)},
            "head": rng.normal(size=(4, 2))}
  grads = [jax.tree.map(lambda x: rng.normal(size=np.shape(x)), params) for _ in range(5)]
  return params, grads


def _byol_numpy(params, grads, lr, weight_decay=1e-2, eta=0.01, momentum=0.9):
  """BYOL's LARS in float64 NumPy: u = g + wd*w, rho = eta*|w|/|u|, m = mu*m + rho*u, w -= lr*m."""
  w = {k: np.asarray(v, np.float64) for k, v in masks.named_leaves(params)}
  m = {k: np.zeros_like(v) for k, v in w.items()}
  for t, g_tree in enumerate(grads):
    g = dict(masks.named_leaves(g_tree))
    for k in w:
      adapted = w[k].ndim > 1
      u = g[k] + (weight_decay * w[k] if adapted else 0.0)
      wn, un = np.linalg.norm(w[k]), np.linalg.norm(u)
      rho = eta * wn / un if (adapted and wn > 0 and un > 0) else 1.0
      m[k] = momentum * m[k] + rho * u
      w[k] = w[k] - lr(t) * m[k]
  return w


def test_byol_lars_recipe_equals_a_float64_numpy_rule():
  params64, grads64 = _byol_problem()
  schedule = optax.exponential_decay(0.5, transition_steps=1, decay_rate=0.8)
  tx = _byol_lars(schedule)
  params = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), params64)
  state = tx.init(params)
  step = jax.jit(tx.update)
  for g in grads64:
    updates, state = step(jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), g), state,
                          params)
    params = optax.apply_updates(params, updates)
  expected = _byol_numpy(params64, grads64, lambda t: float(schedule(t)))
  for name, value in masks.named_leaves(params):
    np.testing.assert_allclose(value, expected[name], rtol=2e-5, atol=1e-6, err_msg=name)


def test_byol_lars_recipe_equals_optax_lars_with_a_constant_learning_rate():
  """optax.lars puts the learning rate before the momentum: equal for a constant rate."""
  params64, grads64 = _byol_problem()
  params = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), params64)
  keep = jax.tree.map(lambda x: np.ndim(x) > 1, params)
  ours = _byol_lars(0.3)
  ref = optax.lars(0.3, weight_decay=1e-2, weight_decay_mask=keep, trust_coefficient=0.01,
                   trust_ratio_mask=keep, momentum=0.9)
  p_ours, p_ref = params, params
  s_ours, s_ref = ours.init(params), ref.init(params)
  for g64 in grads64:
    g = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), g64)
    u, s_ours = ours.update(g, s_ours, p_ours)
    p_ours = optax.apply_updates(p_ours, u)
    u, s_ref = ref.update(g, s_ref, p_ref)
    p_ref = optax.apply_updates(p_ref, u)
  chex.assert_trees_all_close(p_ours, p_ref, rtol=1e-5, atol=1e-6)


def _docs_recipe():
  """The BYOL/SimCLR recipe block of docs/optimizers.md, run: its namespace."""
  page = (pathlib.Path(__file__).parent.parent / "docs" / "optimizers.md").read_text()
  section = page.split("### Recipe: BYOL-, SimCLR- and optax-style LARS")[1]
  code = section.split("```python\n")[1].split("```")[0]
  namespace: dict = {}
  exec(code, namespace)
  return namespace


def _run32(tx, params64, grads64, steps):
  params = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), params64)
  state = tx.init(params)
  update = jax.jit(tx.update)
  for t in range(steps):
    g = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), grads64[t % len(grads64)])
    updates, state = update(g, state, params)
    params = optax.apply_updates(params, updates)
  return params


def test_docs_byol_recipe_is_byols_rule_with_its_warmup_schedule():
  ns = _docs_recipe()
  params64, grads64 = _byol_problem()
  grads64 = grads64 * 3  # 15 steps: through the warm-up and into the decay
  ours = _run32(ns["byol_lars"], params64, grads64, len(grads64))
  expected = _byol_numpy(params64, grads64, lambda t: float(ns["schedule"](t)),
                         weight_decay=1.5e-6, eta=0.001)
  for name, value in masks.named_leaves(ours):
    np.testing.assert_allclose(value, expected[name], rtol=2e-6, atol=1e-7, err_msg=name)


@pytest.mark.parametrize("name", ["simclr_lars", "optax_lars"])
def test_docs_simclr_and_optax_recipes_are_optax_lars_with_its_warmup_schedule(name):
  ns = _docs_recipe()
  params64, grads64 = _byol_problem()
  grads64 = grads64 * 3
  keep = jax.tree.map(lambda x: np.ndim(x) > 1, params64)
  ref = optax.lars(ns["schedule"], weight_decay=1e-6, weight_decay_mask=keep,
                   trust_coefficient=0.001, trust_ratio_mask=keep, momentum=0.9)
  chex.assert_trees_all_close(_run32(ns[name], params64, grads64, len(grads64)),
                              _run32(ref, params64, grads64, len(grads64)), rtol=1e-6, atol=1e-7)


def test_byols_rate_after_the_buffer_is_far_from_optax_lars_with_a_schedule():
  """Where the rate meets the buffer shows once it changes: BYOL's against optax's."""
  ns = _docs_recipe()
  params64, grads64 = _byol_problem()
  keep = jax.tree.map(lambda x: np.ndim(x) > 1, params64)
  ref = optax.lars(ns["schedule"], weight_decay=1e-6, weight_decay_mask=keep,
                   trust_coefficient=0.001, trust_ratio_mask=keep, momentum=0.9)
  a = _run32(ns["byol_lars"], params64, grads64 * 3, 15)
  b = _run32(ref, params64, grads64 * 3, 15)
  p0 = jax.tree.map(np.asarray, params64)
  moved = max(float(np.max(np.abs(np.asarray(x) - y))) for x, y in
              zip(jax.tree.leaves(b), jax.tree.leaves(p0)))
  gap = max(float(np.max(np.abs(np.asarray(x) - np.asarray(y)))) for x, y in
            zip(jax.tree.leaves(a), jax.tree.leaves(b)))
  assert gap > 0.1 * moved


@pytest.mark.op_by_op
@pytest.mark.parametrize("make, kwargs", [
    (P.optax_lars, {"learning_rate": 0.1, "weight_decay": 1e-3, "nesterov": True}),
    (P.timm_lars, {"lr": 0.1, "momentum": 0.9, "dampening": 0.1, "weight_decay": 1e-3,
                   "trust_clip": True}),
    (P.timm_lamb, {"lr": 0.01, "caution": True, "decoupled_decay": True}),
    (P.keras_lamb, {"learning_rate": 0.01, "weight_decay": 0.01}),
], ids=["optax_lars", "timm_lars", "timm_lamb", "keras_lamb"])
def test_inject_hyperparams_gives_the_same_steps(make, kwargs):
  injected, _ = _run(optax.inject_hyperparams(make)(**kwargs))
  plain, _ = _run(make(**kwargs))
  chex.assert_trees_all_close(injected, plain, rtol=1e-6)


@pytest.mark.op_by_op
@pytest.mark.parametrize("make", [
    lambda **kw: P.timm_optimizer("nlarc", lr=0.1, weight_decay=1e-3, **kw),
    lambda **kw: P.timm_lamb(0.01, decoupled_decay=True, **kw),
    lambda **kw: P.optax_lamb(0.01, weight_decay=1e-3, **kw),
    lambda **kw: P.simclr_lars(0.1, weight_decay=1e-3, classic_momentum=False, **kw),
], ids=["timm_nlarc", "timm_lambw", "optax_lamb", "simclr_popular"])
def test_float16_params_with_float32_masters_follow_the_float32_run(make):
  masters, _ = _run(make(multi_precision=True), dtype=jnp.float16)
  assert masters["w"].dtype == jnp.float16
  ref, _ = _run(make(), dtype=jnp.float32)
  chex.assert_trees_all_close(jax.tree.map(lambda x: x.astype(jnp.float32), masters), ref,
                              rtol=2e-3, atol=2e-3)


def test_larc_clip_with_a_zero_coefficient_and_a_rate_of_zero_stays_finite():
  """A ratio of 0 and a rate of 0 (a warm-up from 0) would be 0/0 in the clip: it is 1, and the
  step is 0 either way."""
  sched = optax.linear_schedule(0.0, 0.5, 3)
  tx = P.timm_lars(sched, momentum=0.9, weight_decay=1e-3, trust_coeff=0.0, trust_clip=True)
  params, state = _run(tx, steps=4)
  chex.assert_tree_all_finite(params)
  chex.assert_tree_all_finite(lars_optax.trust_ratios(state))
  tx = lars_optax.scale_by_lars_trust_ratio(trust_coefficient=0.0, larc_learning_rate=0.0)
  p = {"w": jnp.ones(3)}
  _, state = tx.update(p, tx.init(p), p)
  assert float(lars_optax.trust_ratios(state)[0]) == 1.0


# (constructor, its other arguments, the argument set to 1e39)
BEYOND_FLOAT32 = [
    (P.timm_lars, {"lr": 0.1, "weight_decay": 1e-4}, "trust_coeff"),
    (P.timm_lars, {"weight_decay": 1e-4}, "eps"),
    (P.timm_lamb, {}, "eps"),
    (P.optax_lars, {"learning_rate": 0.1}, "trust_coefficient"),
    (P.optax_lamb, {"learning_rate": 0.1}, "eps_root"),
    (P.keras_lamb, {}, "epsilon"),
    (P.albert_lamb, {"learning_rate": 0.1}, "weight_decay_rate"),
    (P.simclr_lars, {"learning_rate": 0.1}, "eeta"),
    (P.byol_lars, {"learning_rate": 0.1}, "eta"),
]


@pytest.mark.parametrize("make, kwargs, arg", BEYOND_FLOAT32,
                         ids=[f"{f.__name__}-{a}" for f, _, a in BEYOND_FLOAT32])
def test_a_constant_beyond_the_params_dtype_is_named_in_the_peers_words(make, kwargs, arg):
  """Checked once, by the constructor's first link, under the peer's name."""
  tx = make(**kwargs, **{arg: 1e39})
  with pytest.raises(ValueError, match=rf"^{arg}: 1e\+39 is beyond the range of float32"):
    tx.init({"w": jnp.ones((2, 2))})


@pytest.mark.parametrize("opt", ["lamb", "lars"])
def test_timm_layer_decay_on_a_scanned_stack_equals_the_unrolled_blocks(opt):
  """#52 item 3: a stacked leaf's layers take the layer ids and scales (and freezing) that
  the unrolled model's blocks get from the same group_matcher; the unrolled model is the
  one the timm fixtures check."""
  key = jax.random.key(3)
  normal = lambda i, shape: jax.random.normal(jax.random.fold_in(key, i), shape)
  unrolled = {"conv": {"kernel": normal(0, (3, 4))},
              "blocks": {str(i): {"attn": {"kernel": normal(1 + i, (4, 4)),
                                           "bias": normal(9 + i, (4,))}} for i in range(3)},
              "head": {"kernel": normal(20, (4, 2))}}
  stack = {"conv": unrolled["conv"], "head": unrolled["head"],
           "blocks": {"attn": jax.tree.map(lambda *xs: jnp.stack(xs),
                                           *[unrolled["blocks"][str(i)]["attn"]
                                             for i in range(3)])}}
  matcher = {"stem": r"^conv", "blocks": r"^blocks\.(\d+)"}
  kw = ({"weight_decay": 0.01, "momentum": 0.9} if opt == "lars"
        else {"weight_decay": 0.05, "opt": "lambw", "corrected_weight_decay": True})
  opt = kw.pop("opt", opt)

  def run(params, **more):
    tx = P.timm_optimizer(opt, lr=0.1, layer_decay=0.5, group_matcher=matcher,
                          layer_decay_no_opt_scale=0.1, **kw, **more)
    state = tx.init(params)
    for i in range(3):
      g = jax.tree.map(lambda p, i=i: jnp.cos(p * (i + 1)), params)
      updates, state = tx.update(g, state, params)
      params = optax.apply_updates(params, updates)
    return params

  flat = run(unrolled)
  stacked = run(stack, stacked=lars_optax.by_substring("blocks"))
  chex.assert_trees_all_close(stacked["blocks"]["attn"], jax.tree.map(
      lambda *xs: jnp.stack(xs), *[flat["blocks"][str(i)]["attn"] for i in range(3)]),
      rtol=1e-5, atol=1e-6)
  chex.assert_trees_all_close({k: stacked[k] for k in ("conv", "head")},
                              {k: flat[k] for k in ("conv", "head")}, rtol=1e-5, atol=1e-6)
  # The stem is layer 0 of 5 (scale 0.0625 < 0.1: frozen), block 0 is layer 1 (0.125).
  chex.assert_trees_all_equal(stacked["conv"], stack["conv"])
  assert not np.allclose(stacked["blocks"]["attn"]["kernel"][0],
                         stack["blocks"]["attn"]["kernel"][0])
