"""Tests for lars_optax.masks: leaf names, mask builders, presets, resolve_mask."""

import dataclasses
import re
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lars_optax
from lars_optax import _masks, masks


def _flax_params():
  return {
      "params": {
          "Dense_0": {"kernel": jnp.ones((3, 2)), "bias": jnp.ones((2,))},
          "BatchNorm_0": {"scale": jnp.ones((2,)), "bias": jnp.ones((2,))},
          "LayerNorm_0": {"scale": jnp.ones((2,)), "bias": jnp.ones((2,))},
      }
  }


def _haiku_params():
  return {
      "mlp/~/linear_0": {"w": jnp.ones((3, 2)), "b": jnp.ones((2,))},
      "batch_norm": {"scale": jnp.ones((2,)), "offset": jnp.ones((2,))},
  }


def _mxnet_params():
  return {
      "fc1_weight": jnp.ones((2, 3)),
      "fc1_bias": jnp.ones((2,)),
      "bn_gamma": jnp.ones((2,)),
      "bn_beta": jnp.ones((2,)),
      "mybeta": jnp.ones((2,)),
      "gamma_weight": jnp.ones((2, 2)),
  }


class _Pair(NamedTuple):
  weight: jax.Array
  bias: jax.Array


@dataclasses.dataclass
class _Layer:
  kernel: jax.Array
  bias: jax.Array


jax.tree_util.register_dataclass(_Layer, data_fields=["kernel", "bias"], meta_fields=[])


# --------------------------------------------------------------------------
# leaf_names / named_leaves
# --------------------------------------------------------------------------


def test_leaf_names_flax():
  params = _flax_params()
  names = lars_optax.leaf_names(params)
  assert names == {
      "params": {
          "Dense_0": {"kernel": "params/Dense_0/kernel", "bias": "params/Dense_0/bias"},
          "BatchNorm_0": {"scale": "params/BatchNorm_0/scale",
                          "bias": "params/BatchNorm_0/bias"},
          "LayerNorm_0": {"scale": "params/LayerNorm_0/scale",
                          "bias": "params/LayerNorm_0/bias"},
      }
  }
  assert jax.tree.structure(names) == jax.tree.structure(params)


@pytest.mark.quick  # (also at the Flax floor, whose nnx.split holds VariableState boxes)
def test_named_leaves_of_nnx_split_state_are_the_variables_paths():
  from flax import nnx

  class Bag(nnx.Module):
    def __init__(self, rngs):
      self.embed = nnx.Embed(10, 4, rngs=rngs)
      self.out = nnx.Linear(4, 1, rngs=rngs)

  _, state = nnx.split(Bag(nnx.Rngs(0)), nnx.Param)
  assert [n for n, _ in lars_optax.named_leaves(state)] == [
      "embed/embedding", "out/bias", "out/kernel"]


def test_named_leaves_order_matches_tree_leaves():
  params = _flax_params()
  named = lars_optax.named_leaves(params)
  leaves = jax.tree.leaves(params)
  assert len(named) == len(leaves)
  for (_, a), b in zip(named, leaves):
    assert a is b
  assert [n for n, _ in named] == jax.tree.leaves(lars_optax.leaf_names(params))
  # Dicts flatten in sorted key order.
  assert [n for n, _ in named] == [
      "params/BatchNorm_0/bias", "params/BatchNorm_0/scale",
      "params/Dense_0/bias", "params/Dense_0/kernel",
      "params/LayerNorm_0/bias", "params/LayerNorm_0/scale",
  ]


def test_leaf_names_haiku():
  names = [n for n, _ in lars_optax.named_leaves(_haiku_params())]
  assert names == ["batch_norm/offset", "batch_norm/scale",
                   "mlp/~/linear_0/b", "mlp/~/linear_0/w"]


