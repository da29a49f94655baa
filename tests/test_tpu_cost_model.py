"""The TPU cost-model scripts fail clearly without libtpu (CI has none)."""

import importlib.util
import pathlib
import sys

import pytest

BENCHMARKS = pathlib.Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.mark.quick
@pytest.mark.skipif(importlib.util.find_spec("libtpu") is not None, reason="libtpu is installed")
@pytest.mark.parametrize("script, argv", [("tpu_cost_model", ["--skip-train-step"]),
                                          ("sparse_tpu_cost_model", ["--widths", "128"]),
                                          ("step_time", ["--scaling", "--tpu", "v5e:2x2",
                                                         "--blocks", "1"])])
def test_without_libtpu_it_exits_naming_the_extra(monkeypatch, script, argv):
  monkeypatch.syspath_prepend(str(BENCHMARKS))
  sys.modules.pop(script, None)
  module = importlib.import_module(script)

  with pytest.raises(SystemExit, match=r"libtpu is not installed.*\[tpu-cost-model\]"):
    module.main(argv)


def test_estimated_cycles_are_summed_from_the_hlo_text():
  sys.path.insert(0, str(BENCHMARKS))
  try:
    import tpu_cost_model
  finally:
    sys.path.remove(str(BENCHMARKS))

  class Compiled:
    def as_text(self):
      return ('%a = f32[8] fusion(...), backend_config={"estimated_cycles":"120","x":1}\n'
              '%b = f32[8] convolution(...), backend_config={"estimated_cycles":"30"}\n')

  assert tpu_cost_model.estimated_cycles(Compiled()) == 150

