"""The trust-ratio links (``lars_optax._trust_ratio``) on their own and in new chains.

The optimizers of the family are tested in ``test_lars.py`` (lars, tf_lars)
and ``test_lamb.py`` (lamb, lans).
"""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lars_optax
from lars_optax import masks


def _np_ratio(w, g, eta, wd, eps):
  wn, gn = np.linalg.norm(np.ravel(w)), np.linalg.norm(np.ravel(g))
  if wn == 0 or gn == 0 or not np.isfinite(wn) or not np.isfinite(gn):
    return 1.0
  return eta * wn / (gn + wd * wn + eps)


class TrustRatioTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_ratio_values_and_fallbacks(self):
    ratio = self.variant(lambda w, g, eta, wd, eps, scale=1.0: lars_optax.lars_trust_ratio(
        w, g, trust_coefficient=eta, ratio_weight_decay=wd, eps=eps, grad_scale=scale))
    w = jnp.arange(6.0).reshape(2, 3)
    g = jnp.full((2, 3), 0.5)
    np.testing.assert_allclose(ratio(w, g, 0.1, 0.01, 1e-3), _np_ratio(w, g, 0.1, 0.01, 1e-3),
                               rtol=1e-6)
    # grad_scale multiplies the gradient norm by s.
    np.testing.assert_allclose(ratio(w, g, 0.1, 0.0, 0.0, 4.0), _np_ratio(w, 4 * g, 0.1, 0, 0),
                               rtol=1e-6)
    zeros = jnp.zeros((2, 3))
    for bad_w, bad_g in [(zeros, g), (w, zeros), (w, g.at[0, 0].set(jnp.nan)),
                         (w, g.at[0, 0].set(jnp.inf)), (w.at[1, 1].set(jnp.inf), g),
                         (w.at[1, 1].set(jnp.nan), g)]:
      self.assertEqual(float(ratio(bad_w, bad_g, 0.1, 0.01, 1e-3)), 1.0)

  def test_norm_dtype_is_float32_or_wider(self):
    w = jnp.full((300,), 300.0, jnp.float16)  # |w|^2 overflows float16
    g = jnp.ones((300,), jnp.float16)
    r = lars_optax.lars_trust_ratio(w, g, trust_coefficient=1.0)
    self.assertEqual(r.dtype, jnp.float32)
    np.testing.assert_allclose(r, 300.0, rtol=1e-3)

  def test_scales_inner_output_and_skips(self):
    params = {"fc_weight": jnp.ones((4, 3)), "fc_bias": jnp.ones((3,))}
    grads = {"fc_weight": jnp.full((4, 3), 2.0), "fc_bias": jnp.full((3,), 2.0)}
    tx = lars_optax.scale_by_lars_trust_ratio(
        optax.scale(3.0), trust_coefficient=0.5, skip=lars_optax.masks.MXNET_SKIP)
    state = tx.init(params)
    out, state = tx.update(grads, state, params)
    r = _np_ratio(params["fc_weight"], grads["fc_weight"], 0.5, 0.0, 0.0)
    chex.assert_trees_all_close(out["fc_weight"], 6.0 * r * jnp.ones((4, 3)), rtol=1e-6)
    chex.assert_trees_all_close(out["fc_bias"], jnp.full((3,), 6.0))
    named = lars_optax.trust_ratios(state, params)
    self.assertEqual(float(named["fc_bias"]), 1.0)
    np.testing.assert_allclose(float(named["fc_weight"]), r, rtol=1e-6)

  def test_ratio_taken_before_inner(self):
    """The ratio uses the gradient entering the transformation, not the inner's output."""
    params = {"w": jnp.ones((4,))}
    grads = {"w": jnp.array([10.0, 0.0, 0.0, 0.0])}
    tx = lars_optax.scale_by_lars_trust_ratio(optax.clip(1.0), trust_coefficient=1.0,
                                              grad_scale=0.5)
    out, state = tx.update(grads, tx.init(params), params)
    r = _np_ratio(params["w"], 0.5 * grads["w"], 1.0, 0.0, 0.0)
    np.testing.assert_allclose(out["w"], r * np.array([1.0, 0, 0, 0]), rtol=1e-6)
    np.testing.assert_allclose(lars_optax.trust_ratios(state)[0], r, rtol=1e-6)

  def test_inner_state_is_kept(self):
    params = {"w": jnp.ones((3,))}
    tx = lars_optax.scale_by_lars_trust_ratio(optax.trace(0.9), trust_coefficient=1.0)
    state = tx.init(params)
    for _ in range(3):
      _, state = tx.update({"w": jnp.ones((3,))}, state, params)
    np.testing.assert_allclose(state.inner_state.trace["w"], 1 + 0.9 + 0.81, rtol=1e-6)

  def test_requires_params(self):
    tx = lars_optax.scale_by_lars_trust_ratio()
    with pytest.raises(ValueError, match="params"):
      tx.update({"w": jnp.ones(2)}, tx.init({"w": jnp.ones(2)}))

  def test_bad_hyperparameters(self):
    for kwargs, arg in [({"trust_coefficient": -1.0}, "trust_coefficient"),
                        ({"eps": float("nan")}, "eps"),
                        ({"ratio_weight_decay": -1e-4}, "ratio_weight_decay"),
                        ({"grad_scale": 0.0}, "grad_scale")]:
      with pytest.raises(ValueError, match=arg):
        lars_optax.scale_by_lars_trust_ratio(**kwargs)
    with pytest.raises(TypeError, match="inner"):
      lars_optax.scale_by_lars_trust_ratio(inner=lambda x: x)
    # grad_scale means one thing in both places: MXNet's rescale_grad, > 0.
    w = jnp.ones(3)
    for scale in (0.0, -4.0):
      with pytest.raises(ValueError, match=r"^grad_scale: must be > 0"):
        lars_optax.scale_by_lars_trust_ratio(grad_scale=scale)
      with pytest.raises(ValueError, match=r"^grad_scale: must be > 0"):
        lars_optax.lars_trust_ratio(w, w, grad_scale=scale)

  def test_custom_chain_with_masked_weight_decay(self):
    """Users build variants: a LAMB-like chain with decay off for norm/bias leaves."""
    params = {"params": {"Dense_0": {"kernel": jnp.ones((3, 2)), "bias": jnp.ones((2,))}}}
    grads = jax.tree.map(lambda p: 0.1 * jnp.ones_like(p), params)
    tx = optax.chain(
        lars_optax.scale_by_lars_trust_ratio(
            optax.chain(optax.scale_by_adam(),
                        optax.add_decayed_weights(0.01, mask=~lars_optax.masks.FLAX_SKIP)),
            trust_coefficient=1.0, skip=lars_optax.masks.FLAX_SKIP),
        optax.scale_by_learning_rate(0.1))
    state = tx.init(params)
    updates, state = jax.jit(tx.update)(grads, state, params)
    chex.assert_tree_all_finite(updates)
    named = lars_optax.trust_ratios(state, params)
    self.assertEqual(float(named["params/Dense_0/bias"]), 1.0)
    self.assertNotEqual(float(named["params/Dense_0/kernel"]), 1.0)


