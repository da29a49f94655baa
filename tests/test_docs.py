"""The API reference lists every public name, and every public name has a docstring."""

import inspect
import pathlib

import pytest

import lars_optax

API = (pathlib.Path(__file__).parent.parent / "docs" / "api.rst").read_text()
NAMES = list(lars_optax.__all__)


@pytest.mark.parametrize("name", NAMES)
def test_public_name_is_in_the_api_reference(name):
  assert f"lars_optax.{name}\n" in API or f"lars_optax.{name}\r\n" in API, (
      f"docs/api.rst does not document lars_optax.{name}")


@pytest.mark.parametrize("name", [n for n in NAMES if callable(getattr(lars_optax, n))
                                  and not isinstance(getattr(lars_optax, n), lars_optax.Mask)])
def test_public_callable_has_a_docstring(name):
  doc = inspect.getdoc(getattr(lars_optax, name)) or ""
  assert len(doc.splitlines()) >= 3, f"lars_optax.{name} needs a real docstring"
