"""The public links and their rules (``lars_optax/_links.py``): a rule checks nothing,
its public link checks each argument by its one declaration, then the trees."""

from __future__ import annotations

import ast
import inspect
import pathlib

import jax.numpy as jnp
import optax
import pytest

import lars_optax
from lars_optax import _assembly as assembly
from lars_optax import _links


PACKAGE = pathlib.Path(lars_optax.__file__).parent


def _public_links():
  """Every public link made by ``_links.public_link``: (name, link)."""
  found = {}
  for namespace in (lars_optax, lars_optax.mxnet):
    for name in namespace.__all__:
      fn = getattr(namespace, name)
      if callable(fn) and inspect.unwrap(fn).__name__ == f"unchecked_{name}":
        found[name] = fn
  return found


LINKS = _public_links()


def test_every_link_of_the_package_is_found():
  assert len(LINKS) == 25, sorted(LINKS)


def test_no_function_takes_a_flag_to_check_itself():
  """#59 item 1: no rule takes ``checked``, and no branch asks whether to check."""
  offenders = []
  for path in sorted(PACKAGE.rglob("*.py")):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        flags = [a.arg for a in (*node.args.args, *node.args.kwonlyargs)
                 if a.arg in ("checked", "checks")
                 and (a.annotation is None or ast.unparse(a.annotation) == "bool")]
        if flags:
          offenders.append(f"{path.name}:{node.lineno} {node.name}")
      if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and (
          node.test.id in ("checked", "checks")):
        offenders.append(f"{path.name}:{node.lineno} if {node.test.id}")
  assert not offenders


@pytest.mark.parametrize("name", sorted(LINKS))
def test_a_link_has_its_rules_signature_and_name(name):
  link = LINKS[name]
  assert link.__name__ == link.__qualname__ == name
  rule = inspect.unwrap(link)
  assert inspect.signature(link) == inspect.signature(rule)
  assert link.__doc__ == rule.__doc__


@pytest.mark.parametrize("name", sorted(LINKS))
def test_each_argument_of_a_link_is_declared(name):
  """public_link refuses a rule with an undeclared argument when the module loads;
  here, every argument a link takes has one declaration, or one of its own."""
  for arg in inspect.signature(LINKS[name]).parameters:
    assert arg in _links.DECLARED or name in ("check_inputs", "add_langevin_noise"), arg


def test_an_undeclared_argument_is_refused_when_the_link_is_made():
  def unchecked_scale_twice(factor: float = 2.0) -> optax.GradientTransformation:
    return optax.scale(factor)

  with pytest.raises(TypeError, match=r"^scale_twice: arguments \['factor'\] are not declared"):
    _links.public_link(unchecked_scale_twice)


def test_a_rule_checks_nothing_and_its_link_checks_everything():
  """The rule builds what it is given; the link refuses it, by name, when built, and
  the trees at init and update."""
  from lars_optax import _transforms
  _transforms.unchecked_add_decayed_weights_per_leaf(-1.0)  # the rule trusts its caller
  with pytest.raises(ValueError, match=r"^weight_decay: must be >= 0"):
    lars_optax.add_decayed_weights_per_leaf(-1.0)
  link = lars_optax.add_decayed_weights_per_leaf(0.1)
  with pytest.raises(ValueError, match=r"^weight_decay: 1e\+06 is beyond the range of float16"):
    lars_optax.add_decayed_weights_per_leaf(1e6).init({"w": jnp.ones(2, jnp.float16)})
  state = link.init({"w": jnp.ones(2)})
  with pytest.raises(ValueError, match=r"^add_decayed_weights_per_leaf: gradients and params"):
    link.update({"v": jnp.ones(2)}, state, {"w": jnp.ones(2)})
  with pytest.raises(TypeError, match=r"^add_decayed_weights_per_leaf\(\) got an unexpected "
                     "keyword argument 'rate'"):
    lars_optax.add_decayed_weights_per_leaf(0.1, rate=2)


@pytest.mark.numeric
@pytest.mark.parametrize("make", [
    lambda: lars_optax.scale_by_lars_trust_ratio(),
    lambda: lars_optax.scale_by_lamb_trust_ratio(),
    lambda: lars_optax.scale_by_lamb_adam(),
    lambda: lars_optax.add_decayed_weights_per_leaf(1e-3),
], ids=["scale_by_lars_trust_ratio", "scale_by_lamb_trust_ratio", "scale_by_lamb_adam",
        "add_decayed_weights_per_leaf"])
def test_a_link_takes_optaxs_params_keyword(make):
  """optax calls update(updates, state, params=params) (its float64_test.py does); every
  link's update is one wrapper's (_links.checked_trees), which names it as optax does."""
  params = {"w": jnp.arange(1.0, 7.0).reshape(2, 3)}
  grads = {"w": jnp.full((2, 3), 0.5)}
  tx = make()
  by_keyword, _ = tx.update(grads, tx.init(params), params=params)
  positional, _ = tx.update(grads, tx.init(params), params)
  assert jnp.array_equal(by_keyword["w"], positional["w"])


def test_every_optimizer_takes_optaxs_params_keyword():
  import optimizers
  for o in optimizers.TABLE:
    names = list(inspect.signature(o.make().update).parameters)
    assert names[:3] == ["updates", "state", "params"], (o.name, names)


