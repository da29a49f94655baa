"""Large-batch training with LARS, on real data: ``python -m lars_optax.demo``.

Trains a small Flax CNN on scikit-learn's bundled 8x8 handwritten digits
(1,797 images shipped inside scikit-learn: nothing is downloaded) three ways:

1. small-batch SGD (:func:`lars_optax.mxnet.sgd`, MXNet's SGD with momentum 0.9),
   the baseline recipe, with a polynomial learning-rate decay;
2. large-batch SGD, the same optimizer with the learning rate scaled linearly
   with the batch size (``lr * large_batch / small_batch``), a linear warm-up
   and polynomial (power 2) decay;
3. large-batch LARS (:func:`lars_optax.lars`, MXNet's LARS) with the same
   scaled learning rate, warm-up and decay, as the LARS paper (You, Gitman and
   Ginsburg, 2017) recommends. Biases are skipped (``skip="flax"``: trust
   ratio 1).

All three start from the same initial weights and see the same shuffles. While
they train, a progress bar per run shows the loss and test accuracy. At the end
the demo prints a table (batch size, optimizer, test accuracy, wall time) and
writes a PNG with the loss and accuracy curves and the per-layer trust ratios
of the LARS run over training. With the defaults it takes well under a minute
on two CPU cores.

Run it::

  pip install ".[demo]"   # in a clone: flax, scikit-learn, matplotlib, tqdm
  python -m lars_optax.demo                      # defaults, writes lars_optax_demo.png
  python -m lars_optax.demo --epochs 60 --large-batch 256 --out runs/demo.png
  python -m lars_optax.demo --help

Bad options (a batch size or number of epochs <= 0, ...) exit with status 2 and
a one-line message; missing demo dependencies exit with status 1 and a message
naming the extra to install.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import jax
import jax.numpy as jnp
import numpy as np
import optax

import lars_optax

# Module imported -> the pip distribution that provides it (the "demo" extra).
EXTRAS = {"flax": "flax", "sklearn": "scikit-learn", "matplotlib": "matplotlib",
          "tqdm": "tqdm"}
# lars_optax is not on a package index: the extra comes from a clone or a built wheel.
INSTALL = ('pip install ".[demo]" in a clone, or pip install '
           f'"dist/lars_optax-{lars_optax.__version__}-py3-none-any.whl[demo]" '
           "with a wheel built by python -m build")

MOMENTUM = 0.9
WEIGHT_DECAY = 5e-4
# LARS's trust coefficient. MXNet's default, 0.001, makes the ratios ~0.01 on
# this small network, so LARS would need ~10x the linearly scaled learning
# rate; with 0.02 the scaled rate works as it is.
ETA = 0.02
WARMUP_FRACTION = 0.2  # of the large-batch steps
DECAY_POWER = 2.0
TEST_FRACTION = 0.25
SPLIT_SEED = 0  # the train/test split is the same whatever --seed is
LOSS_CLIP = 3.0  # the loss plot's top: this times the largest first-epoch loss


@dataclasses.dataclass
class Run:
  """One training run's configuration and what it recorded."""

  label: str  # short, for the legend and the progress bar
  optimizer: str  # for the table
  batch_size: int
  peak_lr: float
  train_loss: list[float] = dataclasses.field(default_factory=list)  # per epoch
  test_accuracy: list[float] = dataclasses.field(default_factory=list)  # per epoch
  wall_time: float = 0.0  # seconds, compilation and evaluation included
  record_trust_ratios: bool = False  # for a LARS optimizer
  # {leaf name: trust ratio after every step} when recorded; steps per epoch.
  trust_ratios: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
  steps_per_epoch: int = 1
  step_loss: list[float] = dataclasses.field(default_factory=list)  # every step's


