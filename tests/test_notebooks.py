"""Every notebook in ``notebooks/`` runs top to bottom in a Jupyter kernel.

Each is executed with ``nbclient`` in a fresh ``python3`` kernel (so a
notebook's own device setup, e.g. 8 virtual CPU devices, takes effect), in a
temporary directory. Every notebook is stored with its outputs, for the docs
(``notebooks/store_outputs.py``): each code cell has run, in order, without an
error, and no output shows a local path. Every notebook starts with the same
install cell (:data:`INSTALL_CELL`).
"""

import json
import pathlib
import re

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = pathlib.Path(__file__).parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))

# The first code cell of every notebook. lars_optax is on no package index, so
# the cell installs a wheel uploaded next to the notebook (Colab) and otherwise
# says how to get one; it does nothing where lars_optax is installed.
INSTALL_CELL = """\
# Install lars_optax when it is missing (e.g. on Colab). It is not on a package
# index: build a wheel in a clone (python -m build), upload it next to this
# notebook, or run the notebook from a clone after pip install ".[notebooks]".
import importlib.util
import pathlib
import subprocess
import sys

if importlib.util.find_spec("lars_optax") is None:
  wheels = sorted(pathlib.Path(".").glob("lars_optax-*.whl"))
  if not wheels:
    raise RuntimeError("lars_optax is not installed: upload lars_optax-0.1.0-py3-none-any.whl "
                       "(built by python -m build in a clone) next to this notebook, "
                       'or pip install ".[notebooks]" in a clone.')
  subprocess.check_call([sys.executable, "-m", "pip", "install", "-q", f"{wheels[-1]}[demo]"])"""


def test_there_are_notebooks():
  assert {p.stem for p in NOTEBOOKS} >= {
      "quickstart", "lars_vs_sgd", "porting_from_mxnet_and_tensorflow", "distributed", "svrg"}


_LOCAL_PATH = re.compile(r"site-packages|/home/|/Users/|/tmp/|[A-Z]:\\\\")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_outputs_are_stored_in_order_without_errors_or_local_paths(path):
  nb = json.loads(path.read_text())
  code = [cell for cell in nb["cells"] if cell["cell_type"] == "code"]
  assert [cell.get("execution_count") for cell in code] == list(range(1, len(code) + 1)), (
      f"{path.name}: run notebooks/store_outputs.py {path.stem} to store its outputs")
  for cell in code:
    for out in cell["outputs"]:
      assert out["output_type"] != "error", path.name
      texts = [out.get("text", "")] + [v for k, v in out.get("data", {}).items()
                                       if k.startswith("text/")]
      for text in texts:
        text = "".join(text) if isinstance(text, list) else text
        assert not _LOCAL_PATH.search(text) and str(ROOT) not in text, (
            f"{path.name}: a local path in an output: {text!r}")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_first_code_cell_is_the_install_cell(path):
  nb = nbformat.read(path, as_version=4)
  first = next(cell for cell in nb.cells if cell.cell_type == "code")
  assert first.source == INSTALL_CELL, (
      f"{path.name}: the first code cell must be tests/test_notebooks.py's INSTALL_CELL")


def test_install_cell_names_the_packages_wheel():
  version = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M)
  assert version is not None
  assert f"lars_optax-{version.group(1)}-py3-none-any.whl" in INSTALL_CELL
  assert "pip\", \"install\", \"-q\", \"lars_optax\"" not in INSTALL_CELL


# The front door and the porting recipes run in the default tier; the other notebooks'
# training runs (10 to 20 s each) in the slow one.
DEFAULT_TIER_NOTEBOOKS = {"quickstart", "porting_from_mxnet_and_tensorflow"}


@pytest.mark.parametrize("path", [
    p if p.stem in DEFAULT_TIER_NOTEBOOKS else pytest.param(p, marks=pytest.mark.slow)
    for p in NOTEBOOKS], ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path, tmp_path):
  nb = nbformat.read(path, as_version=4)
  client = NotebookClient(nb, timeout=600, kernel_name="python3",
                          resources={"metadata": {"path": str(tmp_path)}})
  client.execute()  # raises CellExecutionError, with the cell and traceback, on failure


def test_lars_vs_sgd_labels_runs_that_diverge_together_apart():
  """The loss panel's "diverged" labels of two runs that leave it at one epoch do not
  overlap, and each names its run."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  import numpy as np
  nb = json.loads((ROOT / "notebooks" / "lars_vs_sgd.ipynb").read_text())
  cell = next("".join(c["source"]) for c in nb["cells"]
              if c["cell_type"] == "code" and "diverged" in "".join(c["source"]))
  epochs = 4
  histories = {name: {"train_loss": loss, "test_acc": [0.5] * epochs} for name, loss in [
      ("SGD, batch 32", [2.0, 1.0, 0.5, 0.4]), ("SGD, batch 1024", [2.0, 1e30, np.inf, np.inf]),
      ("SGD, batch 1024, lr x 32", [2.0, np.inf, np.inf, np.inf])]}
  scope = {"np": np, "plt": plt, "epochs": epochs, "histories": histories}
  show = plt.show
  plt.show = lambda *a, **k: None
  try:
    exec(cell, scope)
  finally:
    plt.show = show
  fig = scope["fig"]
  fig.canvas.draw()
  labels = [t for t in scope["ax_loss"].texts if "diverged" in t.get_text()]
  assert [t.get_text().split(" diverged")[0] for t in labels] == [
      "SGD, batch 1024", "SGD, batch 1024, lr x 32"]
  boxes = [t.get_window_extent() for t in labels]
  assert not boxes[0].overlaps(boxes[1])
  plt.close(fig)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_a_notebook_reads_no_file_of_the_repository(path):
  """Each runs from the wheel alone (Colab): the values it compares with are in its cells."""
  nb = json.loads(path.read_text())
  code = "\n".join(line.split("#")[0] for c in nb["cells"] if c["cell_type"] == "code"
                   for line in "".join(c["source"]).splitlines())  # (comments may name files)
  for reach in ('"tests"', "tests/reference", "lars_optax.__file__", ".json"):
    assert reach not in code, (path.name, reach)


def test_the_porting_notebooks_mxnet_run_is_the_reference_files():
  """The seeded gradients and MXNet's last weights written in the notebook are the
  reference file's (tests/reference/mxnet_schedules.json, run lars_poly_warmup)."""
  import numpy as np
  nb = json.loads((ROOT / "notebooks" / "porting_from_mxnet_and_tensorflow.ipynb").read_text())
  cell = next("".join(c["source"]) for c in nb["cells"]
              if c["cell_type"] == "code" and "def mxnet_run_data" in "".join(c["source"]))
  scope = {"np": np}
  exec(cell.split("kwargs = ")[0], scope)  # the generator and the weights, not the run
  ref = json.loads((ROOT / "tests" / "reference" / "mxnet_schedules.json").read_text())
  run = next(r for r in ref["runs"] if r["name"] == "lars_poly_warmup")
  params, grads = scope["mxnet_run_data"]()
  for k in params:
    np.testing.assert_array_equal(params[k], np.asarray(run["params"][k], np.float32))
    for g, want in zip(grads, run["grads"]):
      np.testing.assert_array_equal(g[k], np.asarray(want[k], np.float32))
    np.testing.assert_array_equal(np.asarray(scope["MXNET_WEIGHTS_AFTER_12"][k], np.float32),
                                  np.asarray(run["weights"][-1][k], np.float32))
