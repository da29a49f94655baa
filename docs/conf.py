"""Sphinx configuration: the API reference is generated from the docstrings."""

import importlib.metadata
import pathlib
import re
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


# sphinx.ext.viewcode links a module's source back to the docs under the first
# name that documented the module: the public functions of lars_optax.masks are
# documented as lars_optax.by_suffix etc., so its helpers documented as
# lars_optax.masks.resolve_mask got links to lars_optax.resolve_mask, which does
# not exist. Point each such link at the name the API page does have.
def _fix_viewcode_backlinks(app, exception):
  if exception is not None or app.builder.format != "html":
    return
  out = pathlib.Path(app.outdir)
  api = (out / "api.html").read_text(encoding="utf-8")
  anchors = set(re.findall(r'id="(lars_optax[^"]*)"', api))
  for page in (out / "_modules").rglob("*.html"):
    module = ".".join(page.relative_to(out / "_modules").with_suffix("").parts)
    text = page.read_text(encoding="utf-8")

    def fix(m, module=module):
      name = m.group(2)
      if name in anchors or not name.startswith("lars_optax."):
        return m.group(0)
      qualified = module + "." + name[len("lars_optax."):]
      return m.group(1) + (qualified if qualified in anchors else name) + '"'

    fixed = re.sub(r'(href="[./]*api\.html#)([^"]+)"', fix, text)
    if fixed != text:
      page.write_text(fixed, encoding="utf-8")


def setup(app):
  app.connect("build-finished", _fix_viewcode_backlinks)
