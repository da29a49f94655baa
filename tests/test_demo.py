"""The demo (``python -m lars_optax.demo``): a short run end to end, its table
and plot, one-line errors for nonsense options, and the missing-extra message."""

import os
import pathlib
import re
import subprocess
import sys

import jax
import numpy as np
import pytest

import lars_optax

pytest.importorskip("flax", reason="flax is not installed (the demo extra)")
pytest.importorskip("sklearn", reason="scikit-learn is not installed (the demo extra)")
pytest.importorskip("matplotlib", reason="matplotlib is not installed (the demo extra)")
pytest.importorskip("tqdm", reason="tqdm is not installed (the demo extra)")

from lars_optax import demo

REPO = pathlib.Path(__file__).resolve().parents[1]
TINY = ["--epochs", "2", "--small-batch", "64", "--large-batch", "256", "--quiet"]


def _table_rows(out: str) -> list[list[str]]:
  """The data rows of the results table, as lists of cells."""
  lines = [line for line in out.splitlines() if line.startswith("| ")]
  assert lines[0].startswith("| batch size | optimizer |")
  return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[1:]]


def test_demo_trains_three_ways_and_writes_the_plot(tmp_path, capsys):
  png = tmp_path / "demo.png"
  assert demo.main([*TINY, "--out", str(png)]) == 0
  out = capsys.readouterr().out

  header = next(line for line in out.splitlines() if line.startswith("| batch size"))
  for column in ("batch size", "optimizer", "test accuracy", "wall time"):
    assert column in header
  rows = _table_rows(out)
  assert [(r[0], r[1].split(" ")[0]) for r in rows] == [
      ("64", "lars_optax.mxnet.sgd"), ("256", "lars_optax.mxnet.sgd"), ("256", "lars_optax.lars")]
  assert [float(r[2]) for r in rows] == pytest.approx([0.05, 0.2, 0.2])  # linear scaling
  for r in rows:
    assert 0.0 <= float(r[4]) <= 1.0
    assert re.fullmatch(r"\d+\.\d s", r[5])
  assert float(rows[0][4]) > 0.8  # two epochs of small-batch SGD already learn the digits

  # Trust ratios of every kernel; biases are skipped by skip="flax".
  for layer in ("Conv_0", "Conv_1", "Dense_0", "Dense_1"):
    assert re.search(rf"^  {layer}/kernel +[\d.]+ -> [\d.]+$", out, re.M)
  assert "bias " not in out

  assert png.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
  assert f"wrote {png}" in out


def test_trust_ratios_are_recorded_per_step():
  model = demo.make_cnn()
  data = demo.load_digits()
  params = model.init(jax.random.key(0), data[0][0][:1])
  run = demo.Run("LARS", "lars_optax.lars", 512, 0.1, record_trust_ratios=True)
  tx = lars_optax.lars(0.1, momentum=0.9, eta=demo.ETA, skip="flax")
  demo.train(run, tx, model, params, data, epochs=2, seed=0, quiet=True)
  assert run.steps_per_epoch == len(data[0][0]) // 512 == 2
  assert len(run.train_loss) == len(run.test_accuracy) == 2
  assert set(run.trust_ratios) == {f"params/{layer}/{leaf}" for layer in
                                   ("Conv_0", "Conv_1", "Dense_0", "Dense_1")
                                   for leaf in ("kernel", "bias")}
  for name, ratios in run.trust_ratios.items():
    assert ratios.shape == (4,)  # 2 epochs x 2 steps
    if name.endswith("bias"):
      assert (ratios == 1.0).all()
    else:
      assert (ratios > 0).all() and (ratios != 1.0).all()


