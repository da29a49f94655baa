"""Times one optimizer step on a ResNet-50-shaped parameter tree.

One jit-compiled step = ``opt.update`` + ``optax.apply_updates`` with params and
optimizer state donated. All optimizers run in the same process, interleaved
round by round in a new random order each round (so a noisy neighbour hits them
all alike, and no row always runs after a step that frees large temporaries);
the table gives the median step time, its spread (interquartile range over the
median), its ratio to ``optax.sgd(momentum=0.9)`` measured in the same
run, its ratio to the optax peer (``PEERS``: ``optax.lars`` for LARS rows,
``optax.adam`` for Adam rows, ...), and the median compile time and its ratio.

Bandwidth: a step must read the params, the gradients and every state buffer
and write the params and the state once, so its fewest bytes are
``2 * params + grads + 2 * state`` (scalar state such as counts is left out).
The table gives those bytes over the step time and, as a fraction, over the
copy rate measured in the same run (one elementwise pass over a large donated
buffer, bytes read plus bytes written). On a GPU that fraction says how close a step
comes to the memory-bound floor.

    python benchmarks/step_time.py                    # markdown table on stdout
    python benchmarks/step_time.py --dtype bfloat16   # bfloat16 params, grads and state
    python benchmarks/step_time.py --rounds 50 --json out.json
    python benchmarks/step_time.py --quick            # a few seconds: a smoke test
    python benchmarks/step_time.py --scaling          # how the costs grow with the leaves

``--scaling`` builds an unrolled transformer-like tree (``stacked_layers.py``'s
blocks: 12 leaves each, hidden size ``--hidden``) of about 100 to 1,600 leaves
and reports, per optimizer and size, in one run: the compile time (lowering
included, median of ``--compiles``), the top-level kernels of the compiled
step per leaf (fusions and other launched operations of the entry
computation: each is a kernel launch on a GPU), the step time over
sgd-momentum's at the same size (rounds interleaved, shuffled), and the
step's share of the copy rate (the bytes it must move over its time, against
one elementwise pass over a buffer of the largest tree's size). ``--scaling
--only adam`` runs ``optax.adam`` and the dense-exact ``lars_optax.sparse.adam``
on the same dense leaves instead (rows run only when ``--only`` names them);
``--only optax.adam sparse.adam`` adds ``lars_optax.sparse.adam`` to the ResNet-50
table the same way. Both add ``sparse.adam(sparse=False)``: the leaves named as taking
no row-sparse gradient, so each takes ``optax.adam``'s step and keeps no rows.

``--scaling --tpu TOPOLOGY`` (e.g. ``v5e:2x2``) compiles the same steps for
one chip of a TPU topology instead, without a TPU (``libtpu``'s compiler,
``pip install ".[tpu-cost-model]"``, see ``tpu_cost_model.py``), and reports
per optimizer and size the compile time, the top-level fusions per leaf and
the sum of XLA's ``estimated_cycles`` over sgd-momentum's: cost-model
estimates, nothing runs on a TPU.

Only ratios are meaningful on a shared CPU; absolute times only on a GPU.
"""

from __future__ import annotations

import argparse
import gc
import importlib.metadata
import json
import platform
import random
import re
import statistics
import sys
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from resnet50_tree import resnet50_params
from stacked_layers import block_shapes

import lars_optax

LR = 0.1


# lars_optax function -> the optax optimizer it is compared with (a row of optimizers()).
PEERS = {"lars": "optax.lars", "tf_lars": "optax.lars", "adam": "optax.adam",
         "nag": "optax.sgd(momentum=0.9, nesterov=True)",
         "dcasgd": "optax.sgd(momentum=0.9)", "sgld": "optax.noisy_sgd",
         "adamw": "optax.adamw", "adamax": "optax.adamax", "nadam": "optax.nadam",
         "adabelief": "optax.adabelief"}
PEERS.update({"adagrad": "optax.adagrad", "groupadagrad": "optax.adagrad",
              "rmsprop": "optax.rmsprop", "adadelta": "optax.adadelta"})
PEERS.update({"lamb": "optax.lamb", "lans": "optax.lamb"})
PEERS.update({"timm_optimizer": "optax.lars", "timm_lars": "optax.lars", "timm_lamb": "optax.lamb"})
# Rows whose peer is not the one of their function's name: the ports of docs/porting.md.
ROW_PEERS = {
    "hand-written LARS step (the floor)": "optax.lars",
    "porting.optax_lars": "optax.lars",
    "porting.optax_lars(nesterov)": "optax.lars(nesterov=True)",
    "porting.optax_lamb(wd, eps_root)": "optax.lamb(eps_root)",
    "porting.timm_optimizer('cadamw', wd)": "optax.adamw",
}


