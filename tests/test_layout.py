"""The package's layout: one home per rule, a namespace per origin, imports without circles.

The import graph is read from the source with ``ast``, without importing
anything. An import inside a function counts like one at module level: a
circle through a deferred import is still a circle, only one that shows up
later, on some call. :func:`test_no_deferred_imports_remain` checks that no
function imports from the package.

The layers, bottom up: the private helpers (``_utils``, ``_validation``,
``_row_wise``, ``_stacked``, and ``_links``: the arguments' declarations and the checks
they give) and ``_masks`` (with its public face ``masks``); the row-sparse
machinery (``lars_optax.sparse``'s modules); the core modules (links, wrappers and the library's own
optimizers); MXNet's registry (``lars_optax.mxnet``'s modules); the package
``__init__`` files, which only re-export. No arrow runs up.
"""

from __future__ import annotations

import ast
import re
import pathlib

import pytest

import lars_optax
from lars_optax import _row_wise


PACKAGE = pathlib.Path(lars_optax.__file__).parent


def _module_name(path: pathlib.Path) -> str:
  parts = ["lars_optax", *path.relative_to(PACKAGE).with_suffix("").parts]
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
PACKAGES = {_module_name(p) for p in PACKAGE.rglob("__init__.py")}
BOTTOM = {"lars_optax._utils", "lars_optax._validation", "lars_optax._row_wise",
          "lars_optax._stacked", "lars_optax._links", "lars_optax._masks", "lars_optax.masks"}


def _imports(tree: ast.Module, *, deferred_only: bool = False) -> list[tuple[ast.AST, bool]]:
  """Every import statement with whether it sits inside a function."""
  found: list[tuple[ast.AST, bool]] = []

  def visit(node: ast.AST, parents: list[ast.AST], in_function: bool) -> None:
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
  if base not in PACKAGES:
    return {base}
  # ``from lars_optax.sparse import _rows`` needs that submodule only (once its
  # package's __init__ has run); any other name needs the package's __init__.
  return {f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names}


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
  tree = ast.parse("import os\n\ndef f():\n  from lars_optax.sparse import _rows\n")
  targets = set().union(*[_targets(n, "lars_optax.x") for n, _ in _imports(tree)])
  assert targets == {"lars_optax.sparse._rows"}


def test_the_graph_sees_every_module():
  graph = import_graph()
  assert {"lars_optax", "lars_optax.sparse", "lars_optax.sparse._interpreter",
          "lars_optax.mxnet", "lars_optax.mxnet.registry", "lars_optax._trust_ratio",
          "lars_optax._row_wise"} <= set(graph)
  assert "lars_optax.sparse._rows" in graph["lars_optax.precision"]
  assert "lars_optax._transforms" in graph["lars_optax._mxnet_base"]


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


def test_sparse_imports_only_itself_and_the_bottom_helpers():
  graph = import_graph()
  for name in (m for m in graph if m.startswith("lars_optax.sparse")):
    outside = {t for t in graph[name] if not t.startswith("lars_optax.sparse")}
    assert outside <= BOTTOM, (name, outside - BOTTOM)


def test_no_arrow_runs_up():
  graph = import_graph()
  for name, targets in graph.items():
    if name == "lars_optax.demo":  # the demo is an application of the package
      continue
    # Only a package's own __init__ (or its parent's) imports a package __init__.
    for t in targets & PACKAGES:
      assert name in PACKAGES and (name == t.rsplit(".", 1)[0] or t.startswith(name + ".")), \
          (name, t)
    # The core never imports MXNet's registry (the porting constructors, a namespace
    # of origins beside it, may: torch's SparseAdam is MXNet's lazy Adam).
    if not name.startswith(("lars_optax.mxnet", "lars_optax.porting")) and name != "lars_optax":
      assert not {t for t in targets if t.startswith("lars_optax.mxnet")}, name
    # The bottom helpers import only each other.
    if name in BOTTOM:
      assert targets <= BOTTOM, (name, targets - BOTTOM)


def test_the_interpreter_on_jax_internals_is_alone_in_its_module():
  # Binding primitives by hand (get_bind_params, eqn.ctx: JAX internals) happens in one
  # module only; the row-wise check only reads jaxprs (jax.extend.core's types).
  users = [name for name, path in MODULES.items()
           if "get_bind_params" in path.read_text() or "eqn.ctx" in path.read_text()]
  assert users == ["lars_optax.sparse._interpreter"]


# --------------------------------------------------------------------------
# The row-wise protocol
# --------------------------------------------------------------------------


def test_states_declare_their_row_wise_buffers():
  known = _row_wise.row_wise_fields()
  assert known[lars_optax.MXNetMomentumState] == ("momentum",)
  assert known[lars_optax.MultiPrecisionState] == ("master",)


def test_row_wise_rejects_a_name_that_is_not_a_field():
  with pytest.raises(TypeError, match="row_wise: MXNetMomentumState has no field 'mu'"):
    _row_wise.row_wise("mu")(lars_optax.MXNetMomentumState)


