"""``lars_optax.porting``'s timm constructors: timm's LARS, LAMB and
``create_optimizer_v2``, their rules and defaults."""

from __future__ import annotations

import warnings

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lars_optax
from lars_optax import masks
from porting_runs import P, random_run, run_steps


@pytest.mark.op_by_op
def test_timm_lars_without_weight_decay_is_plain_sgd_as_in_timm():
  # timm adapts only a group whose weight_decay is not 0 (or with always_adapt).
  sched = optax.linear_schedule(0.01, 0.1, 3)
  ours, _ = run_steps(P.timm_lars(sched, momentum=0.9))
  ref, _ = run_steps(optax.sgd(sched, momentum=0.9))
  chex.assert_trees_all_close(ours, ref, rtol=1e-6)
  adapted, _ = run_steps(P.timm_lars(sched, momentum=0.9, always_adapt=True))
  assert float(jnp.max(jnp.abs(adapted["w"] - ref["w"]))) > 1e-3


@pytest.mark.op_by_op
def test_timm_lars_rate_after_the_buffer_only_matters_when_the_rate_changes():
  kw = {"momentum": 0.9, "weight_decay": 1e-3, "trust_coeff": 0.1}
  mxnet_kw = {"momentum": 0.9, "wd": 1e-3, "eta": 0.1, "skip": None}
  timm, _ = run_steps(P.timm_lars(0.5, **kw))
  mxnet, _ = run_steps(lars_optax.lars(0.5, **mxnet_kw))
  chex.assert_trees_all_close(timm, mxnet, rtol=1e-5)
  sched = optax.linear_schedule(0.05, 0.5, 3)
  timm, _ = run_steps(P.timm_lars(sched, **kw))
  mxnet, _ = run_steps(lars_optax.lars(sched, **mxnet_kw))
  assert float(jnp.max(jnp.abs(timm["w"] - mxnet["w"]))) > 1e-3


def test_timm_trust_clip_bounds_the_ratio_by_the_rate_and_survives_a_zero_rate():
  sched = optax.linear_schedule(0.0, 0.5, 2)  # 0 at the first step: rho / 0 -> clipped to 1
  tx = P.timm_lars(sched, momentum=0.9, weight_decay=1e-3, trust_coeff=10.0, trust_clip=True)
  params, state = run_steps(tx, steps=1)
  assert all(float(r) == 1.0 for r in lars_optax.trust_ratios(state, params).values())
  params, state = run_steps(tx, steps=3)
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


def test_timm_optimizer_no_weight_decay_takes_leaf_names_as_leaf_names_prints_them():
  # "head/kernel" is the spelling lars_optax.leaf_names prints; it is "head.kernel".
  params = {"pos_embed": jnp.ones((3, 4)), "head": {"kernel": jnp.ones((4, 2))}}
  zeros = jax.tree.map(jnp.zeros_like, params)
  tx = P.timm_optimizer("lambw", lr=0.1, weight_decay=0.5, no_weight_decay=["head/kernel"],
                        filter_bias_and_bn=False)
  updates, _ = tx.update(zeros, tx.init(params), params)
  chex.assert_trees_all_close(updates["head"]["kernel"], jnp.zeros((4, 2)))
  chex.assert_trees_all_close(updates["pos_embed"], -0.05 * params["pos_embed"])


def test_timm_optimizer_warns_of_a_no_weight_decay_pattern_that_matches_nothing():
  params = {"pos_embed": jnp.ones((3, 4)), "head": {"kernel": jnp.ones((4, 2))}}
  tx = P.timm_optimizer("lamb", lr=0.1, weight_decay=0.5, no_weight_decay=["pos_embed", "cls"])
  with pytest.warns(UserWarning, match=r"no_weight_decay: \['cls'\] match no parameter"):
    tx.init(params)
  tx = P.timm_optimizer("lamb", lr=0.1, weight_decay=0.5, no_weight_decay=["pos_*", "head.*"],
                        layer_decay=0.5, group_matcher={"head": r"^head"})
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    tx.init(params)


@pytest.mark.op_by_op
def test_timm_optimizer_passes_the_class_arguments_and_its_defaults():
  a, _ = run_steps(P.timm_optimizer("lars", lr=0.5, weight_decay=1e-3, trust_coeff=0.1,
                               eps=1e-6, filter_bias_and_bn=False))
  b, _ = run_steps(P.timm_lars(0.5, momentum=0.9, weight_decay=1e-3, trust_coeff=0.1, eps=1e-6))
  chex.assert_trees_all_close(a, b, rtol=1e-6)
  a, _ = run_steps(P.timm_optimizer("lamb", weight_decay=0.01, filter_bias_and_bn=False))
  b, _ = run_steps(P.timm_lamb())  # lr=None: the class's 1e-3
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
  a, _ = run_steps(P.timm_optimizer(opt, **common, **kwargs))
  b, _ = run_steps(P.timm_optimizer(same[0], **common, **same[1]))
  chex.assert_trees_all_close(a, b, rtol=1e-6)


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
  with pytest.raises(ValueError, match=r"^layer_decay: params are required; call update"):
    tx.update(g, state)
  with pytest.raises(TypeError, match=r"^fallback_list: expected a list"):
    P.timm_optimizer("lamb", fallback_list="x")


def test_timm_classes_take_foreach_and_corrected_weight_decay_checks_its_peak_rate():
  """``foreach`` changes no number; ``corrected_weight_decay`` needs the peak rate under a
  schedule (the fixtures check its numbers), and ``max_lr`` means nothing without it."""
  for make in (P.timm_lars, P.timm_lamb):
    plain = random_run(make(0.1, weight_decay=0.01), steps=2)
    chex.assert_trees_all_equal(random_run(make(0.1, weight_decay=0.01, foreach=False),
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
      random_run(P.timm_lamb(0.1, decoupled_decay=True, corrected_weight_decay=True), steps=2),
      random_run(P.timm_lamb(0.1, decoupled_decay=True), steps=2), rtol=1e-6)


def test_larc_clip_with_a_zero_coefficient_and_a_rate_of_zero_stays_finite():
  """A ratio of 0 and a rate of 0 (a warm-up from 0) would be 0/0 in the clip: it is 1, and the
  step is 0 either way."""
  sched = optax.linear_schedule(0.0, 0.5, 3)
  tx = P.timm_lars(sched, momentum=0.9, weight_decay=1e-3, trust_coeff=0.0, trust_clip=True)
  params, state = run_steps(tx, steps=4)
  chex.assert_tree_all_finite(params)
  chex.assert_tree_all_finite(lars_optax.trust_ratios(state))
  tx = lars_optax.scale_by_lars_trust_ratio(trust_coefficient=0.0, larc_learning_rate=0.0)
  p = {"w": jnp.ones(3)}
  _, state = tx.update(p, tx.init(p), p)
  assert float(lars_optax.trust_ratios(state)[0]) == 1.0


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