def hand_written_lars(learning_rate: float, momentum: float = 0.9, eta: float = 0.001,
                      epsilon: float = 1e-8) -> optax.GradientTransformation:
  """The floor: MXNet's LARS step written directly, in the fewest passes it needs.

  Per leaf: one read of the weight and of the gradient for their norms (XLA
  fuses both sums into one pass), then one pass that reads gradient, weight
  and buffer and writes the buffer (the update is the buffer). 1-d leaves
  (biases, norm parameters) keep ratio 1, as MXNet's preset skips them on
  this tree. No checks, masks, logging or dtype handling: the distance from
  ``lars_optax.lars`` to this row is what all of those cost.
  """

  def init_fn(params):
    return jax.tree.map(jnp.zeros_like, params)

  def update_fn(grads, bufs, params=None):
    def leaf(g, m, w):
      if w.ndim <= 1:
        ratio = 1.0
      else:
        wn, gn = jnp.sqrt(jnp.sum(w * w)), jnp.sqrt(jnp.sum(g * g))
        ratio = jnp.where((wn > 0) & (gn > 0), eta * wn / (gn + epsilon), 1.0)
      return momentum * m - learning_rate * ratio * g

    new = jax.tree.map(leaf, grads, bufs, params)
    return new, new

  return optax.GradientTransformation(init_fn, update_fn)


def hand_written_lamb(learning_rate: float, b1: float = 0.9, b2: float = 0.999,
                      epsilon: float = 1e-6, wd: float = 0.01) -> optax.GradientTransformation:
  """The floor of a per-leaf LAMB step: ``lars_optax.lamb(learning_rate, wd=wd)``'s
  rule written directly, with a moment buffer per leaf as optax keeps them.

  Per leaf: the two moments, the bias-corrected Adam direction plus the decay,
  the two norms, the ratio (1 where a norm is 0) and the step. No checks,
  masks, bounds, logging or dtype handling: what any per-leaf LAMB must
  compile and run.
  """

  def init_fn(params):  # two buffers, not one tree twice: the step donates the state
    return (jnp.zeros([], jnp.int32), jax.tree.map(jnp.zeros_like, params),
            jax.tree.map(jnp.zeros_like, params))

  def update_fn(grads, state, params=None):
    count, mu, nu = state
    count = count + 1
    t = count.astype(jnp.float32)
    c1, c2 = 1 - b1**t, 1 - b2**t
    mu = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, mu, grads)
    nu = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, nu, grads)

    def leaf(m, v, w):
      d = (m / c1) / (jnp.sqrt(v / c2) + epsilon) + wd * w
      wn, dn = jnp.sqrt(jnp.sum(w * w)), jnp.sqrt(jnp.sum(d * d))
      return -learning_rate * jnp.where((wn > 0) & (dn > 0), wn / dn, 1.0) * d

    return jax.tree.map(leaf, mu, nu, params), (count, mu, nu)

  return optax.GradientTransformation(init_fn, update_fn)