def test_leaf_names_flat_mxnet_dict():
  names = lars_optax.leaf_names({"fc1_weight": 1.0, "fc1_bias": 2.0})
  assert names == {"fc1_weight": "fc1_weight", "fc1_bias": "fc1_bias"}


@pytest.mark.parametrize("container", [list, tuple])
def test_leaf_names_sequence(container):
  tree = container([jnp.ones(2), container([jnp.ones(1), jnp.ones(3)])])
  assert [n for n, _ in lars_optax.named_leaves(tree)] == ["0", "1/0", "1/1"]
  assert lars_optax.leaf_names(tree) == container(["0", container(["1/0", "1/1"])])


def test_leaf_names_namedtuple():
  tree = {"layer": _Pair(jnp.ones((2, 2)), jnp.ones(2))}
  assert lars_optax.leaf_names(tree) == {"layer": _Pair("layer/weight", "layer/bias")}


def test_leaf_names_registered_dataclass():
  tree = [_Layer(jnp.ones((2, 2)), jnp.ones(2))]
  assert [n for n, _ in lars_optax.named_leaves(tree)] == ["0/kernel", "0/bias"]
  names = lars_optax.leaf_names(tree)
  assert names[0].kernel == "0/kernel" and names[0].bias == "0/bias"


def test_none_and_masked_node_are_skipped():
  tree = {"a": None, "b": {"w": jnp.ones(2), "frozen": optax.MaskedNode()}, "c": [None, 1.0]}
  named = lars_optax.named_leaves(tree)
  assert [n for n, _ in named] == ["b/w", "c/1"]
  names = lars_optax.leaf_names(tree)
  assert names["a"] is None
  assert isinstance(names["b"]["frozen"], optax.MaskedNode)
  assert names["b"]["w"] == "b/w"
  assert names["c"] == [None, "c/1"]
  # Masks keep these nodes as they are and only decide the real leaves.
  out = lars_optax.by_leaf_name("w")(tree)
  assert out["a"] is None and isinstance(out["b"]["frozen"], optax.MaskedNode)
  assert out["b"]["w"] is True and out["c"] == [None, False]


# --------------------------------------------------------------------------
# Builders
# --------------------------------------------------------------------------


def test_by_suffix_mxnet():
  mask = lars_optax.by_suffix("gamma", "beta", "bias")
  out = mask(_mxnet_params())
  assert out == {
      "fc1_weight": False,
      "fc1_bias": True,
      "bn_gamma": True,
      "bn_beta": True,
      "mybeta": True,  # a pure suffix rule
      "gamma_weight": False,
  }
  assert all(type(v) is bool for v in jax.tree.leaves(out))


def test_by_substring_tf_skip_list():
  params = {"dense/kernel": jnp.ones((2, 2)), "dense/bias": jnp.ones(2),
            "batch_normalization/gamma": jnp.ones(2), "conv/kernel": jnp.ones((1, 1))}
  mask = lars_optax.by_substring("batch_normalization", "bias")
  assert mask.select(params) == ["batch_normalization/gamma", "dense/bias"]
  # A substring may span path components.
  assert lars_optax.by_substring("dense/b").select(params) == ["dense/bias"]


def test_by_regex():
  params = _flax_params()
  mask = lars_optax.by_regex(r"Norm_\d+/(scale|bias)$")
  assert mask.select(params) == [
      "params/BatchNorm_0/bias", "params/BatchNorm_0/scale",
      "params/LayerNorm_0/bias", "params/LayerNorm_0/scale"]
  # re.search: matches anywhere, and a compiled pattern is accepted.
  assert lars_optax.by_regex(re.compile("Dense")).select(params) == [
      "params/Dense_0/bias", "params/Dense_0/kernel"]


def test_by_leaf_name_exact_last_component():
  tree = {"params": {"Dense_0": {"kernel": 0.0, "bias": 0.0}}, "fc1_bias": 0.0,
          "bias": {"kernel": 0.0}, "my_bias": 0.0}
  assert lars_optax.by_leaf_name("bias").select(tree) == ["params/Dense_0/bias"]
  assert lars_optax.by_leaf_name("kernel", "my_bias").select(tree) == [
      "bias/kernel", "my_bias", "params/Dense_0/kernel"]


