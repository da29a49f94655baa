"""The package's layout: one home per optimizer family, imports without circles, old paths.

The import graph is read from the source with ``ast``, without importing
anything. An import inside a function counts like one at module level: a
circle through a deferred import is still a circle, only one that shows up
later, on some call. The one exception is a module-level ``__getattr__``
(PEP 562), which the backwards-compatible modules use to re-export names that
moved to a module above them; it runs only when an old path is used, after
the package has been imported whole. :func:`test_no_deferred_imports_remain`
checks that no other function imports from the package.
"""

from __future__ import annotations

import ast
import importlib
import pathlib

import pytest

import lars_optax
from lars_optax import _row_wise, sparse

PACKAGE = pathlib.Path(lars_optax.__file__).parent
MODULES = {("lars_optax" if p.stem == "__init__" else f"lars_optax.{p.stem}"): p
           for p in sorted(PACKAGE.glob("*.py"))}


def _is_old_path_getattr(node: ast.AST, parents: list[ast.AST]) -> bool:
  # A module-level PEP 562 __getattr__: the re-exports of names that moved.
  return (isinstance(node, ast.FunctionDef) and node.name == "__getattr__"
          and len(parents) == 1 and isinstance(parents[0], ast.Module))


def _imports(tree: ast.Module, *, deferred_only: bool = False) -> list[tuple[ast.AST, bool]]:
  """Every import statement with whether it sits inside a function, minus ``__getattr__``'s."""
  found: list[tuple[ast.AST, bool]] = []

  def visit(node: ast.AST, parents: list[ast.AST], in_function: bool) -> None:
    if _is_old_path_getattr(node, parents):
      return
    if isinstance(node, (ast.Import, ast.ImportFrom)) and (in_function or not deferred_only):
      found.append((node, in_function))
    in_function = in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                   ast.Lambda))
    for child in ast.iter_child_nodes(node):
      visit(child, [*parents, node], in_function)

  visit(tree, [], False)
  return found


def _targets(node: ast.AST, importer: str) -> set[str]:
  """The package's modules that an import statement needs."""
  if isinstance(node, ast.Import):
    return {a.name for a in node.names if a.name.split(".")[0] == "lars_optax"}
  assert isinstance(node, ast.ImportFrom)
  if node.level:  # relative: from the importer's package
    base = "lars_optax" + (f".{node.module}" if node.module else "")
  else:
    base = node.module or ""
  if base.split(".")[0] != "lars_optax":
    return set()
  if base != "lars_optax":
    return {base}
  # ``from lars_optax import masks`` needs the submodule only; any other name
  # needs the package's __init__ to have run.
  return {f"lars_optax.{a.name}" if f"lars_optax.{a.name}" in MODULES else "lars_optax"
          for a in node.names}


def import_graph() -> dict[str, set[str]]:
  graph = {}
  for name, path in MODULES.items():
    tree = ast.parse(path.read_text(), filename=str(path))
    graph[name] = set().union(*[_targets(n, name) for n, _ in _imports(tree)]) - {name}
  return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
  """One circle of the graph as ``[a, b, ..., a]``, or None."""
  state: dict[str, int] = {}  # 1: on the current path, 2: done
  path: list[str] = []

  def visit(node: str) -> list[str] | None:
    state[node] = 1
    path.append(node)
    for nxt in sorted(graph.get(node, ())):
      if state.get(nxt) == 1:
        return [*path[path.index(nxt):], nxt]
      if nxt not in state and (found := visit(nxt)):
        return found
    path.pop()
    state[node] = 2
    return None

  for node in sorted(graph):
    if node not in state and (found := visit(node)):
      return found
  return None


# --------------------------------------------------------------------------
# No import circles
# --------------------------------------------------------------------------


def test_find_cycle_finds_the_circle_sparse_used_to_close():
  graph = {"precision": {"sparse"}, "sparse": {"transforms", "precision"},
           "transforms": {"sparse"}}
  assert find_cycle(graph) == ["precision", "sparse", "precision"]
  assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_deferred_imports_are_in_the_graph():
  tree = ast.parse("import os\n\ndef f():\n  from lars_optax import sparse\n\n"
                   "def __getattr__(name):\n  from lars_optax import layerwise\n")
  targets = set().union(*[_targets(n, "lars_optax.x") for n, _ in _imports(tree)])
  assert targets == {"lars_optax.sparse"}  # __getattr__'s re-export is left out


def test_the_graph_sees_every_module():
  graph = import_graph()
  assert {"lars_optax", "lars_optax.sparse", "lars_optax.layerwise",
          "lars_optax._row_wise"} <= set(graph)
  assert "lars_optax.sparse" in graph["lars_optax.precision"]
  assert "lars_optax.transforms" in graph["lars_optax._mxnet_base"]