def test_no_plot_writes_nothing(tmp_path, monkeypatch, capsys):
  monkeypatch.chdir(tmp_path)
  assert demo.main(["--epochs", "1", "--small-batch", "256", "--large-batch", "512", "--quiet",
                    "--no-plot"]) == 0
  assert list(tmp_path.iterdir()) == []
  assert "wrote" not in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--epochs", "0"], "argument --epochs: must be > 0, got 0"),
    (["--epochs", "-2"], "argument --epochs: must be > 0, got -2"),
    (["--epochs", "1.5"], "argument --epochs: expected a positive integer, got '1.5'"),
    (["--small-batch", "0"], "argument --small-batch: must be > 0, got 0"),
    (["--large-batch", "-3"], "argument --large-batch: must be > 0, got -3"),
    (["--large-batch", "x"], "argument --large-batch: expected a positive integer, got 'x'"),
    (["--lr", "0"], "argument --lr: must be > 0, got 0"),
    (["--lr", "nan"], "argument --lr: must be finite, got nan"),
    (["--lr=-inf"], "argument --lr: must be finite, got -inf"),
    (["--seed", "-1"], "argument --seed: must be >= 0, got -1"),
    (["--large-batch", "100000"], "argument --large-batch: must be at most the 1347 training"),
    (["--out", os.path.join("no_such_dir", "x.png")], "argument --out: directory"),
    (["--out", "."], "argument --out: '.' is a directory"),
    (["--lr", "fast"], "argument --lr: expected a positive number, got 'fast'"),
    (["--bogus"], "unrecognized arguments: --bogus"),
])
def test_nonsense_options_exit_2_with_one_line(argv, message, capsys):
  with pytest.raises(SystemExit) as e:
    demo.main(argv)
  assert e.value.code == 2
  captured = capsys.readouterr()
  assert captured.out == ""
  assert captured.err.count("\n") == 1, captured.err
  assert captured.err.startswith("python -m lars_optax.demo: error: ")
  assert message in captured.err


