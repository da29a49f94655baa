"""The face of the package: namespaces by origin, optax's names kept to optax's rules,
keyword-only arguments after the first, and hints for optax's keywords."""

from __future__ import annotations

import importlib
import inspect
import pathlib
import pkgutil
import re
import types
import warnings

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lars_optax


NAMESPACES = (lars_optax, lars_optax.mxnet, lars_optax.sparse, lars_optax.svrg,
              lars_optax.porting)


def _public_functions():
  """(qualified name, function) for every public function of the namespaces."""
  seen, out = set(), []
  for ns in NAMESPACES:
    for name in ns.__all__:
      obj = getattr(ns, name)
      if inspect.isfunction(obj) and id(obj) not in seen:
        seen.add(id(obj))
        out.append((f"{ns.__name__}.{name}", obj))
  return out


# --------------------------------------------------------------------------
# The public surface: the API reference, and no shadowed module
# --------------------------------------------------------------------------

API_REFERENCE = pathlib.Path(__file__).parent.parent / "docs" / "api.rst"


def _public_modules() -> list[types.ModuleType]:
  """Every module of the package whose dotted name has no part starting with ``_``."""
  found = [lars_optax]
  for info in pkgutil.walk_packages(lars_optax.__path__, "lars_optax."):
    if not any(part.startswith("_") for part in info.name.split(".")):
      found.append(importlib.import_module(info.name))
  return found


def _resolve(path: str):
  parts = path.split(".")
  obj = importlib.import_module(parts[0])
  for part in parts[1:]:
    obj = getattr(obj, part)
  return obj


def test_the_api_reference_lists_every_public_name_and_only_those():
  """#52 item 6: a name in a public module's ``__all__`` is documented (under some public
  path), and every documented name is in some ``__all__``: the two are equal."""
  public: dict[int, str] = {}
  for module in _public_modules():
    for name in getattr(module, "__all__", ()):
      obj = getattr(module, name)
      if not isinstance(obj, types.ModuleType):
        public.setdefault(id(obj), f"{module.__name__}.{name}")
  paths = re.findall(r"^\.\. auto(?:function|class|data):: (\S+)", API_REFERENCE.read_text(),
                     re.MULTILINE)
  documented = {id(_resolve(p)): p for p in paths}
  assert sorted(public[k] for k in public.keys() - documented.keys()) == []
  assert sorted(documented[k] for k in documented.keys() - public.keys()) == []


def test_no_public_module_is_shadowed_by_a_function_of_its_name():
  """``lars_optax.lamb`` is the function; no public module is named ``lamb``."""
  for module in _public_modules()[1:]:
    parent, _, short = module.__name__.rpartition(".")
    assert getattr(importlib.import_module(parent), short) is module, module.__name__


# --------------------------------------------------------------------------
# Names shared with optax
# --------------------------------------------------------------------------

# The top-level names that optax also has, and what each is checked against.
SHARED_WITH_OPTAX = {"lars", "lamb", "signum"}


def test_the_top_level_has_at_most_50_names():
  assert len(lars_optax.__all__) <= 50
  assert len(set(lars_optax.__all__)) == len(lars_optax.__all__)


def test_the_top_level_shares_only_the_listed_names_with_optax():
  shared = {n for n in lars_optax.__all__ if hasattr(optax, n)}
  assert shared == SHARED_WITH_OPTAX


def test_lars_docstring_says_first_how_it_differs_from_optax_lars():
  first = inspect.getdoc(lars_optax.lars).splitlines()[0]
  assert first.startswith("MXNet's LARS, not :func:`optax.lars`: ")


def _three_steps(tx, grads_scale):
  params = {"w": jnp.linspace(-1.0, 1.0, 12).reshape(3, 4), "b": jnp.full((4,), 0.3)}
  key = jax.random.key(0)
  state = tx.init(params)
  for i in range(3):
    g = jax.tree.map(
        lambda p, i=i: grads_scale * jax.random.normal(jax.random.fold_in(key, i), p.shape),
        params)
    updates, state = tx.update(g, state, params)
    params = optax.apply_updates(params, updates)
  return params