def test_by_predicate_gets_name_and_leaf():
  seen = []

  def big_kernel(name, leaf):
    seen.append((name, np.shape(leaf)))
    return name.endswith("kernel") and leaf.size > 4

  tree = {"a": {"kernel": jnp.ones((3, 3))}, "b": {"kernel": jnp.ones((2, 2))}}
  mask = lars_optax.by_predicate(big_kernel)
  assert mask(tree) == {"a": {"kernel": True}, "b": {"kernel": False}}
  assert seen == [("a/kernel", (3, 3)), ("b/kernel", (2, 2))]
  assert "big_kernel" in repr(mask)
  assert "mine" in repr(lars_optax.by_predicate(lambda n, x: True, description="mine"))


@pytest.mark.parametrize("max_ndim, expected", [
    (0, ["s"]),
    (1, ["b", "s"]),
    (2, ["b", "s", "w"]),
])
def test_by_ndim(max_ndim, expected):
  tree = {"w": jnp.ones((2, 3)), "b": jnp.ones(3), "s": jnp.ones(()), "k": jnp.ones((1, 1, 1, 1))}
  assert lars_optax.by_ndim(max_ndim).select(tree) == expected


def test_by_ndim_default_is_one():
  tree = {"w": jnp.ones((2, 3)), "b": jnp.ones(3)}
  assert lars_optax.by_ndim()(tree) == {"w": False, "b": True}


def test_combinators():
  params = _mxnet_params()
  bias = lars_optax.by_suffix("bias")
  vec = lars_optax.by_ndim(1)
  assert (bias | lars_optax.by_suffix("gamma")).select(params) == ["bn_gamma", "fc1_bias"]
  assert (vec & ~bias).select(params) == ["bn_beta", "bn_gamma", "mybeta"]
  assert (~vec).select(params) == ["fc1_weight", "gamma_weight"]
  assert (~~bias)(params) == bias(params)
  assert masks.everything.select(params) == sorted(params)
  assert masks.nothing.select(params) == []
  assert (bias | masks.everything).select(params) == sorted(params)
  assert (bias & masks.nothing).select(params) == []


def test_select_returns_names_in_leaf_order():
  params = _flax_params()
  assert lars_optax.masks.FLAX_SKIP.select(params) == [
      "params/BatchNorm_0/bias", "params/BatchNorm_0/scale", "params/Dense_0/bias",
      "params/LayerNorm_0/bias", "params/LayerNorm_0/scale"]
  assert lars_optax.masks.FLAX_SKIP.select({}) == []


def test_matches():
  assert lars_optax.masks.MXNET_SKIP.matches("fc1_bias", None)
  assert not lars_optax.masks.MXNET_SKIP.matches("fc1_weight", None)


def test_repr_is_informative():
  assert repr(lars_optax.by_suffix("gamma", "beta")) == "Mask(suffix in ['gamma', 'beta'])"
  assert "bias" in repr(lars_optax.by_substring("bias"))
  assert "substring" in repr(lars_optax.by_substring("bias"))
  assert "Dense" in repr(lars_optax.by_regex("Dense"))
  assert "kernel" in repr(lars_optax.by_leaf_name("kernel"))
  assert "ndim <= 2" in repr(lars_optax.by_ndim(2))
  combined = ~(lars_optax.by_suffix("a") | lars_optax.by_ndim(1)) & lars_optax.by_leaf_name("b")
  r = repr(combined)
  assert r.startswith("Mask(")
  for part in ("suffix in ['a']", "ndim <= 1", "leaf name in ['b']", "|", "&", "~"):
    assert part in r
  for preset in (lars_optax.masks.MXNET_SKIP, lars_optax.masks.FLAX_SKIP,
                 lars_optax.masks.HAIKU_SKIP):
    assert repr(preset).startswith("Mask(") and "custom rule" not in repr(preset)