def test_mxnet_chain_equals_lars():
  """lars() is exactly the documented chain of public pieces."""
  params = {"fc_weight": jnp.linspace(-1, 1, 12).reshape(4, 3), "fc_bias": jnp.ones(3)}
  grads = jax.tree.map(lambda p: 0.7 * p + 0.2, params)
  a = lars_optax.lars(0.1, momentum=0.9, eta=0.01, wd=1e-3, rescale_grad=0.5, clip_gradient=0.3)
  b = optax.chain(
      lars_optax.scale_by_lars_trust_ratio(
          optax.chain(optax.clip(0.3), optax.add_decayed_weights(1e-3)),
          trust_coefficient=0.01, ratio_weight_decay=1e-3, eps=1e-8, skip=masks.MXNET_SKIP,
          grad_scale=0.5),
      lars_optax.mxnet_momentum(0.1, momentum=0.9))
  sa, sb = a.init(params), b.init(params)
  for _ in range(3):
    ua, sa = a.update(grads, sa, params)
    ub, sb = b.update(grads, sb, params)
    chex.assert_trees_all_equal(ua, ub)


def test_lars_wd_mult_enters_the_trust_ratio():
  p, g = {"a_weight": jnp.array([3.0, 4.0])}, {"a_weight": jnp.array([0.6, 0.8])}
  tx = lars_optax.scale_by_lars_trust_ratio(trust_coefficient=1.0, ratio_weight_decay=0.1,
                                            wd_mult={"a_weight": 2.0})
  _, state = tx.update(g, tx.init(p), p)
  np.testing.assert_allclose(state.trust_ratio[0], 5.0 / (1.0 + 0.2 * 5.0), rtol=1e-6)


