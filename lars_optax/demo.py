"""A short LARS training run on real data: ``python -m lars_optax.demo``.

Trains a small MLP on scikit-learn's bundled 8x8 handwritten digits (1,797
images, shipped inside scikit-learn: nothing is downloaded) three ways:

* small-batch SGD with momentum (the baseline recipe),
* large-batch SGD with momentum, learning rate scaled linearly with the batch,
* large-batch LARS (:func:`lars_optax.lars`, MXNet flavour) with the same
  linear scaling, warm-up and polynomial decay, as the LARS paper recommends.

It prints a table of test accuracy and wall time, and the per-layer trust
ratios of the last LARS step (bias leaves are skipped by MXNet's rule and show
1.0). Needs the ``demo`` extra: ``pip install "lars_optax[demo]"``.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

import lars_optax


def load_digits(seed: int, test_fraction: float = 0.25):
  """Standardised digits features, split into train and test sets."""
  try:
    from sklearn.datasets import load_digits as sk_load_digits
  except ImportError:
    sys.exit('The demo needs scikit-learn: pip install "lars_optax[demo]"')
  x, y = sk_load_digits(return_X_y=True)
  x = (x / 16.0).astype(np.float32)
  rng = np.random.default_rng(seed)
  order = rng.permutation(len(x))
  n_test = int(len(x) * test_fraction)
  test, train = order[:n_test], order[n_test:]
  mean, std = x[train].mean(0), x[train].std(0) + 1e-3
  x = (x - mean) / std
  return (x[train], y[train].astype(np.int32)), (x[test], y[test].astype(np.int32))


def init_mlp(key: jax.Array, sizes: Sequence[int]) -> dict[str, jax.Array]:
  """MXNet-style names (``fc1_weight``, ``fc1_bias``) so MXNET_SKIP applies."""
  params = {}
  for i, (n_in, n_out) in enumerate(itertools.pairwise(sizes), start=1):
    key, sub = jax.random.split(key)
    params[f"fc{i}_weight"] = jax.random.normal(sub, (n_in, n_out)) * np.sqrt(2.0 / n_in)
    params[f"fc{i}_bias"] = jnp.zeros((n_out,))
  return params


def forward(params: dict[str, jax.Array], x: jax.Array) -> jax.Array:
  n_layers = len(params) // 2
  for i in range(1, n_layers + 1):
    x = x @ params[f"fc{i}_weight"] + params[f"fc{i}_bias"]
    if i < n_layers:
      x = jax.nn.relu(x)
  return x


def loss_fn(params, x, y):
  logits = forward(params, x)
  return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()


def train(opt: optax.GradientTransformation, params, data, *, epochs: int,
          batch_size: int, seed: int):
  (x_tr, y_tr), (x_te, y_te) = data
  state = opt.init(params)

  @jax.jit
  def step(params, state, x, y):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    updates, state = opt.update(grads, state, params)
    return optax.apply_updates(params, updates), state, loss

  @jax.jit
  def accuracy(params, x, y):
    return jnp.mean(jnp.argmax(forward(params, x), -1) == y)

  rng = np.random.default_rng(seed)
  steps_per_epoch = max(len(x_tr) // batch_size, 1)
  t0 = time.perf_counter()
  loss = jnp.nan
  for _ in range(epochs):
    order = rng.permutation(len(x_tr))
    for s in range(steps_per_epoch):
      idx = order[s * batch_size:(s + 1) * batch_size]
      params, state, loss = step(params, state, x_tr[idx], y_tr[idx])
  acc = float(accuracy(params, x_te, y_te))
  return params, state, float(loss), acc, time.perf_counter() - t0


def positive_int(text: str) -> int:
  try:
    value = int(text)
  except ValueError:
    raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
  if value <= 0:
    raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
  return value


def main(argv: Sequence[str] | None = None) -> int:
  ap = argparse.ArgumentParser(prog="python -m lars_optax.demo",
                               description=__doc__.splitlines()[0])
  ap.add_argument("--epochs", type=positive_int, default=30)
  ap.add_argument("--small-batch", type=positive_int, default=32)
  ap.add_argument("--large-batch", type=positive_int, default=512)
  ap.add_argument("--seed", type=int, default=0)
  args = ap.parse_args(argv)

  data = load_digits(args.seed)
  n_train = len(data[0][0])
  if args.large_batch > n_train or args.small_batch > n_train:
    ap.error(f"batch sizes must be at most the {n_train} training images")
  params0 = init_mlp(jax.random.key(args.seed), (64, 128, 64, 10))
  base_lr, base_batch = 0.05, args.small_batch
  scale = args.large_batch / base_batch
  large_steps = args.epochs * max(n_train // args.large_batch, 1)
  warmup = max(large_steps // 5, 1)
  lars_lr = 8.0  # LARS's lr multiplies the trust ratio, eta * |w| / |g|, ~1e-2 here
  lars_schedule = optax.join_schedules(
      [optax.linear_schedule(0.0, lars_lr, warmup),
       optax.polynomial_schedule(lars_lr, 0.0, power=2,
                                 transition_steps=max(large_steps - warmup, 1))],
      [warmup])
  runs = [
      ("SGD + momentum", args.small_batch, optax.sgd(base_lr, momentum=0.9)),
      ("SGD + momentum, linear lr scaling", args.large_batch,
       optax.sgd(base_lr * scale, momentum=0.9)),
      ("LARS (lars_optax.lars), warm-up + poly decay", args.large_batch,
       lars_optax.lars(lars_schedule, momentum=0.9, eta=0.001, wd=1e-4)),
  ]
  print(f"digits: {n_train} train / {len(data[1][0])} test images, MLP 64-128-64-10, "
        f"{args.epochs} epochs, jax {jax.__version__} on {jax.devices()[0].platform}\n")
  rows = []
  last_state = params = None
  for name, batch, opt in runs:
    params, state, loss, acc, secs = train(opt, params0, data, epochs=args.epochs,
                                           batch_size=batch, seed=args.seed)
    rows.append((name, batch, loss, acc, secs))
    last_state = state
  print(f"| {'optimizer':46s} | batch | final loss | test accuracy | wall time |")
  print(f"|{'-' * 48}|------:|-----------:|--------------:|----------:|")
  for name, batch, loss, acc, secs in rows:
    print(f"| {name:46s} | {batch:5d} | {loss:10.4f} | {acc:13.3f} | {secs:8.2f}s |")
  print("\nTrust ratios of the last LARS step (bias leaves skipped: 1.0):")
  for leaf, r in lars_optax.trust_ratios(last_state, params).items():
    print(f"  {leaf:12s} {float(r):.5f}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