# --------------------------------------------------------------------------
# Presets
# --------------------------------------------------------------------------


def test_mxnet_skip_preset():
  assert lars_optax.masks.MXNET_SKIP.select(_mxnet_params()) == [
      "bn_beta", "bn_gamma", "fc1_bias", "mybeta"]


def test_flax_skip_preset():
  out = lars_optax.masks.FLAX_SKIP(_flax_params())["params"]
  assert out == {
      "Dense_0": {"kernel": False, "bias": True},
      "BatchNorm_0": {"scale": True, "bias": True},
      "LayerNorm_0": {"scale": True, "bias": True},
  }


def test_haiku_skip_preset():
  out = lars_optax.masks.HAIKU_SKIP(_haiku_params())
  assert out == {
      "mlp/~/linear_0": {"w": False, "b": True},
      "batch_norm": {"scale": True, "offset": True},
  }


def test_presets_exported_from_masks_module():
  assert lars_optax.masks.MXNET_SKIP is masks.MXNET_SKIP
  assert lars_optax.masks.FLAX_SKIP is masks.FLAX_SKIP
  assert lars_optax.masks.HAIKU_SKIP is masks.HAIKU_SKIP


# --------------------------------------------------------------------------
# Masks in optax
# --------------------------------------------------------------------------


def test_mask_in_optax_masked():
  params = _mxnet_params()
  grads = jax.tree.map(lambda p: 2.0 * p, params)
  tx = optax.masked(optax.set_to_zero(), lars_optax.masks.MXNET_SKIP)
  updates, _ = tx.update(grads, tx.init(params), params)
  skipped = {"fc1_bias", "bn_gamma", "bn_beta", "mybeta"}
  expected = {k: (jnp.zeros_like(g) if k in skipped else g) for k, g in grads.items()}
  chex.assert_trees_all_close(updates, expected)


@pytest.mark.parametrize("arg", ["lr_mult", "wd_mult"])
def test_leaf_values_may_name_a_leaf_that_optax_masked_hides(arg):
  """The masked-out leaves keep their paths (MaskedNode placeholders), so a key
  naming one is accepted, as a mask's name is; it then has no effect."""
  params = {"dense": {"kernel": jnp.ones((2, 2)), "bias": jnp.ones(2)}, "emb": jnp.ones(3)}
  grads = jax.tree.map(lambda p: 0.5 * p, params)
  hide = {"dense": {"kernel": True, "bias": False}, "emb": False}
  inner = lars_optax.mxnet.create("sgd", learning_rate=0.1, wd=0.1,
                            **{arg: {"dense/kernel": 0.5, "dense/bias": 0.0}})
  tx = optax.masked(inner, hide)
  updates, _ = tx.update(grads, tx.init(params), params)
  # kernel: lr 0.1 * (0.5 + wd 0.1 * 1), with its multiplier on lr or on wd.
  kernel = {"lr_mult": -0.1 * 0.5 * 0.6, "wd_mult": -0.1 * (0.5 + 0.5 * 0.1)}[arg]
  np.testing.assert_allclose(updates["dense"]["kernel"], kernel, rtol=1e-6)
  # The hidden leaves pass through optax.masked unchanged.
  chex.assert_trees_all_equal(updates["dense"]["bias"], grads["dense"]["bias"])
  chex.assert_trees_all_equal(updates["emb"], grads["emb"])


def test_leaf_values_may_name_a_leaf_under_a_subtree_that_optax_masked_hides():
  params = {"dense": {"kernel": jnp.ones((2, 2)), "bias": jnp.ones(2)}, "emb": jnp.ones(3)}
  tx = optax.masked(lars_optax.mxnet.create("sgd", lr_mult={"dense/bias": 0.0, "emb": 2.0}),
                    {"dense": False, "emb": True})  # a prefix: the whole subtree hidden
  updates, _ = tx.update(params, tx.init(params), params)
  np.testing.assert_allclose(updates["emb"], -0.1 * 2.0, rtol=1e-6)