# --------------------------------------------------------------------------
# trust_ratios through optax.partition / multi_transform / masked
# --------------------------------------------------------------------------


def _partition_params():
  return {"dense": {"kernel": jnp.full((3, 2), 2.0), "bias": jnp.ones(2)},
          "emb": jnp.ones((4, 2)), "head": {"kernel": jnp.full((2, 2), 3.0)}}


def _partition_step(tx, params, jit=False):
  grads = jax.tree.map(lambda x: 0.25 * x, params)
  update = jax.jit(tx.update) if jit else tx.update
  _, state = update(grads, tx.init(params), params)
  return state


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("combine", ["partition", "multi_transform"])
def test_trust_ratios_through_partition_cover_the_lars_leaves(combine, jit):
  params = _partition_params()
  labels = {"dense": {"kernel": "lars", "bias": "lars"}, "emb": "adam",
            "head": {"kernel": "lars"}}
  make = optax.partition if combine == "partition" else optax.multi_transform
  tx = make({"lars": lars_optax.lars(0.1, momentum=0.9, eta=0.5), "adam": optax.adam(1e-3)},
            labels)
  state = _partition_step(tx, params, jit)
  ratios = lars_optax.trust_ratios(state, params)
  assert sorted(ratios) == ["dense/bias", "dense/kernel", "head/kernel"]  # no "emb"
  # The same ratios as LARS alone on the leaves it covers.
  sub = {"dense": params["dense"], "head": params["head"]}
  alone = lars_optax.trust_ratios(
      _partition_step(lars_optax.lars(0.1, momentum=0.9, eta=0.5), sub), sub)
  for name, value in alone.items():
    assert float(ratios[name]) == float(value), name
  assert float(ratios["dense/bias"]) == 1.0 and float(ratios["dense/kernel"]) != 1.0
  vec = lars_optax.trust_ratios(state)  # leaf order: dense/bias, dense/kernel, emb, head
  assert vec.shape == (4,) and float(vec[2]) == -1.0


def test_trust_ratios_merge_several_lars_sub_states():
  params = _partition_params()
  labels = {"dense": {"kernel": "a", "bias": "a"}, "emb": "sgd", "head": {"kernel": "b"}}
  tx = optax.partition({"a": lars_optax.lars(0.1, eta=0.5), "b": lars_optax.tf_lars(0.1, eeta=2.0),
                        "sgd": optax.sgd(0.1)}, labels)
  ratios = lars_optax.trust_ratios(_partition_step(tx, params), params)
  assert sorted(ratios) == ["dense/bias", "dense/kernel", "head/kernel"]
  # head/kernel: ||w|| = 6, ||g|| = 1.5, eeta = 2 (tf_lars: weight_decay 1e-4 in the ratio).
  np.testing.assert_allclose(float(ratios["head/kernel"]), 2.0 * 6 / (1.5 + 1e-4 * 6),
                             rtol=1e-6)


