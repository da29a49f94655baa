"""Every Python block of the README and of the docs' pages runs as written.

Each ```python block is run on its own, in a fresh namespace, with nothing
but what the block itself imports and sets up: a reader can paste any one
block into a fresh interpreter. Blocks in another language (```bash,
```text for MXNet or TensorFlow code) are not run, and neither is a
```python block that the line before marks with ``<!-- skip: why -->``
(a fragment of a longer program that a notebook runs in full). The Markdown
pages of ``docs/`` are run the same way, and so is the Python block of the
docs' front page (docs/index.rst).
"""

from __future__ import annotations

import contextlib
import io
import pathlib
import re
import textwrap

import pytest

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"
_FENCE = re.compile(r"^( *)```(\w*)\s*$")
_SKIP = re.compile(r"^\s*<!--\s*skip\b")


def python_blocks(text: str) -> list[tuple[int, str, bool]]:
  """``[(first line number, code, skipped), ...]`` for the ```python blocks."""
  blocks = []
  lines = text.splitlines()
  i = 0
  while i < len(lines):
    m = _FENCE.match(lines[i])
    if not m or not m.group(2):
      i += 1
      continue
    indent, lang, start = len(m.group(1)), m.group(2), i + 1
    j = start
    while not lines[j].strip().startswith("```"):
      j += 1
    if lang == "python":
      skipped = i > 0 and bool(_SKIP.match(lines[i - 1]))
      code = "\n".join(line[indent:] for line in lines[start:j])
      blocks.append((start + 1, code, skipped))
    i = j + 1
  return blocks


BLOCKS = python_blocks(README.read_text(encoding="utf-8"))
RUN = [(line, code) for line, code, skipped in BLOCKS if not skipped]
DOCS = README.parent / "docs"
DOC_PAGES = sorted(DOCS.glob("*.md"))
DOC_RUN = [(f"docs/{page.name}", line, code) for page in DOC_PAGES
           for line, code, skipped in python_blocks(page.read_text(encoding="utf-8"))
           if not skipped]


def test_readme_python_blocks_are_found():
  assert len(RUN) >= 1


def rst_python_blocks(text: str) -> list[str]:
  """The ``.. code-block:: python`` blocks of a reStructuredText page, dedented."""
  blocks = re.findall(r"^\.\. code-block:: python\n\n((?:(?:   .*)?\n)+)", text, re.M)
  return [textwrap.dedent(b) for b in blocks]


def test_docs_index_python_block_runs():
  (code,) = rst_python_blocks((README.parent / "docs" / "index.rst").read_text(encoding="utf-8"))
  exec(compile(code, "docs/index.rst", "exec"), {"__name__": "__docs__"})


@pytest.mark.quick
@pytest.mark.parametrize("line,code", RUN, ids=[f"line{line}" for line, _ in RUN])
def test_readme_python_block_runs(line, code):
  namespace = {"__name__": "__readme__"}
  with contextlib.redirect_stdout(io.StringIO()):
    exec(compile(code, f"README.md:{line}", "exec"), namespace)


def test_docs_python_blocks_are_found():
  assert len(DOC_RUN) >= 7


@pytest.mark.quick
@pytest.mark.parametrize("page,line,code", DOC_RUN,
                         ids=[f"{page[5:-3]}-line{line}" for page, line, _ in DOC_RUN])
def test_docs_python_block_runs(page, line, code):
  namespace = {"__name__": "__docs__"}
  with contextlib.redirect_stdout(io.StringIO()):
    exec(compile(code, f"{page}:{line}", "exec"), namespace)


def test_readme_is_a_front_door():
  """At most 350 lines; the reference lives in docs/, and each page it links exists."""
  text = README.read_text(encoding="utf-8")
  assert len(text.splitlines()) <= 350
  for link in re.findall(r"\]\((docs/[^)#]+)", text):
    assert (README.parent / link).exists(), link

def printed_lines_claimed(code: str) -> list[str]:
  """The comment lines that end a block, ``# `` removed: what the block prints.

  A ``...`` in a line stands for the part of the printed line left out.
  """
  lines = code.rstrip().splitlines()
  claimed = []
  while lines and lines[-1].startswith("# "):
    claimed.insert(0, lines.pop()[2:])
  return claimed


def _quick_start() -> tuple[int, str]:
  text = README.read_text(encoding="utf-8")
  heading = text[:text.index("\n## Quick start\n")].count("\n") + 2
  return next((line, code) for line, code in RUN if line > heading)


def test_quick_start_prints_what_its_comment_says():
  line, code = _quick_start()
  claimed = printed_lines_claimed(code)
  assert claimed, "the Quick Start block should end with the line it prints, as a comment"
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    exec(compile(code, f"README.md:{line}", "exec"), {"__name__": "__readme__"})
  printed = out.getvalue().splitlines()
  assert len(printed) >= len(claimed), printed
  for want, got in zip(claimed, printed):
    head, _, tail = want.partition("...")
    # The numbers are printed at the precision shown, so the text must agree.
    assert got.startswith(head) and got.endswith(tail), (
        f"README.md:{line}: the comment says\n  # {want}\nbut the block prints\n  {got}")


def test_first_screen_writes_out_the_quick_test_command():
  """The quick check is a whole command, in the venv the test command makes."""
  text = README.read_text(encoding="utf-8")
  first_screen = text[:text.index("\n## Quick start\n")]
  assert ".venv/bin/python -m pytest -q\n" in first_screen
  assert "\n.venv/bin/python -m pytest -q -m quick\n" in first_screen


def test_readme_and_create_say_how_each_schedule_counts():
  import lars_optax

  text = " ".join((DOCS / "optimizers.md").read_text(encoding="utf-8").split())
  assert ("MXNet's 1-based update count (shifted by `begin_num_update`, which also starts "
          "Adam's `t`), while an optax schedule given as `learning_rate` counts from 0") in text
  doc = " ".join(lars_optax.mxnet.create.__doc__.split())
  assert "1 at the first update" in doc
  assert ("given as ``learning_rate`` instead is called with the number of updates done, "
          "0 at the first update") in doc


def test_readme_states_the_reference_tolerances_the_tests_assert():
  """The README's tolerances are docs/verified.md's and test_reference_mxnet_optimizers's."""
  import test_reference_mxnet_optimizers as ref
  readme = " ".join(README.read_text(encoding="utf-8").split())
  verified = " ".join((DOCS / "verified.md").read_text(encoding="utf-8").split())
  assert "within 1e-5 relative in float32, the Adam family within 1e-4" in readme
  assert "Tolerances are float32 1e-5, Adam 1e-4" in verified
  assert ref._rtol({"dtype": "float32", "optimizer": "adam"}) == 1e-4
  assert ref._rtol({"dtype": "float32", "optimizer": "sgd"}) == 1e-5