def optimizers() -> dict[str, Callable[[], optax.GradientTransformation]]:
  """name -> factory, the baseline first."""
  return {
      "optax.sgd(momentum=0.9)": lambda: optax.sgd(LR, momentum=0.9),
      "optax.sgd": lambda: optax.sgd(LR),
      "optax.lars": lambda: optax.lars(LR),
      "lars_optax.lars(momentum=0.9)": lambda: lars_optax.lars(LR, momentum=0.9),
      "hand-written LARS step (the floor)": lambda: hand_written_lars(LR, momentum=0.9),
      "lars_optax.lars(momentum=0.9, wd, rescale_grad, clip_gradient)":
          lambda: lars_optax.lars(LR, momentum=0.9, wd=1e-4, rescale_grad=1 / 256,
                                  clip_gradient=1.0),
      "optax.lars(nesterov=True)": lambda: optax.lars(LR, nesterov=True),
      "porting.optax_lars": lambda: lars_optax.porting.optax_lars(LR),
      "porting.optax_lars(nesterov)": lambda: lars_optax.porting.optax_lars(LR, nesterov=True),
      "porting.timm_optimizer('lars', wd)":
          lambda: lars_optax.porting.timm_optimizer("lars", lr=LR, weight_decay=1e-4),
      "porting.timm_optimizer('nlarc', wd)":
          lambda: lars_optax.porting.timm_optimizer("nlarc", lr=LR, weight_decay=1e-4),
      "porting.timm_lars(dampening, always_adapt)":
          lambda: lars_optax.porting.timm_lars(LR, momentum=0.9, dampening=0.1,
                                               always_adapt=True),
      "lars_optax.lars(momentum=0.9, skip='flax', group_by_shape=True)":
          lambda: lars_optax.lars(LR, momentum=0.9, skip="flax", group_by_shape=True),
      "lars_optax.tf_lars": lambda: lars_optax.tf_lars(LR),
      "lars_optax.tf_lars(group_by_shape=True)":
          lambda: lars_optax.tf_lars(LR, group_by_shape=True),
      "lars_optax.tf_lars(use_nesterov, skip_list)":
          lambda: lars_optax.tf_lars(LR, use_nesterov=True, skip_list=["bias", "_bn_"]),
      "lars_optax.signum": lambda: lars_optax.signum(LR),
      "lars_optax.signum(wd, wd_lh, rescale_grad, clip_gradient)":
          lambda: lars_optax.signum(LR, wd=1e-4, wd_lh=1e-4, rescale_grad=1 / 256,
                                    clip_gradient=1.0),
      "optax.adam": lambda: optax.adam(1e-3),
      "lars_optax.mxnet.adam": lambda: lars_optax.mxnet.adam(1e-3),
      "lars_optax.mxnet.adam(wd, rescale_grad, clip_gradient)":
          lambda: lars_optax.mxnet.adam(1e-3, wd=1e-4, rescale_grad=1 / 256, clip_gradient=1.0),
      "lars_optax.mxnet.adam(lazy_update=True)":
          lambda: lars_optax.mxnet.adam(1e-3, lazy_update=True),
      "optax.sgd(momentum=0.9, nesterov=True)":
          lambda: optax.sgd(LR, momentum=0.9, nesterov=True),
      "lars_optax.mxnet.nag(momentum=0.9)": lambda: lars_optax.mxnet.nag(LR, momentum=0.9),
      "lars_optax.mxnet.nag(momentum=0.9, wd, rescale_grad, clip_gradient)":
          lambda: lars_optax.mxnet.nag(LR, momentum=0.9, wd=1e-4, rescale_grad=1 / 256,
                                 clip_gradient=1.0),
      "lars_optax.mxnet.dcasgd(momentum=0.9)": lambda: lars_optax.mxnet.dcasgd(LR, momentum=0.9),
      "optax.noisy_sgd": lambda: optax.noisy_sgd(1e-4, key=0),
      "lars_optax.mxnet.sgld": lambda: lars_optax.mxnet.sgld(1e-4),
      "optax.adagrad": lambda: optax.adagrad(0.01),
      "lars_optax.mxnet.adagrad": lambda: lars_optax.mxnet.adagrad(0.01),
      "lars_optax.mxnet.groupadagrad": lambda: lars_optax.mxnet.groupadagrad(0.01),
      "optax.rmsprop": lambda: optax.rmsprop(1e-3, eps_in_sqrt=False),
      "lars_optax.mxnet.rmsprop": lambda: lars_optax.mxnet.rmsprop(1e-3),
      "lars_optax.mxnet.rmsprop(wd, rescale_grad, clip_gradient, clip_weights)":
          lambda: lars_optax.mxnet.rmsprop(1e-3, wd=1e-4, rescale_grad=1 / 256, clip_gradient=1.0,
                                     clip_weights=10.0),
      "optax.rmsprop(centered=True, momentum=0.9)":
          lambda: optax.rmsprop(1e-3, centered=True, momentum=0.9),
      "lars_optax.mxnet.rmsprop(centered=True)":
          lambda: lars_optax.mxnet.rmsprop(1e-3, centered=True),
      "optax.adadelta": lambda: optax.adadelta(1.0),
      "lars_optax.mxnet.adadelta": lambda: lars_optax.mxnet.adadelta(),
      "lars_optax.mxnet.ftrl": lambda: lars_optax.mxnet.ftrl(),
      "optax.lamb": lambda: optax.lamb(1e-3, weight_decay=1e-4),
      "lars_optax.lamb(wd)": lambda: lars_optax.lamb(1e-3, wd=1e-4),
      "lars_optax.lamb(wd, bounds, clip_gradient, skip)":
          lambda: lars_optax.lamb(1e-3, wd=1e-4, lower_bound=1e-3, upper_bound=10.0,
                                  clip_gradient=1.0, skip=lars_optax.by_ndim(1)),
      "porting.timm_lamb(wd, trust_clip)":
          lambda: lars_optax.porting.timm_lamb(1e-3, weight_decay=1e-4, trust_clip=True,
                                               max_grad_norm=None),
      "porting.timm_lamb(wd, decoupled_decay)":
          lambda: lars_optax.porting.timm_lamb(1e-3, weight_decay=1e-4, decoupled_decay=True,
                                               max_grad_norm=None),
      "porting.timm_lamb(wd, caution)":
          lambda: lars_optax.porting.timm_lamb(1e-3, weight_decay=1e-4, caution=True,
                                               max_grad_norm=None),
      "optax.lamb(eps_root)": lambda: optax.lamb(1e-3, weight_decay=1e-4, eps_root=1e-8),
      "porting.optax_lamb(wd, eps_root)":
          lambda: lars_optax.porting.optax_lamb(1e-3, weight_decay=1e-4, eps_root=1e-8),
      "lars_optax.lans(wd)": lambda: lars_optax.lans(1e-3, wd=1e-4),
      "optax.adamw": lambda: optax.adamw(1e-3, weight_decay=1e-2),
      "lars_optax.mxnet.adamw(wd)": lambda: lars_optax.mxnet.adamw(1e-3, wd=1e-2),
      "porting.timm_optimizer('cadamw', wd)":
          lambda: lars_optax.porting.timm_optimizer("cadamw", lr=1e-3, weight_decay=1e-2,
                                                    filter_bias_and_bn=False),
      "optax.adamax": lambda: optax.adamax(2e-3),
      "lars_optax.mxnet.adamax": lambda: lars_optax.mxnet.adamax(2e-3),
      "optax.nadam": lambda: optax.nadam(1e-3),
      "lars_optax.mxnet.nadam": lambda: lars_optax.mxnet.nadam(1e-3),
      "optax.adabelief": lambda: optax.adabelief(1e-3),
      "lars_optax.mxnet.adabelief": lambda: lars_optax.mxnet.adabelief(1e-3),
      "lars_optax.mxnet.ftml": lambda: lars_optax.mxnet.ftml(2.5e-3),
  }


