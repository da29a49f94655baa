"""Sphinx configuration: the API reference is generated from the docstrings."""

import importlib.metadata
import pathlib
import shutil

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
    # Markdown pages and the notebooks (myst-nb includes myst-parser).
    "myst_nb",
]
exclude_patterns = ["_build"]

# The notebooks are rendered from the outputs stored in them, never run here
# (notebooks/store_outputs.py stores them; tests/test_notebooks.py runs them).
# They are copied next to the pages, since Sphinx reads only this directory.
nb_execution_mode = "off"
_NOTEBOOKS = pathlib.Path(__file__).resolve().parent.parent / "notebooks"
_COPY = pathlib.Path(__file__).resolve().parent / "notebooks"
_COPY.mkdir(exist_ok=True)
for _nb in sorted(_NOTEBOOKS.glob("*.ipynb")):
  shutil.copyfile(_nb, _COPY / _nb.name)

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options: dict[str, bool] = {}
napoleon_use_ivar = True  # "Attributes:" as fields, not as separate entries
napoleon_google_docstring = True
napoleon_numpy_docstring = False
myst_heading_anchors = 3

html_theme = "alabaster"
html_static_path: list[str] = []
