"""The declared version floors, CI's pinned floor set and the README agree.

pyproject.toml declares the floors (">="), .ci/floors.txt pins them exactly for
CI's second environment (where `pytest -m quick` runs), and the README's
Versions line states them. A floor changed in one place and not the others
fails here.
"""

import pathlib
import re
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
PINS_FILE = ROOT / ".ci" / "floors.txt"


def _name(name):
  """A distribution name as pip compares them (PEP 503)."""
  return re.sub(r"[-_.]+", "-", name).lower()


def _pins():
  pins = {}
  for line in PINS_FILE.read_text(encoding="utf-8").splitlines():
    line = line.split("#", 1)[0].strip()
    if line:
      match = re.fullmatch(r"([A-Za-z0-9._-]+)==([0-9][0-9A-Za-z.]*)", line)
      assert match, f".ci/floors.txt: {line!r} is not an exact pin (name==version)"
      pins[_name(match[1])] = match[2]
  return pins


def _floors(requirements):
  """{name: floor} for the requirements that declare a ">=" floor."""
  floors = {}
  for requirement in requirements:
    match = re.fullmatch(r"([A-Za-z0-9._-]+)(\[[^]]*\])?\s*(.*)", requirement.strip())
    assert match, requirement
    lower = re.search(r">=\s*([0-9][0-9A-Za-z.]*)", match[3])
    if lower:
      floors[_name(match[1])] = lower[1]
  return floors


DEPENDENCIES = _floors(PYPROJECT["project"]["dependencies"])
EXTRAS = {extra: _floors(requirements)
          for extra, requirements in PYPROJECT["project"]["optional-dependencies"].items()}


def test_every_runtime_dependency_is_pinned_at_its_floor():
  pins = _pins()
  assert DEPENDENCIES, "pyproject.toml declares no floors"
  for name, floor in DEPENDENCIES.items():
    assert name in pins, f"{name} >= {floor} (pyproject.toml) is not pinned in .ci/floors.txt"
    assert pins[name] == floor, (
        f"{name}: pyproject.toml's floor is {floor}, .ci/floors.txt pins {pins[name]}")


def test_every_pin_is_a_declared_floor():
  declared = dict(DEPENDENCIES)
  for floors in EXTRAS.values():
    declared.update(floors)
  for name, pin in _pins().items():
    assert name in declared, (
        f".ci/floors.txt pins {name}, for which pyproject.toml declares no floor")
    assert declared[name] == pin, (
        f"{name}: .ci/floors.txt pins {pin}, pyproject.toml's floor is {declared[name]}")


def test_the_readme_versions_line_names_the_floors():
  readme = (ROOT / "README.md").read_text(encoding="utf-8")
  match = re.search(r"^- \*\*Versions\.\*\*(.*?)(?=^- \*\*|^#)", readme, re.M | re.S)
  assert match, "README.md has no Versions line"
  versions = " ".join(match[1].split())
  python = re.fullmatch(r">=\s*([0-9.]+)", PYPROJECT["project"]["requires-python"])
  assert python, PYPROJECT["project"]["requires-python"]
  assert f"Python ≥ {python[1]}" in versions
  for name, floor in {**DEPENDENCIES, "flax": EXTRAS["demo"]["flax"]}.items():
    assert re.search(rf"`{re.escape(name)}`[^,]*≥ {re.escape(floor)}(?![0-9.])", versions), (
        f"README's Versions line does not name {name} ≥ {floor}")
  assert ".ci/floors.txt" in versions


def test_the_classifiers_name_only_supported_pythons():
  python = PYPROJECT["project"]["requires-python"].removeprefix(">=")
  lowest = tuple(int(part) for part in python.split("."))
  for classifier in PYPROJECT["project"]["classifiers"]:
    match = re.fullmatch(r"Programming Language :: Python :: (3\.[0-9]+)", classifier)
    if match:
      assert tuple(int(part) for part in match[1].split(".")) >= lowest, classifier
  assert PYPROJECT["tool"]["mypy"]["python_version"] == python