def test_leaf_values_key_that_names_no_leaf_still_raises_under_optax_masked():
  params = {"w": jnp.ones(2), "b": jnp.ones(2)}
  tx = optax.masked(lars_optax.mxnet.create("sgd", lr_mult={"bb": 0.5}), {"w": True, "b": False})
  with pytest.raises(ValueError, match=r"^lr_mult: no parameter is named 'bb' \(did you mean "
                                       r"\['b'\]\?\)"):
    tx.init(params)


def test_mask_in_add_decayed_weights():
  params = {"fc1_weight": jnp.array([[1.0, -2.0]]), "fc1_bias": jnp.array([3.0]),
            "bn_gamma": jnp.array([4.0])}
  grads = {"fc1_weight": jnp.array([[0.5, 0.5]]), "fc1_bias": jnp.array([0.5]),
           "bn_gamma": jnp.array([0.5])}
  tx = optax.add_decayed_weights(0.1, mask=~lars_optax.masks.MXNET_SKIP)
  updates, _ = tx.update(grads, tx.init(params), params)
  chex.assert_trees_all_close(updates, {
      "fc1_weight": jnp.array([[0.6, 0.3]]),
      "fc1_bias": jnp.array([0.5]),
      "bn_gamma": jnp.array([0.5]),
  })


def test_mask_under_jit():
  mask = lars_optax.by_suffix("bias") | lars_optax.by_ndim(0)
  tx = optax.masked(optax.set_to_zero(), mask)
  params = {"w": jnp.ones((2, 2)), "fc_bias": jnp.ones(2), "s": jnp.ones(())}
  state = tx.init(params)

  @jax.jit
  def step(grads, state, params):
    resolved = mask(params)  # evaluated on tracers: names and ndim only
    assert resolved == {"w": False, "fc_bias": True, "s": True}
    return tx.update(grads, state, params)[0]

  grads = {"w": jnp.full((2, 2), 3.0), "fc_bias": jnp.full(2, 3.0), "s": jnp.array(3.0)}
  updates = step(grads, state, params)
  chex.assert_trees_all_close(updates, {"w": jnp.full((2, 2), 3.0),
                                        "fc_bias": jnp.zeros(2), "s": jnp.array(0.0)})


def test_mask_rule_reading_values_fails_under_jit():
  mask = lars_optax.by_predicate(lambda name, leaf: leaf.sum() > 0)

  @jax.jit
  def f(params):
    return mask(params)

  with pytest.raises(jax.errors.ConcretizationTypeError):
    f({"a": jnp.ones(2)})


# --------------------------------------------------------------------------
# resolve_mask
# --------------------------------------------------------------------------


def test_resolve_mask_none_is_all_false():
  params = _flax_params()
  assert _masks.resolve_mask(None, params) == [False] * 6
  assert _masks.resolve_mask(None, {}) == []


def test_resolve_mask_bool_pytree():
  params = {"a": jnp.ones(2), "b": {"c": jnp.ones(3), "d": jnp.ones(1)}}
  value = {"a": True, "b": {"c": False, "d": np.bool_(True)}}
  out = _masks.resolve_mask(value, params)
  assert out == [True, False, True]
  assert all(type(v) is bool for v in out)


def test_resolve_mask_callable():
  params = _flax_params()
  expected = [True, True, True, False, True, True]
  assert _masks.resolve_mask(lars_optax.masks.FLAX_SKIP, params) == expected
  # Any callable returning a bool pytree (optax's convention).
  plain = lambda p: jax.tree.map(lambda x: x.ndim == 1, p)
  assert _masks.resolve_mask(plain, params) == expected