def tree_bytes(tree) -> int:
  """Bytes of the array leaves of ``tree`` with at least one dimension."""
  return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree)
             if hasattr(x, "dtype") and getattr(x, "ndim", 0) > 0)


def copy_rate(nbytes: int, rounds: int, steps: int = 1) -> float:
  """Copy rate in bytes/s (read + written), median of ``rounds``.

  Elementwise passes over a donated buffer (``-x`` in place, ``steps`` of them
  per call, like the optimizer steps): no allocation is timed.
  """
  negate = jax.jit(lambda x: jax.lax.fori_loop(0, steps, lambda _, a: -a, x),
                   donate_argnums=0)
  x = negate(jnp.ones((nbytes // 4,), jnp.float32))
  jax.block_until_ready(x)
  times = []
  for _ in range(rounds):
    t0 = time.perf_counter()
    x = negate(x)
    jax.block_until_ready(x)
    times.append((time.perf_counter() - t0) / steps)
  return 2 * x.size * 4 / statistics.median(times)


def make_step(opt: optax.GradientTransformation, steps: int = 1):
  """The jitted step, donating params and state; ``steps > 1`` runs that many in one call.

  Several steps in one call (a ``fori_loop``) time the device's work without the
  host's per-call dispatch, which grows with the number of leaves; a real train
  step pays that once for the whole model, not for the optimizer.
  """
  def step(params, state, grads):
    updates, state = opt.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  def loop(params, state, grads):
    return jax.lax.fori_loop(0, steps, lambda _, ps: step(*ps, grads), (params, state))

  return jax.jit(step if steps == 1 else loop, donate_argnums=(0, 1))


def time_in_rotation(runs: dict, grads, rounds: int, steps: int, seed: int = 0) -> None:
  """Times each run's compiled step (``run["fn"]`` on ``run["p"], run["s"]``,
  ``steps`` steps per call) ``rounds`` times, appending seconds per step to
  ``run["times"]``.

  A new order every round: a step that frees large temporaries slows the one
  after it, and a fixed order would charge that to the same row every time.
  """
  names, order = list(runs), random.Random(seed)
  for _ in range(rounds):
    order.shuffle(names)
    for name in names:
      run = runs[name]
      t0 = time.perf_counter()
      run["p"], run["s"] = run["fn"](run["p"], run["s"], grads)
      jax.block_until_ready((run["p"], run["s"]))
      run["times"].append((time.perf_counter() - t0) / steps)


def compile_time(factory, params, grads, repeats: int, text: bool = False):
  """Median seconds to lower and compile one step; with ``text``, also the compiled HLO."""
  times = []
  for _ in range(repeats):
    jax.clear_caches()
    opt = factory()
    state = jax.eval_shape(opt.init, params)
    t0 = time.perf_counter()
    compiled = make_step(opt).lower(params, state, grads).compile()
    times.append(time.perf_counter() - t0)
  if text:
    return statistics.median(times), compiled.as_text()
  return statistics.median(times)


def format_table(result: dict) -> str:
  """The results as a markdown table (ratios against the same run's peers)."""
  by_name = {r["optimizer"]: r for r in result["rows"]}
  tree = result.get("tree", "ResNet-50 tree")
  lines = [
      (f"{tree}: {result['leaves']} leaves, {result['parameters']:,} "
       f"{result['dtype']} parameters; {result['device']}; jax {result['jax']}, optax "
       f"{result['optax']}; median of {result['rounds']} calls of "
       f"{result['steps_per_call']} steps each, per step; copy rate "
       f"{result['copy_GBps']:.0f} GB/s (read + written)."), "",
      ("| optimizer | step (ms) | spread | step / sgd-momentum | step / peer | GB/s "
       "| of copy rate | compile (s) | compile / sgd-momentum |"),
      "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
  for r in result["rows"]:
    short = r["optimizer"].split("(")[0].rsplit(".", 1)[-1]
    peer_name = ROW_PEERS.get(r["optimizer"], PEERS.get(short, ""))
    peer = by_name.get(peer_name, {}).get("step_ms")
    vs_peer = f"{r['step_ms'] / peer:.2f}" if peer else "-"
    gbps = r["bytes"] / r["step_ms"] / 1e6
    spread = f"{r['spread']:.0%}" if "spread" in r else "-"
    lines.append(f"| `{r['optimizer']}` | {r['step_ms']:.3f} | {spread} | {r['step_ratio']:.2f} | "
                 f"{vs_peer} | {gbps:.0f} | {gbps / result['copy_GBps']:.0%} | "
                 f"{r['compile_s']:.2f} | {r['compile_ratio']:.2f} |")
  return "\n".join(lines)


# Rows of the ResNet-50 table that run only when --only names them: the dense-exact
# optimizer on a model's dense leaves compiles in about a minute on 2 cores.
_ON_REQUEST = {"lars_optax.sparse.adam": lambda: lars_optax.sparse.adam(1e-3),
               "lars_optax.sparse.adam(sparse=False)":
                   lambda: lars_optax.sparse.adam(1e-3, sparse=False)}


# The scaling table's optimizers: sgd-momentum (the baseline), then each rule and its optax peer.
SCALING = {
    "optax.sgd(momentum=0.9)": lambda: optax.sgd(LR, momentum=0.9),
    "optax.lars": lambda: optax.lars(LR),
    "lars_optax.lars(momentum=0.9, skip='flax')":
        lambda: lars_optax.lars(LR, momentum=0.9, skip="flax"),
    "lars_optax.lars(momentum=0.9, skip='flax', group_by_shape=True)":
        lambda: lars_optax.lars(LR, momentum=0.9, skip="flax", group_by_shape=True),
    "hand-written LARS step (the floor)": lambda: hand_written_lars(LR),
    "lars_optax.tf_lars": lambda: lars_optax.tf_lars(LR),
    "lars_optax.tf_lars(group_by_shape=True)": lambda: lars_optax.tf_lars(LR, group_by_shape=True),
    "optax.lamb": lambda: optax.lamb(1e-3, weight_decay=0.01),
    "lars_optax.lamb(wd)": lambda: lars_optax.lamb(1e-3, wd=0.01),
    "lars_optax.lamb(wd, group_by_shape=True)":
        lambda: lars_optax.lamb(1e-3, wd=0.01, group_by_shape=True),
    "hand-written LAMB step (the floor)": lambda: hand_written_lamb(1e-3, wd=0.01),
    "lars_optax.lans(wd)": lambda: lars_optax.lans(1e-3, wd=0.01),
    "lars_optax.lans(wd, group_by_shape=True)":
        lambda: lars_optax.lans(1e-3, wd=0.01, group_by_shape=True),
}
# The dense-exact optimizer on a model's dense leaves (the tower beside a table): its
# compile grows by about 0.3 s a leaf, so these rows run only when --only names them.
_SCALING_ON_REQUEST = {
    "optax.adam": lambda: optax.adam(1e-3),
    "lars_optax.sparse.adam": lambda: lars_optax.sparse.adam(1e-3),
    "lars_optax.sparse.adam(sparse=False)": lambda: lars_optax.sparse.adam(1e-3, sparse=False),
}
SCALING.update(_SCALING_ON_REQUEST)

# Operations of a compiled step that launch no kernel of their own.
_NOT_LAUNCHED = {"parameter", "constant", "tuple", "get-tuple-element", "bitcast", "call",
                 "while", "conditional", "optimization-barrier"}


def transformer_tree(blocks: int, hidden: int, dtype=jnp.float32) -> dict:
  """An unrolled transformer-like tree: ``blocks`` x 12 leaves (no embedding)."""
  key = jax.random.PRNGKey(0)
  shapes = {f"block_{i}/{n}": s for i in range(blocks) for n, s in block_shapes(hidden).items()}
  return {n: (0.02 * jax.random.normal(jax.random.fold_in(key, j), s)).astype(dtype)
          for j, (n, s) in enumerate(shapes.items())}


def launches(compiled_text: str) -> int:
  """The kernels one run of a compiled step launches, read from its HLO.

  Every operation of the entry computation, and of the computations it runs
  with ``call`` (on a GPU, the command buffers), counts, except those in
  ``_NOT_LAUNCHED``: a fusion, a library call or a copy is one kernel each.
  """
  called = set(re.findall(r" call\(.*?(?:to_apply|calls)=(%[\w.\-]+)", compiled_text))
  count, inside = 0, False
  for line in compiled_text.splitlines():
    head = re.match(r"^(ENTRY )?(%[\w.\-]+) \(", line)
    if head:
      inside = bool(head.group(1)) or head.group(2) in called
      continue
    if line.startswith("}"):
      inside = False
    elif inside and " = " in line:
      op = re.match(r"\s*(?:ROOT )?%\S+ = .*? ([\w\-]+)\(", line)
      if op and op.group(1) not in _NOT_LAUNCHED:
        count += 1
  return count


def scaling_factories(
    only: list[str] | None) -> dict[str, Callable[[], optax.GradientTransformation]]:
  """The scaling table's rows that ``only``'s substrings select; sgd-momentum (the baseline)
  always. Without ``only``, every row but the Adam pair (``_SCALING_ON_REQUEST``)."""
  return {k: f for k, f in SCALING.items()
          if k == next(iter(SCALING)) or (any(s in k for s in only) if only
                                          else k not in _SCALING_ON_REQUEST)}


def scaling(blocks: list[int], hidden: int, rounds: int, compiles: int, steps: int,
            only: list[str] | None) -> dict:
  """The scaling table's measurements (see the module docstring)."""
  facs = scaling_factories(only)
  rows = []
  for b in blocks:
    params = transformer_tree(b, hidden)
    grads = jax.tree.map(lambda p: 0.3 * p + 0.01, params)
    runs = {}
    for name, fac in facs.items():
      opt = fac()
      p = jax.tree.map(jnp.copy, params)
      s = opt.init(p)
      compiled = make_step(opt, steps).lower(p, s, grads).compile()
      p, s = compiled(p, s, grads)
      jax.block_until_ready((p, s))
      runs[name] = {"fn": compiled, "p": p, "s": s, "times": [],
                    "bytes": 2 * tree_bytes(p) + tree_bytes(grads) + 2 * tree_bytes(s)}
    time_in_rotation(runs, grads, rounds, steps, seed=b)
    base = statistics.median(runs[next(iter(runs))]["times"])
    for name, run in runs.items():
      del run["p"], run["s"], run["fn"]
      step = statistics.median(run["times"])
      seconds, text = compile_time(facs[name], params, grads, compiles, text=True)
      rows.append({"optimizer": name, "leaves": len(params), "step_ms": step * 1e3,
                   "step_ratio": step / base, "launches_per_leaf": launches(text) / len(params),
                   "compile_s": seconds, "bytes": run["bytes"]})
    gc.collect()
  device = jax.devices()[0]
  # The copy rate over a buffer as large as the largest tree's params, grads and state.
  largest = max(r["bytes"] for r in rows)
  return {"device": f"{device.platform}: {device.device_kind}", "jax": jax.__version__,
          "optax": optax.__version__, "hidden": hidden, "rounds": rounds,
          "steps_per_call": steps, "rows": rows,
          "copy_GBps": copy_rate(max(largest, 1 << 20), max(rounds, 5), steps) / 1e9}


def entry_fusions(compiled_text: str) -> int:
  """The fusions of a compiled program's entry computation (a TPU program's kernels)."""
  entry = compiled_text[compiled_text.index("\nENTRY "):]
  entry = entry[:entry.index("\n}")]
  return len(re.findall(r" = [^\n]*? fusion\(", entry))


def scaling_tpu(blocks: list[int], hidden: int, topology: str, compiles: int,
                only: list[str] | None) -> dict:
  """The scaling table compiled for one chip of a TPU ``topology`` (XLA's cost model)."""
  from jax.sharding import Mesh, NamedSharding, PartitionSpec
  from tpu_cost_model import estimated_cycles, tpu_devices

  devices = tpu_devices(topology)
  one_chip = NamedSharding(Mesh(devices[:1], ("data",)), PartitionSpec())
  placed = lambda tree: jax.tree.map(
      lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=one_chip), tree)
  facs = scaling_factories(only)
  rows, warm = [], False
  for b in blocks:
    params = placed(jax.eval_shape(lambda b=b: transformer_tree(b, hidden)))
    for name, fac in facs.items():
      state = placed(jax.eval_shape(fac().init, params))
      if not warm:  # the first compile of a process also starts the compiler
        make_step(fac()).lower(params, state, params).compile()
        warm = True
      times = []
      for _ in range(compiles):
        jax.clear_caches()
        t0 = time.perf_counter()
        compiled = make_step(fac()).lower(params, state, params).compile()
        times.append(time.perf_counter() - t0)
      leaves = len(jax.tree.leaves(params))
      rows.append({"optimizer": name, "leaves": leaves, "compile_s": statistics.median(times),
                   "cycles": estimated_cycles(compiled),
                   "fusions_per_leaf": entry_fusions(compiled.as_text()) / leaves})
      print(f"{name}, {leaves} leaves: compiled in {rows[-1]['compile_s']:.1f} s",
            file=sys.stderr, flush=True)
  return {"device": f"TPU {topology} (one chip, cost model)", "jax": jax.__version__,
          "libtpu": importlib.metadata.version("libtpu"), "optax": optax.__version__,
          "hidden": hidden, "compiles": compiles, "rows": rows}


def format_scaling_tpu(result: dict) -> str:
  """The TPU scaling table as markdown: one row per optimizer and size."""
  by = {(r["optimizer"], r["leaves"]): r for r in result["rows"]}
  base = result["rows"][0]["optimizer"]
  lines = [
      (f"Unrolled transformer-like tree (12 leaves a block, hidden size {result['hidden']}); "
       f"{result['device']}; jax {result['jax']}, libtpu {result.get('libtpu', '?')}, "
       f"optax {result['optax']}; compile: "
       f"lowering and libtpu's compile on the host, median of {result['compiles']}; "
       "fusions: top-level fusions of the compiled program, per leaf; cycles: the sum of "
       "XLA's estimated_cycles over sgd-momentum's (a cost-model estimate, not a "
       "measurement)."), "",
      "| optimizer | leaves | fusions / leaf | compile (s) | compile / sgd-m | cycles / sgd-m |",
      "|---|---:|---:|---:|---:|---:|"]
  for r in result["rows"]:
    b = by[(base, r["leaves"])]
    lines.append(f"| `{r['optimizer']}` | {r['leaves']:,} | {r['fusions_per_leaf']:.2f} | "
                 f"{r['compile_s']:.2f} | {r['compile_s'] / b['compile_s']:.1f} | "
                 f"{r['cycles'] / b['cycles']:.2f} |")
  return "\n".join(lines)


def format_scaling(result: dict) -> str:
  """The scaling table as markdown: one row per optimizer and size."""
  by = {(r["optimizer"], r["leaves"]): r for r in result["rows"]}
  base = result["rows"][0]["optimizer"]
  lines = [
      (f"Unrolled transformer-like tree (12 leaves a block, hidden size {result['hidden']}); "
       f"{result['device']}; jax {result['jax']}, optax {result['optax']}; step: median of "
       f"{result['rounds']} calls of {result['steps_per_call']} steps, over sgd-momentum's "
       "in the same run; compile: lowering and XLA compile; kernels: top-level operations "
       "of the compiled step that launch, per leaf; of copy rate: the bytes a step must move "
       "(2 x params + grads + 2 x state) over its time, as a fraction of "
       f"{result['copy_GBps']:.0f} GB/s (read + written), the rate of one elementwise pass "
       "in the same run."), "",
      ("| optimizer | leaves | kernels / leaf | compile (s) | compile / sgd-m | step (ms) "
       "| step / sgd-m | of copy rate |"),
      "|---|---:|---:|---:|---:|---:|---:|---:|"]
  for r in result["rows"]:
    c0 = by[(base, r["leaves"])]["compile_s"]
    share = r["bytes"] / (r["step_ms"] / 1e3) / (result["copy_GBps"] * 1e9)
    lines.append(f"| `{r['optimizer']}` | {r['leaves']:,} | {r['launches_per_leaf']:.2f} | "
                 f"{r['compile_s']:.2f} | {r['compile_s'] / c0:.1f} | {r['step_ms']:.3f} | "
                 f"{r['step_ratio']:.2f} | {share:.0%} |")
  return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--rounds", type=int, default=30, help="timed steps per optimizer")
  ap.add_argument("--compiles", type=int, default=3, help="compiles per optimizer")
  ap.add_argument("--only", nargs="*", help="substrings selecting optimizers")
  ap.add_argument("--steps-per-call", type=int, default=10,
                  help="optimizer steps per jitted call (a fori_loop); the table gives the "
                       "time per step (default: %(default)s)")
  ap.add_argument("--copy-mib", type=int, default=1024,
                  help="buffer size of the copy-rate measurement (default: %(default)s)")
  ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                  help="dtype of params, gradients and state (default: %(default)s)")
  ap.add_argument("--json", help="also write the results here")
  ap.add_argument("--quick", action="store_true",
                  help="the tree's first 20 leaves, 3 rounds, 1 compile, 3 optimizers: "
                       "a smoke test")
  ap.add_argument("--scaling", action="store_true",
                  help="the scaling table (transformer-like trees of ~100 to 1,600 leaves) "
                       "instead of the ResNet-50 table")
  ap.add_argument("--blocks", type=int, nargs="*", default=[8, 32, 96, 128],
                  help="--scaling: tree sizes in blocks of 12 leaves (default: %(default)s)")
  ap.add_argument("--hidden", type=int, default=128,
                  help="--scaling: the blocks' hidden size (default: %(default)s)")
  ap.add_argument("--tpu", metavar="TOPOLOGY",
                  help="--scaling: compile for one chip of this TPU topology (e.g. v5e:2x2) "
                       "and report XLA's cost model instead of timing on this machine "
                       "(needs libtpu)")
  first = ap.parse_args(argv)
  if first.quick:  # small defaults; explicit options still win
    ap.set_defaults(rounds=3, compiles=1, steps_per_call=2, copy_mib=64,
                    only=["lars_optax.lars(momentum=0.9)", "optax.lars"], blocks=[1, 2],
                    hidden=16)
  args = ap.parse_args(argv)
  if args.tpu and not args.scaling:
    ap.error("--tpu: only with --scaling (tpu_cost_model.py gives the ResNet-50 figures)")
  if args.scaling:
    if args.tpu:
      result = scaling_tpu(args.blocks, args.hidden, args.tpu, args.compiles, args.only)
      print(format_scaling_tpu(result))
    else:
      result = scaling(args.blocks, args.hidden, args.rounds, args.compiles,
                       args.steps_per_call, args.only)
      print(format_scaling(result))
    if args.json:
      with open(args.json, "w") as f:
        json.dump(result, f, indent=2)
    return result

  params = resnet50_params(dtype=jnp.dtype(args.dtype))
  if args.quick:
    params = dict(list(params.items())[:20])
  grads = jax.tree.map(lambda p: 0.3 * p + 0.01, params)
  n_leaves = len(jax.tree.leaves(params))
  n_params = sum(p.size for p in jax.tree.leaves(params))
  facs = optimizers()
  if args.only:
    base = next(iter(facs))
    facs = {k: f for k, f in {**facs, **_ON_REQUEST}.items()
            if k == base or any(s in k for s in args.only)}

  runs = {}
  for name, fac in facs.items():
    opt = fac()
    p = jax.tree.map(jnp.copy, params)
    s = opt.init(p)
    compiled = make_step(opt, args.steps_per_call).lower(p, s, grads).compile()
    p, s = compiled(p, s, grads)  # warm-up
    jax.block_until_ready((p, s))
    runs[name] = {"fn": compiled, "p": p, "s": s, "times": [],
                  "bytes": 2 * tree_bytes(p) + tree_bytes(grads) + 2 * tree_bytes(s)}
  time_in_rotation(runs, grads, args.rounds, args.steps_per_call, seed=0)
  for run in runs.values():
    del run["p"], run["s"], run["fn"]
  gc.collect()
  rate = copy_rate(args.copy_mib << 20, max(args.rounds, 5), args.steps_per_call)
  ctimes = {name: compile_time(fac, params, grads, args.compiles)
            for name, fac in facs.items()}

  base = next(iter(runs))
  b_step = statistics.median(runs[base]["times"])
  b_comp = ctimes[base]
  device = jax.devices()[0]
  result = {
      "device": f"{device.platform}: {device.device_kind}",
      "cpu_count": jax.local_device_count() if device.platform != "cpu" else None,
      "jax": jax.__version__, "optax": optax.__version__,
      "python": platform.python_version(),
      "leaves": n_leaves, "parameters": n_params, "rounds": args.rounds,
      "tree": "ResNet-50 tree" + (" (its first 20 leaves)" if args.quick else ""),
      "dtype": args.dtype, "copy_GBps": rate / 1e9, "steps_per_call": args.steps_per_call,
      "rows": [],
  }
  for name, run in runs.items():
    step = statistics.median(run["times"])
    q1, _, q3 = statistics.quantiles(run["times"], n=4) if len(run["times"]) > 1 else (step,) * 3
    result["rows"].append({
        "optimizer": name, "step_ms": step * 1e3, "step_ratio": step / b_step,
        "spread": (q3 - q1) / step,
        "bytes": run["bytes"],
        "compile_s": ctimes[name], "compile_ratio": ctimes[name] / b_comp})

  print(format_table(result))
  if args.json:
    with open(args.json, "w") as f:
      json.dump(result, f, indent=2)
  return result


if __name__ == "__main__":
  main()
