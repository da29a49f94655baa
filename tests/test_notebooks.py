"""Every notebook in ``notebooks/`` runs top to bottom.

The code cells are joined and run in a fresh Python process (so a notebook's
own device setup, e.g. 8 virtual CPU devices, takes effect), without a Jupyter
kernel. Notebooks must therefore be plain Python: no ``%`` or ``!`` magics.
"""

import json
import pathlib
import subprocess
import sys

import pytest

NOTEBOOKS = sorted((pathlib.Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))


def _code(path: pathlib.Path) -> str:
  nb = json.loads(path.read_text())
  cells = [c for c in nb["cells"] if c["cell_type"] == "code"]
  for c in cells:
    assert not c.get("outputs"), f"{path.name}: outputs must be stripped in git"
    src = "".join(c["source"])
    assert not any(line.lstrip().startswith(("%", "!")) for line in src.splitlines()), \
        f"{path.name}: notebooks must be plain Python (no magics)"
  return "\n\n".join("".join(c["source"]) for c in cells)


def test_there_are_notebooks():
  assert NOTEBOOKS


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path, tmp_path):
  script = tmp_path / f"{path.stem}.py"
  script.write_text(_code(path))
  proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                        timeout=600, cwd=tmp_path)
  assert proc.returncode == 0, f"{path.name} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