def test_the_package_imports_have_no_circle():
  cycle = find_cycle(import_graph())
  assert cycle is None, "import circle: " + " -> ".join(cycle or [])


def test_no_deferred_imports_remain():
  deferred = []
  for name, path in MODULES.items():
    tree = ast.parse(path.read_text(), filename=str(path))
    deferred += [f"{name}:{n.lineno}" for n, _ in _imports(tree, deferred_only=True)
                 if _targets(n, name)]
  assert not deferred, f"imports from the package inside functions: {deferred}"


def test_sparse_imports_no_module_that_defines_a_state():
  assert import_graph()["lars_optax.sparse"] <= {"lars_optax._row_wise", "lars_optax._utils",
                                                 "lars_optax.masks", "lars_optax._validation"}


# --------------------------------------------------------------------------
# The row-wise protocol
# --------------------------------------------------------------------------


def test_states_declare_their_row_wise_buffers():
  known = sparse._row_buffer_fields()
  assert known[lars_optax.MXNetMomentumState] == ("momentum",)
  assert known[lars_optax.MultiPrecisionState] == ("master",)


def test_row_wise_rejects_a_name_that_is_not_a_field():
  with pytest.raises(TypeError, match="row_wise: MXNetMomentumState has no field 'mu'"):
    _row_wise.row_wise("mu")(lars_optax.MXNetMomentumState)


# --------------------------------------------------------------------------
# One home per family
# --------------------------------------------------------------------------

HOMES = {
    "lars_optax.layerwise": ["lars", "tf_lars", "lamb", "lans", "scale_by_lars_trust_ratio",
                             "lars_trust_ratio", "trust_ratios", "scale_by_lamb_trust_ratio",
                             "scale_by_lans", "scale_by_lamb_adam", "normalize_per_leaf"],
    "lars_optax.sign": ["signum", "signsgd"],
    "lars_optax.adam_family": ["adam", "scale_by_mxnet_adam", "adamw", "adamax", "nadam",
                               "adabelief", "ftml", "scale_by_adam_moments"],
    "lars_optax.sgd_family": ["sgd", "nag", "mxnet_momentum", "MXNetMomentumState", "dcasgd",
                              "sgld"],
    "lars_optax.adagrad_family": ["adagrad", "groupadagrad", "rmsprop", "adadelta", "ftrl"],
    "lars_optax.transforms": ["scale_per_leaf", "add_decayed_weights_per_leaf", "check_inputs",
                              "PerLeafState"],
}


@pytest.mark.parametrize("module, name", [(m, n) for m, names in HOMES.items() for n in names])
def test_each_rule_lives_in_its_familys_module(module, name):
  assert getattr(lars_optax, name).__module__ == module


def test_optimizers_module_defines_nothing():
  tree = ast.parse(MODULES["lars_optax.optimizers"].read_text())
  defined = [n.name for n in tree.body
             if isinstance(n, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))]
  assert defined == []


# --------------------------------------------------------------------------
# Old import paths of the names that moved
# --------------------------------------------------------------------------

OLD_PATHS = {
    "lars_optax.optimizers": ["lars", "tf_lars", "lamb", "lans", "signum", "signsgd", "adam",
                              "sgd"],
    "lars_optax.transforms": [
        "mxnet_momentum", "MXNetMomentumState", "scale_by_mxnet_adam",
        "scale_by_lars_trust_ratio", "ScaleByLarsTrustRatioState", "lars_trust_ratio",
        "trust_ratios", "scale_by_lamb_trust_ratio", "ScaleByLambTrustRatioState",
        "scale_by_lans", "ScaleByLansState", "normalize_per_leaf", "NormalizePerLeafState",
        "scale_by_lamb_adam",
        # never moved
        "scale_per_leaf", "add_decayed_weights_per_leaf", "check_inputs", "PerLeafState",
        "LowPrecisionWarning",
    ],
}


@pytest.mark.parametrize("module, name", [(m, n) for m, names in OLD_PATHS.items()
                                          for n in names])
def test_old_import_path_still_works(module, name):
  namespace: dict = {}
  exec(f"from {module} import {name}", namespace)
  assert namespace[name] is getattr(lars_optax, name)
  assert getattr(importlib.import_module(module), name) is getattr(lars_optax, name)


@pytest.mark.parametrize("module", list(OLD_PATHS))
def test_old_modules_star_import_what_they_did(module):
  namespace: dict = {}
  exec(f"from {module} import *", namespace)
  assert set(OLD_PATHS[module]) <= set(namespace)
  assert set(OLD_PATHS[module]) <= set(dir(importlib.import_module(module)))


def test_old_module_names_a_missing_attribute():
  with pytest.raises(AttributeError, match=r"'lars_optax\.transforms' has no attribute 'nope'"):
    importlib.import_module("lars_optax.transforms").nope  # noqa: B018