@pytest.mark.numeric
@pytest.mark.parametrize("name", sorted(SHARED_WITH_OPTAX - {"lars"}))
@pytest.mark.parametrize("grads_scale", [0.3, 1e-6])
def test_a_shared_name_follows_optax_rule_with_optax_defaults(name, grads_scale):
  # Each library's defaults, one learning rate, ordinary and tiny gradients: the
  # weights move as optax's, to float32 noise relative to how far they moved.
  ours = _three_steps(getattr(lars_optax, name)(1e-3), grads_scale)
  theirs = _three_steps(getattr(optax, name)(1e-3), grads_scale)
  start = _three_steps(optax.scale(0.0), grads_scale)
  moved = max(float(jnp.max(jnp.abs(t - s))) for t, s in
              zip(jax.tree.leaves(theirs), jax.tree.leaves(start)))
  assert moved > 1e-4
  chex.assert_trees_all_close(ours, theirs, atol=1e-5 * moved, rtol=0)


def test_the_mxnet_rules_that_share_optax_names_live_in_the_mxnet_namespace():
  for name in ("adam", "adamw", "adagrad", "adadelta", "adamax", "adabelief", "nadam",
               "rmsprop", "sgd"):
    assert name not in lars_optax.__all__
    assert name in lars_optax.mxnet.__all__
  for name in ("clip_by_global_norm", "multi_steps", "apply_updates", "MultiStepsState"):
    assert name not in lars_optax.__all__
    assert name in lars_optax.sparse.__all__


def test_sparse_multi_steps_state_has_optax_fields():
  assert set(optax.MultiStepsState._fields) <= set(lars_optax.sparse.MultiStepsState._fields)


# --------------------------------------------------------------------------
# Keyword-only after the first argument
# --------------------------------------------------------------------------

# Functions whose later positional arguments are data, in the order of the JAX or
# optax function they mirror, not hyperparameters.
POSITIONAL_DATA = {
    "lars_optax.sparse.apply_updates": "optax.apply_updates(params, updates)",
    "lars_optax.sparse.psum": "jax.lax.psum(x, axis_name)",
    "lars_optax.trust_ratios": "(state, params), as optax's tree utilities",
    "lars_optax.master_params": "(state, params), as trust_ratios",
    "lars_optax.svrg.refresh": "(state, params, full_grad): three trees",
    "lars_optax.sparse.catch_up": "(tx, params, state), as the optimizer it catches up",
    "lars_optax.svrg.full_gradient": "(loss_fn, params, data), as jax.grad's call",
    "lars_optax.lars_trust_ratio": "(param, grad): the two arrays it is the ratio of",
}


@pytest.mark.parametrize("qualname, fn", _public_functions(),
                         ids=lambda x: getattr(x, "__name__", x))
def test_every_argument_after_the_first_is_keyword_only(qualname, fn):
  params = list(inspect.signature(fn).parameters.values())
  positional = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
  if qualname in POSITIONAL_DATA:
    return
  assert len(positional) <= 1, f"{qualname}: {positional[1:]} should be keyword-only"


def test_from_optax_page_names_every_function_with_positional_data():
  """docs/from_optax.md says which functions keep data arguments positional (it said none)."""
  import pathlib

  page = (pathlib.Path(__file__).parent.parent / "docs" / "from_optax.md").read_text()
  for qualname in POSITIONAL_DATA:
    short = qualname.removeprefix("lars_optax.")
    assert f"`{short}(" in page, short


def test_a_positional_slip_in_optax_order_is_a_type_error():
  with pytest.raises(TypeError):
    lars_optax.lars(0.1, 1e-4)  # optax.lars's second argument is the weight decay
  with pytest.raises(TypeError):
    lars_optax.lamb(1e-3, 0.9, 0.999, 1e-6, 0.0)  # optax.lamb's fifth is eps_root
  with pytest.raises(TypeError):
    lars_optax.scale_by_lamb_adam(0.9, 0.999)


# --------------------------------------------------------------------------
# Hints for optax's keywords
# --------------------------------------------------------------------------