class _Parser(argparse.ArgumentParser):
  """An ArgumentParser whose errors are one line (and exit status 2)."""

  def error(self, message: str) -> NoReturn:
    self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _positive(kind: Callable[[str], Any], what: str) -> Callable[[str], Any]:
  """An argparse ``type``: ``kind(text)``, which must be finite and > 0."""

  def parse(text: str) -> Any:
    try:
      value = kind(text)
    except ValueError:
      raise argparse.ArgumentTypeError(f"expected a positive {what}, got {text!r}") from None
    if not math.isfinite(value):
      raise argparse.ArgumentTypeError(f"must be finite, got {text}")
    if value <= 0:
      raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value
  return parse


def _non_negative_int(text: str) -> int:
  try:
    value = int(text)
  except ValueError:
    raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}") from None
  if value < 0:
    raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
  return value


def make_parser() -> argparse.ArgumentParser:
  """The command line of ``python -m lars_optax.demo``."""
  ap = _Parser(prog="python -m lars_optax.demo",
               description="Train a small CNN on scikit-learn's digits with small-batch SGD, "
                           "large-batch SGD and large-batch LARS; print a table and plot the "
                           "curves and LARS's trust ratios.")
  ap.add_argument("--epochs", type=_positive(int, "integer"), default=40,
                  help="epochs per run (default: %(default)s)")
  ap.add_argument("--small-batch", type=_positive(int, "integer"), default=32,
                  help="batch size of the baseline SGD run (default: %(default)s)")
  ap.add_argument("--large-batch", type=_positive(int, "integer"), default=512,
                  help="batch size of the large-batch SGD and LARS runs (default: %(default)s)")
  ap.add_argument("--lr", type=_positive(float, "number"), default=0.05,
                  help="learning rate of the small-batch run; the large-batch runs use "
                       "lr * large-batch / small-batch (default: %(default)s)")
  ap.add_argument("--seed", type=_non_negative_int, default=0,
                  help="seed of the initial weights and the shuffles (default: %(default)s)")
  ap.add_argument("--out", default="lars_optax_demo.png",
                  help="where to write the plot (default: %(default)s)")
  ap.add_argument("--no-plot", action="store_true", help="do not write the plot")
  ap.add_argument("--quiet", action="store_true", help="no progress bars")
  return ap


def missing_extras() -> list[str]:
  """The pip names of the demo's dependencies that cannot be imported."""
  missing = []
  for module, dist in EXTRAS.items():
    try:
      importlib.import_module(module)
    except ImportError:
      missing.append(dist)
  return missing


def load_digits() -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
  """``((x_train, y_train), (x_test, y_test))``: NHWC float32 images, int32 labels.

  A stratified 75/25 split with a fixed seed; pixels standardised with the
  training set's mean and standard deviation.
  """
  from sklearn.datasets import load_digits as sk_load_digits
  from sklearn.model_selection import train_test_split

  x, y = sk_load_digits(return_X_y=True)
  x = x.reshape(-1, 8, 8, 1).astype(np.float32)
  x_tr, x_te, y_tr, y_te = train_test_split(x, y.astype(np.int32), test_size=TEST_FRACTION,
                                            random_state=SPLIT_SEED, stratify=y)
  mean, std = x_tr.mean(), x_tr.std()
  return ((x_tr - mean) / std, y_tr), ((x_te - mean) / std, y_te)


def make_cnn(num_classes: int = 10) -> Any:
  """Conv(16, 3x3) - Conv(32, 3x3, stride 2) - Dense(64) - Dense(classes), ReLUs."""
  import flax.linen as nn

  class CNN(nn.Module):
    num_classes: int

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
      x = nn.relu(nn.Conv(16, (3, 3))(x))
      x = nn.relu(nn.Conv(32, (3, 3), strides=2)(x))
      x = x.reshape(x.shape[0], -1)
      x = nn.relu(nn.Dense(64)(x))
      return nn.Dense(self.num_classes)(x)

  return CNN(num_classes)


def lr_schedule(peak_lr: float, total_steps: int, warmup_steps: int) -> optax.Schedule:
  """Linear warm-up from 0 to ``peak_lr``, then polynomial decay to 0 (power 2)."""
  decay = optax.polynomial_schedule(peak_lr, 0.0, DECAY_POWER,
                                    max(total_steps - warmup_steps, 1))
  if warmup_steps <= 0:
    return decay
  return optax.join_schedules([optax.linear_schedule(0.0, peak_lr, warmup_steps), decay],
                              [warmup_steps])