def test_resolve_mask_single_bool():
  params = {"a": jnp.ones(2), "b": jnp.ones(3)}
  assert _masks.resolve_mask(True, params) == [True, True]
  assert _masks.resolve_mask(lambda p: False, params) == [False, False]


@pytest.mark.parametrize("bad", [
    {"a": True},  # missing key
    {"a": True, "b": False, "c": True},  # extra key
    [True, False],  # different container
])
def test_resolve_mask_mismatched_tree(bad):
  params = {"a": jnp.ones(2), "b": jnp.ones(3)}
  with pytest.raises(ValueError, match="my_skip"):
    _masks.resolve_mask(bad, params, "my_skip")


@pytest.mark.parametrize("leaf", [jnp.array(True), np.array([True]), 1, "yes"])
def test_resolve_mask_non_bool_leaf(leaf):
  params = {"a": jnp.ones(2), "b": jnp.ones(3)}
  with pytest.raises(TypeError, match="static") as e:
    _masks.resolve_mask({"a": True, "b": leaf}, params, "skip")
  assert "skip" in str(e.value) and "'b'" in str(e.value)


def test_resolve_mask_traced_bool_rejected():
  params = {"a": jnp.ones(2)}

  @jax.jit
  def f(params):
    return _masks.resolve_mask(lambda p: jax.tree.map(lambda x: x.sum() > 0, p), params)

  with pytest.raises(TypeError, match="static"):
    f(params)


# --------------------------------------------------------------------------
# Bad builder input
# --------------------------------------------------------------------------


@pytest.mark.parametrize("builder", [lars_optax.by_suffix, lars_optax.by_substring,
                                     lars_optax.by_leaf_name])
def test_builder_needs_a_string(builder):
  with pytest.raises(ValueError, match="at least one"):
    builder()


@pytest.mark.parametrize("builder", [lars_optax.by_suffix, lars_optax.by_substring,
                                     lars_optax.by_leaf_name])
@pytest.mark.parametrize("bad", [3, None, b"bias", ""])
def test_builder_rejects_non_strings(builder, bad):
  with pytest.raises(TypeError, match="strings"):
    builder("ok", bad)


def test_by_suffix_int():
  with pytest.raises(TypeError, match="suffixes"):
    lars_optax.by_suffix(3)


@pytest.mark.parametrize("pattern", ["(", "[a-", 3])
def test_by_regex_invalid(pattern):
  with pytest.raises(ValueError, match="pattern"):
    lars_optax.by_regex(pattern)


@pytest.mark.parametrize("bad", [-1, 1.5, True, "1"])
def test_by_ndim_invalid(bad):
  with pytest.raises(ValueError, match="max_ndim"):
    lars_optax.by_ndim(bad)


def test_by_predicate_not_callable():
  with pytest.raises(TypeError, match="fn"):
    lars_optax.by_predicate("bias")


def test_mask_rule_not_callable():
  with pytest.raises(TypeError, match="callable"):
    lars_optax.Mask("bias")


@pytest.mark.parametrize("other", [
    lambda tree: tree,
    {"a": True},
    True,
    "bias",
])
def test_combining_with_non_mask(other):
  mask = lars_optax.by_suffix("bias")
  with pytest.raises(TypeError):
    mask | other  # pylint: disable=pointless-statement
  with pytest.raises(TypeError):
    mask & other  # pylint: disable=pointless-statement
  with pytest.raises(TypeError):
    other | mask  # pylint: disable=pointless-statement
  with pytest.raises(TypeError):
    other & mask  # pylint: disable=pointless-statement


def test_combining_with_non_mask_message():
  with pytest.raises(TypeError, match="by_predicate"):
    lars_optax.by_suffix("bias") | (lambda n, x: True)  # pylint: disable=expression-not-assigned


# --------------------------------------------------------------------------
# Per-leaf values (lr_mult / wd_mult)
# --------------------------------------------------------------------------

