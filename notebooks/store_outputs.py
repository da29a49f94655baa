"""Run notebooks top to bottom and store their outputs, for the docs.

The docs render the notebooks from these stored outputs without running them
(``nb_execution_mode = "off"`` in ``docs/conf.py``), and
``tests/test_notebooks.py`` checks that every code cell has run, in order, and
that no output shows a local path. Run it after changing a notebook or the
code a notebook shows::

  python notebooks/store_outputs.py                      # every notebook
  python notebooks/store_outputs.py quickstart svrg      # some of them

Each notebook runs in a fresh ``python3`` kernel in a temporary directory, as
in the tests. Paths in the outputs (a warning's file name, say) are shortened
to the part after ``site-packages/`` or after the repository root.
"""

from __future__ import annotations

import argparse
import pathlib
import re
import tempfile
import time

import nbformat
from nbclient import NotebookClient

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent


def _scrub(text: str) -> str:
  text = re.sub(r"(?:[A-Za-z]:)?[^\s\"'()]*site-packages/", "", text)
  text = text.replace(str(ROOT) + "/", "")
  return re.sub(r"/(?:tmp|var/folders)/[^\s\"'()]*/", "", text)


def _scrub_cell(cell: nbformat.NotebookNode) -> None:
  for out in cell.get("outputs", []):
    if "text" in out:
      out["text"] = _scrub(out["text"])
    for mime, data in out.get("data", {}).items():
      if mime.startswith("text/") and isinstance(data, str):
        out["data"][mime] = _scrub(data)
    out.get("metadata", {}).pop("execution", None)
  cell.get("metadata", {}).pop("execution", None)


def store(path: pathlib.Path, timeout: int = 600) -> float:
  """Runs ``path`` top to bottom and writes it back with its outputs; returns seconds."""
  nb = nbformat.read(path, as_version=4)
  start = time.perf_counter()
  with tempfile.TemporaryDirectory() as tmp:
    NotebookClient(nb, timeout=timeout, kernel_name="python3",
                   resources={"metadata": {"path": tmp}}).execute()
  for cell in nb.cells:
    if cell.cell_type == "code":
      _scrub_cell(cell)
  nb.metadata.pop("widgets", None)
  nbformat.write(nb, path)
  return time.perf_counter() - start


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("names", nargs="*", help="notebook names without .ipynb (default: all)")
  args = parser.parse_args()
  paths = ([HERE / f"{n.removesuffix('.ipynb')}.ipynb" for n in args.names]
           or sorted(HERE.glob("*.ipynb")))
  for path in paths:
    print(f"{path.name}: {store(path):.0f} s", flush=True)


if __name__ == "__main__":
  main()