def train(run: Run, tx: optax.GradientTransformation, model: Any, params: Any,
          data: tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]],
          *,
          epochs: int, seed: int, quiet: bool) -> None:
  """Trains ``model`` from ``params`` with ``tx`` and records into ``run``."""
  from tqdm import tqdm  # type: ignore[import-untyped, unused-ignore]

  (x_tr, y_tr), (x_te, y_te) = data

  def loss_fn(params: Any, x: jax.Array, y: jax.Array) -> jax.Array:
    logits = model.apply(params, x)
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

  @jax.jit
  def train_step(params: Any, opt_state: Any, x: jax.Array,
                 y: jax.Array) -> tuple[Any, Any, jax.Array]:
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  @jax.jit
  def accuracy(params: Any, x: jax.Array, y: jax.Array) -> jax.Array:
    return jnp.mean(jnp.argmax(model.apply(params, x), -1) == y)

  ratios: list[jax.Array] = []
  rng = np.random.default_rng(seed)
  run.steps_per_epoch = steps = len(x_tr) // run.batch_size  # the remainder is dropped
  start = time.perf_counter()
  opt_state = tx.init(params)
  bar = tqdm(range(epochs), desc=f"{run.label:>4s}, batch {run.batch_size:<5d}", unit="epoch",
             disable=True if quiet else None)  # None: off when stderr is not a terminal
  for _ in bar:
    order = rng.permutation(len(x_tr))
    losses = []
    for i in range(steps):
      idx = order[i * run.batch_size:(i + 1) * run.batch_size]
      params, opt_state, loss = train_step(params, opt_state, x_tr[idx], y_tr[idx])
      losses.append(loss)
      if run.record_trust_ratios:
        ratios.append(lars_optax.trust_ratios(opt_state))  # a vector, leaf (layer) order
    epoch_losses = np.asarray(jnp.stack(losses), np.float64)
    run.step_loss += epoch_losses.tolist()
    run.train_loss.append(float(epoch_losses.mean()))
    run.test_accuracy.append(float(accuracy(params, x_te, y_te)))
    bar.set_postfix(loss=f"{run.train_loss[-1]:.4f}", test_acc=f"{run.test_accuracy[-1]:.3f}")
  bar.close()
  run.wall_time = time.perf_counter() - start
  if run.record_trust_ratios:
    # The vector holds one entry per layer of a stacked leaf: name them per layer.
    names = layer_names(lars_optax.trust_ratios(opt_state, params))
    stacked = np.asarray(jnp.stack(ratios))
    run.trust_ratios = {name: stacked[:, i] for i, name in enumerate(names)}


def layer_names(ratios: dict) -> list[str]:
  """The names of the entries of ``trust_ratios(state)``'s vector, from the dict
  ``trust_ratios(state, params)``: a stacked (scanned) leaf has one entry per layer,
  ``blocks/kernel[3]`` for its layer 3."""
  out = []
  for name, r in ratios.items():
    shape = np.shape(r)
    out += [name] if not shape else [f"{name}[{','.join(map(str, i))}]"
                                      for i in np.ndindex(shape)]
  return out


def loss_top(runs: Sequence[Run]) -> float:
  """The loss above which a run counts as diverged: :data:`LOSS_CLIP` times the
  largest finite first-epoch loss (the top of the loss plot)."""
  first = [r.train_loss[0] for r in runs if r.train_loss and math.isfinite(r.train_loss[0])]
  return LOSS_CLIP * max(first, default=1.0)