_MULT_TREE = {"fc1_weight": np.ones((2, 2)), "fc1_bias": np.ones(2), "bn_gamma": np.ones(2)}


def test_leaf_values_none_gives_the_default():
  assert _masks.resolve_leaf_values(None, _MULT_TREE, "lr_mult") == [1.0, 1.0, 1.0]
  assert _masks.resolve_leaf_values(None, _MULT_TREE, "x", default=0.5) == [0.5] * 3


def test_leaf_values_dict_by_name():
  # jax.tree.leaves order: bn_gamma, fc1_bias, fc1_weight
  got = _masks.resolve_leaf_values({"fc1_bias": 0.0, "fc1_weight": 2}, _MULT_TREE, "wd_mult")
  assert got == [1.0, 0.0, 2.0]


def test_leaf_values_rules_first_match_wins():
  rules = [(masks.by_suffix("bias"), 0.0), ("mxnet", 3.0), (masks.everything, 0.5)]
  got = _masks.resolve_leaf_values(rules, _MULT_TREE, "lr_mult")
  assert got == [3.0, 0.0, 0.5]


def test_leaf_values_rule_with_a_bool_pytree_mask():
  mask = {"fc1_weight": True, "fc1_bias": False, "bn_gamma": False}
  assert _masks.resolve_leaf_values([(mask, 4.0)], _MULT_TREE, "lr_mult") == [1.0, 1.0, 4.0]


def test_leaf_values_unknown_name_suggests_close_ones():
  with pytest.raises(ValueError, match=r"wd_mult: no parameter is named 'fc1_weigth' \(did you "
                     r"mean \['fc1_weight'"):
    _masks.resolve_leaf_values({"fc1_weigth": 0.0}, _MULT_TREE, "wd_mult")


@pytest.mark.parametrize("spec, exc, match", [
    ({"fc1_bias": -1.0}, ValueError, "must be finite and >= 0"),
    ({"fc1_bias": float("nan")}, ValueError, "must be finite and >= 0"),
    ({"fc1_bias": "2"}, TypeError, "must be a real number"),
    ({"fc1_bias": True}, TypeError, "must be a real number"),
    ({1: 2.0}, TypeError, "dict keys must be leaf names"),
    (0.5, TypeError, "expected a dict"),
    ("fc1_bias", TypeError, "expected a dict"),
    ([("mxnet", 2.0, 1)], TypeError, r"expected \(mask, value\) pairs"),
    ([(None, 2.0)], TypeError, "a rule's mask is None"),
    ([("nopreset", 2.0)], ValueError, "unknown preset"),
])
def test_leaf_values_bad_specs(spec, exc, match):
  with pytest.raises(exc, match="lr_mult: .*" + match):
    _masks.check_leaf_values(spec, "lr_mult")


@pytest.mark.parametrize("pattern", [b"bias", re.compile(b"bias")])
def test_by_regex_rejects_bytes_patterns(pattern):
  with pytest.raises(TypeError, match=r"^pattern: expected a str"):
    lars_optax.by_regex(pattern)


@pytest.mark.parametrize("value", [np.complex64(2 + 1j), np.complex128(1), 1 + 2j,
                                   jnp.complex64(3)])
def test_leaf_values_reject_complex_numbers(value):
  with pytest.raises(TypeError, match=r"^lr_mult: the value for 'w' must be a real number"):
    _masks.check_leaf_values({"w": value}, "lr_mult")
  with pytest.raises(TypeError, match=r"^lr_mult: the value for .* must be a real number"):
    _masks.check_leaf_values([("mxnet", value)], "lr_mult")


def test_check_unique_names():
  _masks.check_unique_names({"a": {"b": 1}, "a_b": 2})
  with pytest.raises(ValueError, match=r"^params: the leaves at \['a'\]\['b'\] and "
                                       r"\['a/b'\] share the name 'a/b'"):
    _masks.check_unique_names({"a/b": 1, "a": {"b": 2}})
