"""The links that several families share (``lars_optax._transforms``): per-leaf scale and decay."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lars_optax

# --------------------------------------------------------------------------
# scale_per_leaf, add_decayed_weights_per_leaf
# --------------------------------------------------------------------------

_TREE = {"fc1_weight": jnp.array([1.0, -2.0]), "fc1_bias": jnp.array([0.5, 4.0])}
_G = {"fc1_weight": jnp.array([0.1, 0.2]), "fc1_bias": jnp.array([-0.3, 0.4])}


def test_scale_per_leaf():
  tx = lars_optax.scale_per_leaf({"fc1_bias": 0.5})
  out, _ = tx.update(_G, tx.init(_TREE))
  chex.assert_trees_all_close(out, {"fc1_weight": _G["fc1_weight"],
                                    "fc1_bias": 0.5 * _G["fc1_bias"]})


def test_scale_per_leaf_rules_and_dtype():
  tx = lars_optax.scale_per_leaf([(lars_optax.by_suffix("weight"), 2.0)])
  g16 = jax.tree.map(lambda x: x.astype(jnp.float16), _G)
  out, _ = jax.jit(tx.update)(g16, tx.init(_TREE))
  chex.assert_trees_all_equal_dtypes(out, g16)
  np.testing.assert_allclose(out["fc1_weight"], 2 * np.asarray(g16["fc1_weight"]))


def test_scale_per_leaf_unknown_name_names_the_argument():
  tx = lars_optax.scale_per_leaf({"nope": 2.0}, arg_name="lr_mult")
  with pytest.raises(ValueError, match="lr_mult: no parameter is named 'nope'"):
    tx.init(_TREE)


def test_add_decayed_weights_per_leaf():
  tx = lars_optax.add_decayed_weights_per_leaf(0.1, multipliers={"fc1_bias": 0.0,
                                                                 "fc1_weight": 3.0})
  out, _ = tx.update(_G, tx.init(_TREE), _TREE)
  chex.assert_trees_all_close(out, {"fc1_weight": _G["fc1_weight"] + 0.3 * _TREE["fc1_weight"],
                                    "fc1_bias": _G["fc1_bias"]})


def test_add_decayed_weights_per_leaf_zero_rate_does_not_read_params():
  tx = lars_optax.add_decayed_weights_per_leaf(0.1, multipliers={"fc1_bias": 0.0})
  jaxpr = jax.make_jaxpr(lambda g, p: tx.update(g, tx.init(p), p)[0])(_G, _TREE)
  # Only fc1_weight's decay: one multiply and one add.
  assert [e.primitive.name for e in jaxpr.eqns].count("mul") == 1


@pytest.mark.parametrize("kwargs, match", [
    ({"weight_decay": -1.0}, "weight_decay: must be >= 0"),
    ({"weight_decay": 0.1, "multipliers": {"fc1_bias": -2.0}}, "multipliers: the value"),
])
def test_add_decayed_weights_per_leaf_bad_input(kwargs, match):
  with pytest.raises(ValueError, match=match):
    lars_optax.add_decayed_weights_per_leaf(**kwargs)


def test_add_decayed_weights_per_leaf_needs_params():
  tx = lars_optax.add_decayed_weights_per_leaf(0.1)
  with pytest.raises(ValueError, match="params are required"):
    tx.update(_G, tx.init(_TREE))


def test_bias_correction_is_accurate_in_float32():
  from lars_optax._utils import one_minus_pow  # pylint: disable=g-import-not-at-top
  t = jnp.arange(1.0, 5.0)
  np.testing.assert_allclose(one_minus_pow(0.999, t), 1 - 0.999 ** np.arange(1, 5), rtol=1e-6)



# --------------------------------------------------------------------------
# scale_by_caution, add_decoupled_weight_decay
# --------------------------------------------------------------------------


@pytest.mark.op_by_op
def test_scale_by_caution_drops_disagreeing_entries_and_keeps_the_mean_step():
  g = {"w": jnp.array([1.0, -1.0, 2.0, 0.5])}
  inner = lars_optax.scale_per_leaf({"w": 1.0})  # a direction equal to g...
  flip = optax.scale(-1.0)  # ...and one against it
  tx = lars_optax.scale_by_caution(inner)
  out, _ = tx.update(g, tx.init(g))
  chex.assert_trees_all_close(out, g)  # all agree: mean 1, unchanged
  tx = lars_optax.scale_by_caution(flip)
  out, _ = tx.update(g, tx.init(g))
  chex.assert_trees_all_close(out, {"w": jnp.zeros(4)})  # none agree: all masked (1e-3 floor)
  mixed = {"w": jnp.array([1.0, 1.0, -2.0, -0.5])}  # agrees on the first two
  tx = lars_optax.scale_by_caution(lars_optax.scale_per_leaf({"w": 1.0}))
  out, _ = tx.update(mixed, tx.init(g))
  chex.assert_trees_all_close(out, mixed)  # u = g: agrees everywhere
  # |g| agrees with g on 3 of 4 entries: those are scaled by 4/3, the other dropped.
  half = optax.GradientTransformation(lambda p: optax.EmptyState(),
                                      lambda u, s, p=None: (jax.tree.map(jnp.abs, u), s))
  tx = lars_optax.scale_by_caution(half)
  out, _ = jax.jit(tx.update)(g, tx.init(g))
  chex.assert_trees_all_close(out, {"w": jnp.array([1.0, 0.0, 2.0, 0.5]) * 4 / 3})


@pytest.mark.op_by_op
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.float16])
def test_scale_by_caution_keeps_dtypes(dtype):
  g = {"w": jnp.array([1.0, -1.0, 2.0, 0.5], dtype)}
  tx = lars_optax.scale_by_caution(optax.scale_by_adam())
  out, state = jax.jit(tx.update)(g, tx.init(g))
  assert out["w"].dtype == dtype and state.inner_state.mu["w"].dtype == dtype


def test_scale_by_caution_rejects_a_non_transformation():
  with pytest.raises(TypeError, match=r"^inner: expected an optax.GradientTransformation"):
    lars_optax.scale_by_caution(lambda g: g)


def test_add_decoupled_weight_decay_decays_first_and_passes_the_decayed_weights():
  seen = {}

  def update(u, s, params=None):
    seen["params"] = params
    return u, s

  inner = optax.GradientTransformation(lambda p: optax.EmptyState(), update)
  w = {"kernel": jnp.array([[2.0, -4.0]]), "bias": jnp.array([1.0])}
  g = {"kernel": jnp.array([[0.5, 0.5]]), "bias": jnp.array([0.5])}
  tx = lars_optax.add_decoupled_weight_decay(
      inner, learning_rate=optax.linear_schedule(0.1, 0.2, 1), weight_decay=0.5,
      wd_mult=[(lars_optax.by_ndim(1), 0.0)], lr_mult={"kernel": 2.0})
  state = tx.init(w)
  for lr in (0.1, 0.2):  # the schedule is called with the count
    out, state = tx.update(g, state, w)
    decay = lr * 0.5 * 2.0 * w["kernel"]
    chex.assert_trees_all_close(seen["params"], {"kernel": w["kernel"] - decay, "bias": w["bias"]})
    chex.assert_trees_all_close(out, {"kernel": g["kernel"] - decay, "bias": g["bias"]})


def test_add_decoupled_weight_decay_checks_its_arguments():
  with pytest.raises(ValueError, match=r"^weight_decay"):
    lars_optax.add_decoupled_weight_decay(optax.identity(), learning_rate=0.1, weight_decay=-1.0)
  with pytest.raises(ValueError, match=r"^learning_rate"):
    lars_optax.add_decoupled_weight_decay(optax.identity(), learning_rate=-0.1, weight_decay=1e-2)
  tx = lars_optax.add_decoupled_weight_decay(optax.identity(), learning_rate=0.1, weight_decay=1e-2)
  with pytest.raises(ValueError, match=r"^params: add_decoupled_weight_decay needs the params"):
    tx.update(_G, tx.init(_TREE))
  tx = lars_optax.add_decoupled_weight_decay(optax.identity(), learning_rate=0.1,
                                             weight_decay=1e-2, wd_mult={"nope": 0.0})
  with pytest.raises(ValueError, match="wd_mult"):
    tx.init(_TREE)


@pytest.mark.parametrize("bad", [jnp.nan, jnp.inf], ids=["nan", "inf"])
def test_scale_by_caution_keeps_a_nonfinite_gradient_visible(bad):
  """A masked-out entry is multiplied by 0, as in timm: NaN stays NaN, not a zero step."""
  g = {"w": jnp.array([1.0, bad, -2.0, 0.5])}
  tx = lars_optax.scale_by_caution(optax.scale_by_adam())
  out, _ = tx.update(g, tx.init(g))
  assert not bool(jnp.all(jnp.isfinite(out["w"])))
  params = {"w": jnp.ones((2, 2))}
  tx = lars_optax.porting.timm_lamb(1e-2, weight_decay=0.01, caution=True)
  updates, _ = tx.update({"w": jnp.array([[1.0, bad], [0.5, -1.0]])}, tx.init(params), params)
  assert not bool(jnp.all(jnp.isfinite(updates["w"])))