def divergence(run: Run, top: float = math.inf) -> str | None:
  """Where ``run`` diverged, or None if it did not.

  A run diverged in the first epoch whose mean loss is NaN, infinite or above
  ``top`` (as the loss plot marks it), at the first step of that epoch whose
  loss is: ``"step 37 (epoch 2)"``, or ``"epoch 2"`` when the steps' losses
  were not recorded.
  """
  def bad(x: float) -> bool:
    return not (math.isfinite(x) and x <= top)

  epoch = next((i for i, x in enumerate(run.train_loss, 1) if bad(x)), None)
  if epoch is None:
    return None
  n = run.steps_per_epoch
  steps = run.step_loss[(epoch - 1) * n:epoch * n]
  step = next((i for i, x in enumerate(steps, (epoch - 1) * n + 1) if bad(x)), None)
  return f"epoch {epoch}" if step is None else f"step {step} (epoch {epoch})"


def format_table(runs: Sequence[Run]) -> str:
  """The results as a Markdown table, with a note under it for each diverged run."""
  header = ("| batch size | optimizer | peak lr | final train loss | test accuracy | wall time |\n"
            "|---:|---|---:|---:|---:|---:|")
  top = loss_top(runs)
  rows, notes = [], []
  for r in runs:
    where = divergence(r, top)
    loss = f"{r.train_loss[-1]:.4f}" + (f", diverged at {where}" if where else "")
    rows.append(f"| {r.batch_size} | {r.optimizer} | {r.peak_lr:g} | {loss} | "
                f"{r.test_accuracy[-1]:.4f} | {r.wall_time:.1f} s |")
    if where:
      notes.append(f"Note: {r.label} at batch size {r.batch_size} (peak lr {r.peak_lr:g}) "
                   f"diverged at {where}: its training loss became NaN or infinite, or went "
                   f"above {top:.3g} ({LOSS_CLIP:g} times the largest first-epoch loss); its "
                   "test accuracy is not that of a trained model.")
  return "\n".join([header, *rows, *(["", *notes] if notes else [])])


def plot(runs: Sequence[Run], path: str, skipped: Sequence[str]) -> Any:
  """Writes loss curves, accuracy curves and LARS's trust ratios to ``path``.

  Returns the matplotlib ``Figure``.
  """
  from matplotlib.figure import Figure  # no pyplot: no global backend state

  fig = Figure(figsize=(15, 4.5), layout="constrained")
  ax_loss, ax_acc, ax_ratio = fig.subplots(1, 3)
  # A diverging run's loss reaches 1e30 or inf; clip the log axis to a few times
  # the largest first-epoch loss and mark where each run leaves it.
  top = loss_top(runs)
  for r in runs:
    epochs = np.arange(1, len(r.train_loss) + 1)
    label = f"{r.label} (batch {r.batch_size})"
    loss = np.asarray(r.train_loss, dtype=float)
    bad = ~np.isfinite(loss) | (loss > top)
    (line,) = ax_loss.plot(epochs, np.where(bad, np.nan, loss), label=label)
    if bad.any():
      k = int(np.argmax(bad))
      ax_loss.plot([epochs[k]], [top], marker="x", markersize=10, color=line.get_color())
      ax_loss.annotate(f"diverged (epoch {epochs[k]})", (epochs[k], top), fontsize=9,
                       textcoords="offset points", xytext=(6, -12), color=line.get_color())
    ax_acc.plot(epochs, r.test_accuracy, label=label)
  ax_loss.set(title="training loss", xlabel="epoch", ylabel="cross-entropy, mean over the epoch",
              yscale="log")
  ax_loss.set_ylim(top=top * 1.5)
  ax_acc.set(title="test accuracy", xlabel="epoch", ylabel="accuracy", ylim=(0.0, 1.0))
  for ax in (ax_loss, ax_acc):
    ax.legend()
    ax.grid(alpha=0.3)
  for r in runs:
    for name, values in r.trust_ratios.items():
      if name not in skipped:
        ax_ratio.plot(np.arange(1, len(values) + 1), values, label=name.removeprefix("params/"))
    if r.trust_ratios:
      ax_ratio.set(xlabel=f"step (batch {r.batch_size}, {r.steps_per_epoch} steps per epoch)")
  ax_ratio.set(title="LARS trust ratio per layer, every step (biases skipped)",
               ylabel="trust ratio", yscale="log")
  if ax_ratio.get_legend_handles_labels()[0]:
    ax_ratio.legend()
  ax_ratio.grid(alpha=0.3)
  fig.savefig(path, dpi=110)
  return fig