def test_command_line(tmp_path):
  """The real entry point: exit status 2 and a single stderr line; --help lists the options."""
  env = {**os.environ, "PYTHONPATH": os.pathsep.join(
      [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
  bad = subprocess.run([sys.executable, "-m", "lars_optax.demo", "--epochs", "0"], cwd=tmp_path,
                       env=env, capture_output=True, text=True, timeout=120)
  assert bad.returncode == 2
  assert bad.stdout == ""
  assert bad.stderr.splitlines() == [
      "python -m lars_optax.demo: error: argument --epochs: must be > 0, got 0 (see --help)"]
  helped = subprocess.run([sys.executable, "-m", "lars_optax.demo", "--help"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=120)
  assert helped.returncode == 0
  for option in ("--epochs", "--small-batch", "--large-batch", "--lr", "--seed", "--out",
                 "--no-plot", "--quiet"):
    assert option in helped.stdout
  assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("module, dist", [("flax", "flax"), ("sklearn", "scikit-learn"),
                                          ("matplotlib", "matplotlib"), ("tqdm", "tqdm")])
def test_missing_extra_names_it(module, dist, monkeypatch, tmp_path, capsys):
  monkeypatch.setitem(sys.modules, module, None)  # makes `import module` raise ImportError
  assert demo.main(["--out", str(tmp_path / "x.png")]) == 1
  captured = capsys.readouterr()
  assert captured.out == ""
  assert captured.err.splitlines() == [
      ("lars_optax.demo needs flax, scikit-learn, matplotlib and tqdm "
       f'(missing: {dist}): pip install ".[demo]" in a clone, or pip install '
       f'"dist/lars_optax-{lars_optax.__version__}-py3-none-any.whl[demo]" '
       "with a wheel built by python -m build")]
  assert list(tmp_path.iterdir()) == []


def test_one_epoch_is_singular_and_small_batch_above_large_batch_warns(capsys):
  argv = ["--epochs", "1", "--small-batch", "256", "--large-batch", "128", "--quiet",
          "--no-plot"]
  assert demo.main(argv) == 0
  captured = capsys.readouterr()
  assert "1 epoch per run" in captured.out
  assert captured.err.splitlines() == [(
      "warning: --small-batch (256) is larger than --large-batch (128): the 'large-batch' "
      "runs use the smaller batch, with the learning rate scaled down")]


def test_plot_clips_a_diverged_loss_and_marks_it(tmp_path):
  runs = [demo.Run("SGD", "sgd", 32, 0.1, train_loss=[2.3, 1.0, 0.5], test_accuracy=[0.5] * 3),
          demo.Run("SGD", "sgd", 512, 1.6, train_loss=[2.0, 1e30, float("nan")],
                   test_accuracy=[0.1] * 3)]
  fig = demo.plot(runs, str(tmp_path / "p.png"), skipped=[])
  ax_loss = fig.axes[0]
  assert [t.get_text() for t in ax_loss.texts] == ["diverged (epoch 2)"]
  assert ax_loss.get_ylim()[1] < 100  # not 1e30
  assert all(ax.get_ylabel() for ax in fig.axes[:3])
  assert (tmp_path / "p.png").exists()


def test_layer_names_give_a_stacked_leaf_one_name_per_layer():
  from lars_optax import demo

  ratios = {"blocks/kernel": np.array([0.1, 0.2, 0.3]), "head/kernel": np.float32(0.5)}
  assert demo.layer_names(ratios) == ["blocks/kernel[0]", "blocks/kernel[1]",
                                      "blocks/kernel[2]", "head/kernel"]


def test_table_says_where_a_run_diverged():
  nan = float("nan")
  runs = [demo.Run("SGD", "sgd", 32, 0.1, train_loss=[2.3, 0.5], test_accuracy=[0.5, 0.9]),
          demo.Run("SGD", "sgd", 512, 1.6, train_loss=[2.0, nan], test_accuracy=[0.2, 0.1],
                   step_loss=[2.1, 1.9, 3.0, nan], steps_per_epoch=2),
          demo.Run("LARS", "lars", 512, 1.6, train_loss=[2.0, nan],
                   test_accuracy=[0.2, 0.1])]
  out = demo.format_table(runs)
  rows = _table_rows(out)
  assert rows[0][3] == "0.5000"
  assert rows[1][3] == "nan, diverged at step 4 (epoch 2)"
  assert rows[2][3] == "nan, diverged at epoch 2"  # the steps' losses were not recorded
  notes = [line for line in out.splitlines() if line.startswith("Note:")]
  assert len(notes) == 2
  assert notes[0].startswith(
      "Note: SGD at batch size 512 (peak lr 1.6) diverged at step 4 (epoch 2):")
  assert "test accuracy is not that of a trained model" in notes[0]


def test_table_counts_a_huge_finite_loss_as_diverged_as_the_plot_does():
  runs = [demo.Run("SGD", "sgd", 32, 0.1, train_loss=[2.3, 0.5], test_accuracy=[0.5, 0.9]),
          demo.Run("SGD", "sgd", 512, 8.0, train_loss=[2.0, 2.6e8, 1e9],
                   test_accuracy=[0.2, 0.1, 0.14], step_loss=[2.0, 5.0, 5e8, 1e9, 1e9],
                   steps_per_epoch=2)]
  rows = _table_rows(demo.format_table(runs))
  assert rows[1][3] == "1000000000.0000, diverged at step 3 (epoch 2)"
  assert "diverged" not in rows[0][3]


def test_train_records_every_steps_loss_and_a_diverged_run_is_named():
  data = demo.load_digits()
  model = demo.make_cnn()
  params = model.init(jax.random.key(0), data[0][0][:1])
  run = demo.Run("SGD", "sgd", 256, 1e8)
  demo.train(run, lars_optax.mxnet.sgd(1e8, momentum=0.9), model, params, data, epochs=2, seed=0,
             quiet=True)
  assert len(run.step_loss) == 2 * run.steps_per_epoch
  assert run.step_loss[0] == pytest.approx(2.3, abs=0.3)  # the first step is fine
  assert re.fullmatch(r"step \d+ \(epoch [12]\)", demo.divergence(run, top=7.0) or "")
  assert "diverged at step" in demo.format_table([run])
