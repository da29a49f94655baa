"""Every notebook in ``notebooks/`` runs top to bottom in a Jupyter kernel.

Each is executed with ``nbclient`` in a fresh ``python3`` kernel (so a
notebook's own device setup, e.g. 8 virtual CPU devices, takes effect), in a
temporary directory. Outputs must be stripped in git.
"""

import json
import pathlib

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = sorted((pathlib.Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks():
  assert {p.stem for p in NOTEBOOKS} >= {
      "quickstart", "lars_vs_sgd", "porting_from_mxnet_and_tensorflow", "distributed", "svrg"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_outputs_are_stripped(path):
  nb = json.loads(path.read_text())
  for cell in nb["cells"]:
    if cell["cell_type"] == "code":
      assert not cell.get("outputs") and cell.get("execution_count") is None, path.name


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path, tmp_path):
  nb = nbformat.read(path, as_version=4)
  client = NotebookClient(nb, timeout=600, kernel_name="python3",
                          resources={"metadata": {"path": str(tmp_path)}})
  client.execute()  # raises CellExecutionError, with the cell and traceback, on failure