def main(argv: Sequence[str] | None = None) -> int:
  """Runs the demo; returns the exit status (bad options raise ``SystemExit(2)``)."""
  parser = make_parser()
  args = parser.parse_args(argv)
  if not args.no_plot:
    if os.path.isdir(args.out):
      parser.error(f"argument --out: {args.out!r} is a directory; give a file name")
    if not os.path.isdir(os.path.dirname(os.path.abspath(args.out))):
      parser.error(f"argument --out: directory {os.path.dirname(args.out)!r} does not exist")

  missing = missing_extras()
  if missing:
    print(f"lars_optax.demo needs flax, scikit-learn, matplotlib and tqdm "
          f"(missing: {', '.join(missing)}): {INSTALL}", file=sys.stderr)
    return 1

  data = load_digits()
  n_train, n_test = len(data[0][0]), len(data[1][0])
  for flag, value in (("--small-batch", args.small_batch), ("--large-batch", args.large_batch)):
    if value > n_train:
      parser.error(f"argument {flag}: must be at most the {n_train} training images, "
                   f"got {value}")

  if args.small_batch > args.large_batch:
    print(f"warning: --small-batch ({args.small_batch}) is larger than --large-batch "
          f"({args.large_batch}): the 'large-batch' runs use the smaller batch, with the "
          "learning rate scaled down", file=sys.stderr)

  model = make_cnn()
  params0 = model.init(jax.random.key(args.seed), data[0][0][:1])
  n_params = sum(leaf.size for leaf in jax.tree.leaves(params0))
  print(f"digits: {n_train} train / {n_test} test 8x8 images; CNN with {n_params:,} parameters; "
        f"{args.epochs} epoch{'' if args.epochs == 1 else 's'} per run; "
        f"jax {jax.__version__} on {jax.devices()[0].platform}")

  small, large = args.small_batch, args.large_batch
  large_lr = args.lr * large / small  # linear scaling
  small_steps = args.epochs * (n_train // small)
  large_steps = args.epochs * (n_train // large)
  warmup = round(WARMUP_FRACTION * large_steps)
  sgd_name = f"lars_optax.mxnet.sgd (momentum {MOMENTUM})"
  configs = [
      (Run("SGD", f"{sgd_name}, poly decay", small, args.lr),
       lars_optax.mxnet.sgd(lr_schedule(args.lr, small_steps, 0), momentum=MOMENTUM,
                      wd=WEIGHT_DECAY)),
      (Run("SGD", f"{sgd_name}, warm-up + poly decay", large, large_lr),
       lars_optax.mxnet.sgd(lr_schedule(large_lr, large_steps, warmup), momentum=MOMENTUM,
                      wd=WEIGHT_DECAY)),
      (Run("LARS", f"lars_optax.lars (momentum {MOMENTUM}, eta {ETA}), warm-up + poly decay",
           large, large_lr, record_trust_ratios=True),
       lars_optax.lars(lr_schedule(large_lr, large_steps, warmup), momentum=MOMENTUM, eta=ETA,
                       wd=WEIGHT_DECAY, skip="flax")),
  ]
  runs = []
  for run, tx in configs:
    train(run, tx, model, params0, data, epochs=args.epochs, seed=args.seed, quiet=args.quiet)
    runs.append(run)

  print()
  print(format_table(runs))
  skip_flags = jax.tree.leaves(lars_optax.masks.FLAX_SKIP(params0))
  skipped = [name for (name, _), s in zip(lars_optax.named_leaves(params0), skip_flags) if s]
  lars_run = runs[-1]
  print("\nLARS trust ratios, first -> last step (biases are skipped: 1):")
  for name, values in lars_run.trust_ratios.items():
    if name not in skipped:
      print(f"  {name.removeprefix('params/'):16s} {values[0]:.4f} -> {values[-1]:.4f}")
  if not args.no_plot:
    plot(runs, args.out, skipped)
    print(f"\nwrote {args.out}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