# (optax.signum is newer than our optax floor: left out where optax lacks it.)
OPTAX_PEERS = {name: (ours, getattr(optax, theirs)) for name, (ours, theirs) in {
    "lars": (lars_optax.lars, "lars"),
    "lamb": (lars_optax.lamb, "lamb"),
    "signum": (lars_optax.signum, "signum"),
    "mxnet.adam": (lars_optax.mxnet.adam, "adam"),
    "mxnet.adamw": (lars_optax.mxnet.adamw, "adamw"),
    "tf_lars": (lars_optax.tf_lars, "lars"),
    "lans": (lars_optax.lans, "lamb"),
    "signsgd": (lars_optax.signsgd, "signum"),
}.items() if hasattr(optax, theirs)}
# What an equivalent keyword is expected to be (the first one ours takes).
EQUIVALENT = {"b1": {"beta1", "momentum"}, "b2": {"beta2"}, "eps": {"epsilon"},
              "weight_decay": {"wd"}, "trust_coefficient": {"eta", "eeta"},
              "beta": {"momentum"}, "weight_decay_mask": {"wd_skip", "skip_list", "wd_mult"},
              "mask": {"wd_skip", "skip_list", "wd_mult"},
              "trust_ratio_mask": {"skip", "skip_list"}}


def _cases():
  for name, (ours, theirs) in OPTAX_PEERS.items():
    taken = set(inspect.signature(ours).parameters)
    for kw in inspect.signature(theirs).parameters:
      if kw not in taken:
        yield name, ours, kw


@pytest.mark.parametrize("name, ours, keyword", list(_cases()),
                         ids=[f"{n}-{k}" for n, _, k in _cases()])
def test_an_optax_keyword_we_do_not_take_names_its_equivalent(name, ours, keyword):
  with pytest.raises(TypeError, match=rf"^{keyword}: ") as info:
    ours(learning_rate=0.1, **{keyword: 0.5})
  message = str(info.value)
  assert "unexpected keyword" not in message
  named = {e for e in EQUIVALENT.get(keyword, ()) if f" {e}=" in message}
  assert named or "no equivalent here" in message, message
  if named & {"wd_skip", "skip"}:
    assert "the reverse of optax's mask" in message


def _hinted_functions():
  """Public functions that build a transformation (constructors and links), but
  timm_optimizer and mxnet.create, whose other keywords go to the optimizer they name
  (which names a wrong one itself)."""
  by_name = ("lars_optax.porting.timm_optimizer", "lars_optax.mxnet.create")
  for qualname, fn in _public_functions():
    ret = str(inspect.signature(fn).return_annotation)
    if "GradientTransformation" in ret and qualname not in by_name:
      yield qualname, fn


@pytest.mark.parametrize("qualname, fn", list(_hinted_functions()),
                         ids=lambda x: getattr(x, "__name__", x))
def test_every_constructor_and_link_hints_optax_keywords(qualname, fn):
  """The README promises the hint from every function: an optax keyword a function does
  not take is a TypeError that starts with it, never Python's 'unexpected keyword'."""
  taken = set(inspect.signature(fn).parameters)
  for keyword in ("b1", "eps", "weight_decay", "trust_coefficient", "mask", "learning_rate"):
    if keyword in taken:
      continue
    with pytest.raises(TypeError, match=rf"^{keyword}: ") as info:
      fn(**{keyword: 0.5})
    assert "unexpected keyword" not in str(info.value), qualname


def test_a_peer_keyword_hint_names_the_peer_argument():
  with pytest.raises(TypeError, match=r"^b1: keras_lamb\(\) has no argument 'b1'; it takes "
                     r"beta_1= where optax takes b1="):
    lars_optax.porting.keras_lamb(b1=0.9)
  with pytest.raises(TypeError, match=r"^weight_decay: albert_lamb\(\) .*it takes "
                     r"weight_decay_rate="):
    lars_optax.porting.albert_lamb(weight_decay=0.01)
  with pytest.raises(TypeError, match=r"^trust_coefficient: timm_lars\(\) .*it takes "
                     r"trust_coeff="):
    lars_optax.porting.timm_lars(trust_coefficient=0.001)
  with pytest.raises(TypeError, match=r"^mask: keras_lamb\(\) .*it takes "
                     r"exclude_from_weight_decay=.*reverse of optax's mask"):
    lars_optax.porting.keras_lamb(mask={"w": True})