def test_trust_ratios_through_optax_masked():
  params = _partition_params()
  route = {"dense": {"kernel": True, "bias": False}, "emb": False, "head": {"kernel": True}}
  tx = optax.masked(lars_optax.lars(0.1, momentum=0.9, skip=None), route)
  ratios = lars_optax.trust_ratios(_partition_step(tx, params), params)
  assert sorted(ratios) == ["dense/kernel", "head/kernel"]


def test_trust_ratios_under_jit_keep_every_leaf():
  params = _partition_params()
  labels = {"dense": {"kernel": "lars", "bias": "lars"}, "emb": "sgd",
            "head": {"kernel": "lars"}}
  tx = optax.partition({"lars": lars_optax.lars(0.1), "sgd": optax.sgd(0.1)}, labels)
  state = _partition_step(tx, params)
  ratios = jax.jit(lambda s: lars_optax.trust_ratios(s, params))(state)
  assert float(ratios["emb"]) == -1.0 and len(ratios) == 4


# --------------------------------------------------------------------------
# The ratios are computed twice, per leaf (applied) and for all leaves at once
# (logged); small leaves take their two norms from one reduction.
# --------------------------------------------------------------------------


def _mixed_tree():
  """Small leaves (below 4,096 elements: one reduction for both norms), large ones,
  a zero leaf (the fallback to 1) and a stacked leaf (per-layer ratios)."""
  rng = np.random.default_rng(3)
  return {"blocks": {"kernel": jnp.asarray(rng.normal(size=(3, 8, 8)), jnp.float32),
                     "bias": jnp.asarray(rng.normal(size=(3, 8)), jnp.float32)},
          "big": jnp.asarray(rng.normal(size=(64, 80)), jnp.float32),
          "bias": jnp.asarray(rng.normal(size=(16,)), jnp.float32),
          "scale": jnp.asarray(rng.normal(size=(16,)), jnp.float32),
          "zero": jnp.zeros((5, 4), jnp.float32)}


def _layer_norms(x, k):
  x = np.asarray(x, np.float64)
  return np.sqrt(np.sum(x.reshape((*x.shape[:k], -1)) ** 2, axis=-1))


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_lamb_logged_ratios_are_the_applied_ratios_on_every_kind_of_leaf(jit):
  params = _mixed_tree()
  updates = jax.tree.map(lambda p: 0.3 * p + 0.02, params)
  ks = {"blocks/kernel": 1, "blocks/bias": 1}
  tx = lars_optax.scale_by_lamb_trust_ratio(
      stacked=lars_optax.by_regex("^blocks/"))
  update = jax.jit(tx.update) if jit else tx.update
  out, state = update(updates, tx.init(params), params)
  logged = lars_optax.trust_ratios(state, params)
  flat_u = dict(masks.named_leaves(updates))
  flat_o = dict(masks.named_leaves(out))
  for name, w in masks.named_leaves(params):
    k = ks.get(name, 0)
    wn, un = _layer_norms(w, k), _layer_norms(flat_u[name], k)
    expected = np.where((wn > 0) & (un > 0), wn / np.where(un > 0, un, 1), 1.0)
    np.testing.assert_allclose(logged[name], expected, rtol=1e-6, err_msg=name)
    applied = np.reshape(expected, np.shape(expected) + (1,) * (np.ndim(w) - k))
    np.testing.assert_allclose(flat_o[name], applied * np.asarray(flat_u[name]), rtol=1e-6,
                               err_msg=name)
  # The state's per-leaf vector holds a stacked leaf's mean over its layers.
  means = [np.mean(logged[name]) for name, _ in masks.named_leaves(params)]
  np.testing.assert_allclose(state.trust_ratio, means, rtol=1e-6)