def test_a_relation_is_checked_after_each_argument():
  with pytest.raises(ValueError, match=r"^nesterov: Nesterov momentum needs dampening = 0"):
    lars_optax.mxnet_momentum(0.1, momentum=0.9, nesterov=True, dampening=0.1)
  with pytest.raises(ValueError, match=r"^dampening: must be in \[0, 1\)"):
    lars_optax.mxnet_momentum(0.1, momentum=0.9, nesterov=True, dampening=2.0)
  with pytest.raises(ValueError, match=r"^lower_bound: must be <= upper_bound"):
    lars_optax.scale_by_lamb_trust_ratio(lower_bound=2.0, upper_bound=1.0)


def test_an_argument_means_one_thing_in_every_link():
  """#59 item 2's drift: grad_scale was any finite number in lars_trust_ratio and > 0 in
  scale_by_lars_trust_ratio; both read the one declaration now."""
  w = jnp.ones(3)
  for call in (lambda: lars_optax.scale_by_lars_trust_ratio(grad_scale=-1.0),
               lambda: lars_optax.lars_trust_ratio(w, w, grad_scale=-1.0)):
    with pytest.raises(ValueError, match=r"^grad_scale: must be > 0, got -1"):
      call()


def test_every_optimizer_checks_its_arguments_by_their_declarations():
  """#59 item 2: the optimizers' arguments are declared in the same table as the links',
  the dense-exact sparse ones' too (their own, such as ``window``, beside them)."""
  import optimizers
  by_hand = sorted(o.name for o in optimizers.TABLE
                   if not getattr(o.fn, "checked_by_declaration", False))
  assert by_hand == []


def test_what_init_checks_comes_from_the_declarations():
  """#59 item 2: no constructor lists its constants, masks and multipliers for init; the
  declarations say which arguments init checks against the params, and in which dtype."""
  assert not {"hyperparams", "leaf_values"} & set(inspect.signature(assembly.finish).parameters)
  f16 = {"w": jnp.ones((2, 2), jnp.float16), "b": jnp.ones(2, jnp.float16)}
  # In the params' dtype, or in the master weights' with multi_precision.
  with pytest.raises(ValueError, match=r"^learning_rate: 100000 is beyond the range of "
                                       r"float16"):
    lars_optax.mxnet.adam(1e5).init(f16)
  lars_optax.mxnet.adam(1e5, multi_precision=True).init(f16)
  # A coefficient of the norms (declared computed) is used in float32; epsilon is not.
  lars_optax.lars(0.1, eta=1e5).init(f16)
  with pytest.raises(ValueError, match=r"^epsilon: 100000 is beyond the range of float16"):
    lars_optax.lars(0.1, epsilon=1e5).init(f16)
  # A name in a mask or in per-leaf values must match a leaf.
  with pytest.raises(ValueError, match=r"^wd_mult: .*'kernel'"):
    lars_optax.mxnet.sgd(0.1, wd=1e-4, wd_mult={"kernel": 0.0}).init(f16)
  with pytest.raises(ValueError, match=r"^skip: "):
    lars_optax.lamb(1e-3, skip=lars_optax.by_leaf_name("bias")).init(f16)
  # The dense-exact sparse optimizers' under their names.
  with pytest.raises(ValueError, match=r"^sparse.adamw: weight_decay: 100000 is beyond"):
    lars_optax.sparse.adamw(1e-6, weight_decay=1e5).init(f16)


def test_the_sparse_optimizers_arguments_are_declared_with_their_names():
  with pytest.raises(TypeError, match=r"^sparse.adam: mu_dtype: expected a dtype or None"):
    lars_optax.sparse.adam(1e-3, mu_dtype="half-ish")
  with pytest.raises(ValueError, match=r"^sparse.sgd: window: expected an int in \[1, 4096\]"):
    lars_optax.sparse.sgd(0.1, momentum=0.9, window=0)
  with pytest.raises(ValueError, match=r"^sparse.adam: eps_root must be 0"):
    lars_optax.sparse.adam(1e-3, eps_root=1e-8)


@pytest.mark.parametrize("call, message", [
    (lambda: lars_optax.mxnet.adam(beta1=1.0), r"^beta1: must be in \[0, 1\)"),
    (lambda: lars_optax.mxnet.rmsprop(epsilon=0.0), r"^epsilon: must be > 0"),
    (lambda: lars_optax.mxnet.ftml(0.0), r"^learning_rate: must be > 0"),
    (lambda: lars_optax.porting.timm_lamb(betas=(0.9,)), r"^betas: expected a pair"),
    (lambda: lars_optax.porting.keras_lamb(clipnorm=1.0, clipvalue=1.0),
     r"^clipnorm, clipvalue: Keras takes only one"),
    (lambda: lars_optax.tf_lars(0.1, skip_list=["b"], skip="flax"),
     r"^skip_list: give skip_list or skip, not both"),
    (lambda: lars_optax.lamb(lower_bound=2.0, upper_bound=1.0),
     r"^lower_bound: must be <= upper_bound"),
])
def test_an_optimizer_refuses_by_the_declaration_or_its_relations(call, message):
  with pytest.raises((TypeError, ValueError), match=message):
    call()