# --------------------------------------------------------------------------
# One home per family
# --------------------------------------------------------------------------

HOMES = {
    "lars_optax._lars": ["lars", "tf_lars"],
    "lars_optax._lamb": ["lamb", "scale_by_lamb_adam"],
    "lars_optax._lans": ["lans", "scale_by_lans", "normalize_per_leaf", "ScaleByLansState"],
    "lars_optax._trust_ratio": ["scale_by_lars_trust_ratio", "lars_trust_ratio", "trust_ratios",
                               "scale_by_lamb_trust_ratio", "ScaleByLarsTrustRatioState"],
    "lars_optax.sign": ["signum", "signsgd"],
    "lars_optax._momentum": ["mxnet_momentum", "MXNetMomentumState", "dampened_trace",
                            "DampenedTraceState"],
    "lars_optax._transforms": ["scale_per_leaf", "add_decayed_weights_per_leaf", "check_inputs",
                              "PerLeafState"],
    "lars_optax.mxnet._adam_family": ["adam", "adamw", "adamax", "nadam", "adabelief", "ftml"],
    "lars_optax.mxnet._adam_links": ["scale_by_mxnet_adam", "scale_by_adam_moments",
                                    "scale_by_bias_correction", "scale_by_ftml"],
    "lars_optax.mxnet._sgd_family": ["sgd", "nag", "dcasgd", "sgld"],
    "lars_optax.mxnet._adagrad_family": ["adagrad", "groupadagrad", "rmsprop", "adadelta",
                                        "ftrl"],
    "lars_optax.sparse.optax_compat": ["clip_by_global_norm", "multi_steps", "apply_updates",
                                       "tree_add", "dense_updates"],
}


def _public(name: str):
  for namespace in (lars_optax, lars_optax.mxnet, lars_optax.sparse):
    if name in namespace.__all__:
      return getattr(namespace, name)
  raise AssertionError(f"{name} is not public")


@pytest.mark.parametrize("module, name", [(m, n) for m, names in HOMES.items() for n in names])
def test_each_rule_lives_in_its_familys_module(module, name):
  assert _public(name).__module__ == module


def test_the_mxnet_namespace_shares_the_library_own_optimizers():
  for name in ("lars", "lamb", "lans", "signum", "signsgd"):
    assert getattr(lars_optax.mxnet, name) is getattr(lars_optax, name)


def _code_lines(node: ast.FunctionDef | ast.AsyncFunctionDef, source: list[str]) -> int:
  """The lines of code of a function's body: no docstring, blank or comment-only lines."""
  body = node.body
  if (body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
      and isinstance(body[0].value.value, str)):
    body = body[1:]
  lines = {n for stmt in body for n in range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1)
           if source[n - 1].strip() and not source[n - 1].strip().startswith("#")}
  return len(lines)


def test_no_function_body_is_over_100_lines_of_code():
  long = []
  for name, path in MODULES.items():
    source = path.read_text()
    for node in ast.walk(ast.parse(source)):
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        n = _code_lines(node, source.splitlines())
        if n > 100:
          long.append(f"{name}.{node.name}: {n}")
  assert not long, long


# --------------------------------------------------------------------------
# The docs' module list
# --------------------------------------------------------------------------


def test_the_module_list_in_the_docs_is_the_code():
  """docs/development.md's "Layout" names every file of the package, under its
  package's bullet, and no file that is not there (#59 item 8)."""
  text = (PACKAGE.parent / "docs" / "development.md").read_text()
  layout = text[text.index("## Layout"):]
  block = layout[layout.index("\n- "):]
  block = block[:block.index("\n\n")]  # the list: its bullets, up to the first blank line
  listed = set()
  for bullet in block.split("\n- ")[1:]:
    folder = re.match(r"(?:the top level \()?`lars_optax/(\w+/)?`", bullet)
    prefix = folder.group(1) or "" if folder else ""  # the bottom helpers: the top level
    listed |= {prefix + name for name in re.findall(r"`(\w+\.py)`", bullet)}
  files = {str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")}
  assert sorted(files - listed) == [], "in the package, not in docs/development.md"
  assert sorted(listed - files) == [], "in docs/development.md, not in the package"


def test_no_library_file_is_over_800_lines():
  over = {str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
          if len(p.read_text().splitlines()) > 800}
  assert not over


def test_ci_holds_the_default_tier_to_its_budget():
  """As the line counts above: CI fails when the default tier's summed durations pass
  the stored figure (tests/conftest.py sums them; .ci/run asks for the check)."""
  import json

  import conftest
  root = pathlib.Path(__file__).parent.parent
  budget = json.loads((root / "tests" / "budget.json").read_text())
  assert isinstance(budget["default_tier_seconds"], int) and budget["default_tier_seconds"] > 0
  ci = (root / ".ci" / "run").read_text()
  assert "LARS_OPTAX_DURATION_BUDGET=1 python -m pytest -q\n" in ci
  assert str(root / "tests" / "budget.json") == conftest.BUDGET
