"""The demo runs end to end (short) and rejects nonsense options."""

import pytest

pytest.importorskip("sklearn")

from lars_optax import demo


def test_demo_runs(capsys):
  assert demo.main(["--epochs", "2", "--large-batch", "256"]) == 0
  out = capsys.readouterr().out
  assert "LARS (lars_optax.lars)" in out
  assert "fc1_bias     1.00000" in out  # MXNet skip rule: bias keeps ratio 1


@pytest.mark.parametrize("argv", [["--epochs", "0"], ["--small-batch", "-3"],
                                  ["--large-batch", "x"], ["--large-batch", "100000"]])
def test_demo_rejects_bad_options(argv):
  with pytest.raises(SystemExit) as e:
    demo.main(argv)
  assert e.value.code == 2
