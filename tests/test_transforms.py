"""The links that several families share (``lars_optax.transforms``): per-leaf scale and decay."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
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
  tx = lars_optax.add_decayed_weights_per_leaf(0.1, {"fc1_bias": 0.0, "fc1_weight": 3.0})
  out, _ = tx.update(_G, tx.init(_TREE), _TREE)
  chex.assert_trees_all_close(out, {"fc1_weight": _G["fc1_weight"] + 0.3 * _TREE["fc1_weight"],
                                    "fc1_bias": _G["fc1_bias"]})


def test_add_decayed_weights_per_leaf_zero_rate_does_not_read_params():
  tx = lars_optax.add_decayed_weights_per_leaf(0.1, {"fc1_bias": 0.0})
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