def test_a_mask_hint_states_the_polarity():
  with pytest.raises(TypeError, match=r"^mask: lamb\(\) has no argument 'mask'; it takes "
                                      r"wd_skip= .*True = exempt.*reverse of optax's mask"):
    lars_optax.lamb(1e-3, mask=lambda p: p)


@pytest.mark.parametrize("make", [
    lambda m: lars_optax.lamb(1e-3, wd=0.01, wd_skip=m),
    lambda m: lars_optax.lars(0.1, momentum=0.9, wd=1e-4, skip="flax", wd_skip=m),
    lambda m: lars_optax.lars(0.1, momentum=0.9, skip=m),
    lambda m: lars_optax.lans(1e-3, wd=0.01, wd_skip=m),
], ids=["lamb_wd_skip", "lars_wd_skip", "lars_skip", "lans_wd_skip"])
def test_an_optax_mask_passed_as_an_exemption_warns_at_init(make):
  """#52 item 2: optax's masks mark the leaves that get decay, ours the leaves left
  out. An optax mask passed as it is (every weight exempt, no bias or norm scale)
  warns at init, naming the argument; its inverse does not."""
  params = {"dense": {"kernel": jnp.ones((4, 3)), "bias": jnp.ones(3)},
            "norm": {"scale": jnp.ones(3)}, "out": {"kernel": jnp.ones((3, 2))}}
  optax_mask = jax.tree.map(lambda p: p.ndim > 1, params)  # optax's: True = decay
  with pytest.warns(UserWarning, match=r"^(wd_skip|skip): exempts every weight .* an optax "
                                       r"mask passed as it is"):
    make(optax_mask).init(params)
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    make(jax.tree.map(lambda m: not m, optax_mask)).init(params)
    make(lars_optax.by_ndim(1)).init(params)


def test_the_hints_take_numpy_and_jax_values_too():
  for value in (np.float32(0.9), jnp.float32(0.9), jnp.bfloat16(0.9)):
    with pytest.raises(TypeError, match=r"^b1: .* beta1="):
      lars_optax.lamb(1e-3, b1=value)


def test_namespaces_are_modules():
  for ns in NAMESPACES:
    assert isinstance(ns, types.ModuleType)


# --------------------------------------------------------------------------
# docs/from_optax.md's table of the MXNet rules under optax's names
# --------------------------------------------------------------------------


def _from_optax_table():
  import pathlib
  page = (pathlib.Path(__file__).parent.parent / "docs" / "from_optax.md").read_text()
  out = {}
  for line in page.splitlines():
    cells = [c.strip() for c in line.strip().split("|")[1:-1]]
    if len(cells) == 4 and cells[0].startswith("`") and cells[1][:1].isdigit():
      out[cells[0].strip("`")] = (float(cells[1]), float(cells[2]))
  return out


def _moved_apart(name, grads_scale):
  ours = _three_steps(getattr(lars_optax.mxnet, name)(1e-3), grads_scale)
  theirs = _three_steps(getattr(optax, name)(1e-3), grads_scale)
  start = _three_steps(optax.scale(0.0), grads_scale)
  moved = max(max(float(jnp.max(jnp.abs(a - s))) for a, s in
                  zip(jax.tree.leaves(tree), jax.tree.leaves(start))) for tree in (ours, theirs))
  diff = max(float(jnp.max(jnp.abs(a - b))) for a, b in
             zip(jax.tree.leaves(ours), jax.tree.leaves(theirs)))
  return diff / moved


@pytest.mark.numeric
@pytest.mark.parametrize("name", ["adam", "adamw", "adagrad", "adabelief", "nadam", "rmsprop"])
def test_from_optax_page_states_how_far_each_mxnet_namesake_is_from_optax(name):
  listed = _from_optax_table()[name]
  for scale, value in zip((0.3, 1e-6), listed):
    measured = _moved_apart(name, scale)
    assert 0.5 <= value / measured <= 2.0, (name, scale, value, measured)


@pytest.mark.numeric
@pytest.mark.parametrize("name", ["sgd", "adamax", "adadelta"])
def test_the_other_mxnet_namesakes_agree_with_optax_at_the_defaults(name):
  assert _moved_apart(name, 0.3) < 1e-4