@pytest.mark.parametrize("make", [
    lambda **kw: lars_optax.lars(0.1, momentum=0.9, wd=1e-3, skip=None, **kw),
    lambda **kw: lars_optax.lamb(1e-3, wd=0.01, **kw),
    lambda **kw: lars_optax.lans(1e-3, wd=0.01, **kw),
    lambda **kw: lars_optax.porting.timm_lars(0.1, momentum=0.9, weight_decay=1e-4,
                                              trust_clip=True, **kw),
    lambda **kw: lars_optax.porting.timm_lamb(1e-3, weight_decay=0.01, trust_clip=True, **kw),
], ids=["lars", "lamb", "lans", "timm_larc", "timm_lambc"])
def test_logged_ratios_equal_eager_and_jitted_on_small_and_large_leaves(make):
  """The per-leaf and the packed computation agree however XLA fuses them."""
  params = _mixed_tree()
  grads = jax.tree.map(lambda p: 0.3 * p + 0.02, params)
  tx = make(stacked=lars_optax.by_regex("^blocks/"))
  eager_updates, eager_state = tx.update(grads, tx.init(params), params)
  jit_updates, jit_state = jax.jit(tx.update)(grads, tx.init(params), params)
  chex.assert_trees_all_close(jit_updates, eager_updates, rtol=1e-6, atol=1e-9)
  chex.assert_trees_all_close(lars_optax.trust_ratios(jit_state),
                              lars_optax.trust_ratios(eager_state), rtol=1e-6)
  assert float(lars_optax.trust_ratios(eager_state, params)["zero"]) == 1.0


def test_lamb_upper_bound_caps_an_overflowing_weight_norm_and_nan_falls_back():
  """A weight whose squared norm overflows float32 has an infinite norm; an upper
  bound makes it finite (the ratio is then bound / |u|). A NaN norm gives 1."""
  params = {"w": jnp.full((4,), 1e20, jnp.float32), "n": jnp.array([jnp.nan, 1.0])}
  updates = {"w": jnp.full((4,), 0.5, jnp.float32), "n": jnp.ones(2)}
  tx = lars_optax.scale_by_lamb_trust_ratio(upper_bound=10.0)
  out, state = tx.update(updates, tx.init(params), params)
  ratios = lars_optax.trust_ratios(state, params)
  np.testing.assert_allclose(ratios["w"], 10.0 / 1.0, rtol=1e-6)  # |u| = 0.5 * 2 = 1
  np.testing.assert_allclose(out["w"], 10.0 * 0.5, rtol=1e-6)
  assert float(ratios["n"]) == 1.0
  unbounded = lars_optax.scale_by_lamb_trust_ratio()
  _, state = unbounded.update(updates, unbounded.init(params), params)
  assert float(lars_optax.trust_ratios(state, params)["w"]) == 1.0  # infinite norm: fallback


def test_the_lars_links_take_one_name_per_meaning_and_name_it_for_the_old_ones():
  """#52 item 5: optax's trust_coefficient and eps, ratio_weight_decay for the ratio's
  lambda, grad_scale for the gradient factor, in both links; the old names say which."""
  w, g = jnp.ones((3,)), jnp.full((3,), 2.0)
  for old, new in (("eta", "trust_coefficient"), ("epsilon", "eps"), ("rescale", "grad_scale"),
                   ("weight_decay", "ratio_weight_decay")):
    for call in (lambda **kw: lars_optax.lars_trust_ratio(w, g, **kw),
                 lambda **kw: lars_optax.scale_by_lars_trust_ratio(**kw)):
      with pytest.raises(TypeError, match=rf"^{old}: .*{new}="):
        call(**{old: 0.1})
  ratio = lars_optax.lars_trust_ratio(w, g, trust_coefficient=0.5, ratio_weight_decay=0.25,
                                      eps=0.1, grad_scale=0.5)
  np.testing.assert_allclose(ratio, 0.5 * np.sqrt(3) / (np.sqrt(3) + 0.25 * np.sqrt(3) + 0.1),
                             rtol=1e-6)
