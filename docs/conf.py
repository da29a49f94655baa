"""Sphinx configuration: the API reference is generated from the docstrings."""

import importlib.metadata

project = "lars_optax"
author = "lars_optax developers"
copyright = "lars_optax developers"
try:
  release = importlib.metadata.version("lars_optax")
except importlib.metadata.PackageNotFoundError:  # not installed: run from a clone (PYTHONPATH)
  import lars_optax
  release = lars_optax.__version__
version = release

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    # MathJax from the package (copied into _static/mathjax), not from a CDN:
    # the docs' math renders offline.
    "sphinx-mathjax-offline",
    "sphinx.ext.viewcode",
    "myst_parser",
]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
exclude_patterns = ["_build"]

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options: dict[str, bool] = {}
napoleon_use_ivar = True  # "Attributes:" as fields, not as separate entries
napoleon_google_docstring = True
napoleon_numpy_docstring = False
myst_heading_anchors = 3

html_theme = "alabaster"
html_static_path: list[str] = []
