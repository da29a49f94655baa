"""The examples in the package's docstrings run and print what they show.

Every ``>>>`` example in a module of ``lars_optax`` or of its subpackages is run with the standard
library's ``doctest``, with nothing in scope but the module's own names (the
examples import what else they use). Code that is not meant to run (shell
commands in the demo's docstring) is a ``::`` literal block, not a ``>>>``
example.
"""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import lars_optax

# Every module, those of the subpackages (mxnet, sparse, porting) too.
MODULES = sorted(m.name for m in pkgutil.walk_packages(lars_optax.__path__, "lars_optax."))
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def _examples(name: str) -> list[doctest.DocTest]:
  module = importlib.import_module(name)
  return [t for t in doctest.DocTestFinder().find(module) if t.examples]


def test_docstring_examples_exist():
  assert sum(len(_examples(name)) for name in MODULES) >= 4


@pytest.mark.quick
@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name):
  runner = doctest.DocTestRunner(optionflags=FLAGS)
  for test in _examples(name):
    runner.run(test)
  result = runner.summarize(verbose=False)
  assert result.failed == 0, f"{result.failed} docstring example(s) of {name} failed (above)"
