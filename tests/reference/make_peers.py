"""Produce the porting fixtures by running timm, torch.optim, Keras 3, optax and BYOL.

``tests/test_reference_peers.py`` checks each row of docs/porting.md's
"Porting from other libraries" table against the weights this script writes
to ``tests/reference/peers.json``. The tests read only that file: they never
need torch, timm or Keras. The case (params, gradients, learning rates) comes
from ``porting_case.py`` beside this file. SimCLR and ALBERT run in
TensorFlow: ``make_peers_tf.py``.

How to run it (from the repository root; torch 2.14.1 with torchvision 0.29.1
runs on the CPU, where a plain ``pip install torch`` would pull CUDA builds):

    python3 -m venv .venv-peers
    .venv-peers/bin/pip install "torch==2.14.1" "torchvision==0.29.1" timm keras \
        jax optax dm-tree
    KERAS_BACKEND=jax .venv-peers/bin/python tests/reference/make_peers.py

BYOL's optimizer is imported from ``../shared/peers/byol_optimizers.py`` (a
copy of deepmind-research's ``byol/utils/optimizers.py``); pass another
directory with ``--peers``.

Each row runs its peer for 12 steps twice: with a constant learning rate and
with the warm-up-then-cosine rate of ``porting_case.lr_factors`` (set on the
param groups before each step, as timm's schedulers do; a Keras
``LearningRateSchedule``; BYOL's optimizer rebuilt with the step's rate, as
BYOL's training loop does; an optax schedule). It records the final weights.
Running it again gives the same file.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys

os.environ.setdefault("KERAS_BACKEND", "jax")

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import porting_case as case  # noqa: E402

LARS_LR, LARS_ETA, LARS_WD, MOMENTUM = 0.1, 0.02, 5e-3, 0.9
LAMB_LR, LAMB_WD = 0.01, 0.01


def _lrs(base, schedule):
  return [base * f for f in case.lr_factors()] if schedule else [base] * case.STEPS


# --------------------------------------------------------------------------
# timm and torch.optim
# --------------------------------------------------------------------------


def _torch_model():
  import torch

  class Leaf(torch.nn.Module):
    def __init__(self, arrays):
      super().__init__()
      for k, x in arrays.items():
        setattr(self, k, torch.nn.Parameter(torch.tensor(x)))

  class Model(torch.nn.Module):
    def __init__(self):
      super().__init__()
      for module, arrays in case.nested(case.initial_params()).items():
        setattr(self, module, Leaf(arrays))

    def group_matcher(self, coarse=False):
      """As timm's models write it: a stem, blocks (the frozen layer joins the previous
      group through timm's (99999,) suffix), and the rest (zero_init) the head."""
      del coarse
      return {"stem": r"^conv", "blocks": [(r"^(?:batch_norm|linear)\.", None),
                                           (r"^frozen", (99999,))]}

  return Model()


def _run_torch(make_optimizer, schedule, base_lr):
  import torch
  model = _torch_model()
  opt = make_optimizer(model)
  named = dict(model.named_parameters())
  for t, (lr, grads) in enumerate(zip(_lrs(base_lr, schedule), case.gradients())):
    del t
    for group in opt.param_groups:
      group["lr"] = lr * group.get("lr_scale", 1.0)  # as timm's schedulers set it
    for name, g in grads.items():
      named[name.replace("/", ".")].grad = torch.tensor(g)
    opt.step()
  return {name: named[name.replace("/", ".")].detach().numpy().copy() for name in case.LEAVES}


def timm_rows():
  from timm.optim import Lamb, Lars, create_optimizer_v2

  def factory(opt, base_lr, no_weight_decay=None, **kw):
    def make(model):
      if no_weight_decay is not None:  # the model's no_weight_decay(), as timm's models have it
        model.no_weight_decay = lambda: set(no_weight_decay)
      return create_optimizer_v2(model, opt, lr=base_lr, **kw)
    return make

  lars_kw = {"weight_decay": LARS_WD, "momentum": MOMENTUM, "trust_coeff": LARS_ETA}
  lamb_kw = {"weight_decay": LAMB_WD}
  rows = {
      "timm_lars": (factory("lars", LARS_LR, **lars_kw), LARS_LR,
                    ("create_optimizer_v2(model, 'lars', lr, weight_decay, momentum=0.9, "
                    "trust_coeff)")),
      "timm_larc": (factory("larc", LARS_LR, **lars_kw), LARS_LR, "... 'larc' ..."),
      "timm_nlars": (factory("nlars", LARS_LR, **lars_kw), LARS_LR, "... 'nlars' ..."),
      "timm_nlarc": (factory("nlarc", LARS_LR, **lars_kw), LARS_LR, "... 'nlarc' ..."),
      "timm_lars_dampening": (factory("lars", LARS_LR, dampening=0.1, **lars_kw), LARS_LR,
                              "... 'lars', dampening=0.1 ..."),
      "timm_lars_always_adapt": (factory("lars", LARS_LR, always_adapt=True, **lars_kw),
                                 LARS_LR, "... 'lars', always_adapt=True ..."),
      "timm_lars_class": (lambda model: Lars(model.parameters(), lr=LARS_LR, momentum=MOMENTUM,
                                             weight_decay=LARS_WD, trust_coeff=LARS_ETA),
                          LARS_LR, ("Lars(model.parameters(), lr, momentum=0.9, weight_decay, "
                          "trust_coeff) (one group: every leaf decays and gets a ratio)")),
      "timm_lamb": (factory("lamb", LAMB_LR, **lamb_kw), LAMB_LR,
                    "create_optimizer_v2(model, 'lamb', lr, weight_decay=0.01)"),
      "timm_lambc": (factory("lambc", LAMB_LR, **lamb_kw), LAMB_LR, "... 'lambc' ..."),
      "timm_lambw": (factory("lambw", LAMB_LR, **lamb_kw), LAMB_LR, "... 'lambw' ..."),
      "timm_clamb": (factory("clamb", LAMB_LR, **lamb_kw), LAMB_LR, "... 'clamb' ..."),
      "timm_lamb_no_grad_averaging": (factory("lamb", LAMB_LR, grad_averaging=False, **lamb_kw),
                                      LAMB_LR, "... 'lamb', grad_averaging=False ..."),
      # Layer-wise rate decay (timm's param_groups_layer_decay; scales applied as its
      # schedulers apply them).
      "timm_lamb_layer_decay": (factory("lamb", LAMB_LR, layer_decay=0.75, **lamb_kw),
                                LAMB_LR, "... 'lamb', layer_decay=0.75 (group_matcher)"),
      "timm_lars_layer_decay_no_opt": (
          factory("lars", LARS_LR, layer_decay=0.5, layer_decay_min_scale=0.2,
                  layer_decay_no_opt_scale=0.3, **lars_kw), LARS_LR,
          ("... 'lars', layer_decay=0.5, layer_decay_min_scale=0.2, "
          "layer_decay_no_opt_scale=0.3")),
      # timm's corrected decay, lr**2 / max_lr (max_lr: the constructor's rate, the
      # scheduler's peak), with and without the layer scales (a group decays by its
      # scaled rate, squared).
      "timm_lambw_corrected": (factory("lambw", LAMB_LR, corrected_weight_decay=True,
                                       weight_decay=0.1), LAMB_LR,
                               "... 'lambw', weight_decay=0.1, corrected_weight_decay=True"),
      "timm_lambw_corrected_layer_decay": (
          factory("lambw", LAMB_LR, corrected_weight_decay=True, layer_decay=0.75,
                  weight_decay=0.5), LAMB_LR,
          "... 'lambw', weight_decay=0.5, corrected_weight_decay=True, layer_decay=0.75"),
      # The model's no_weight_decay(): fnmatch patterns on dotted names, kept out of decay
      # (and the trust ratio) whatever filter_bias_and_bn says.
      "timm_lambw_no_weight_decay_patterns": (
          factory("lambw", LAMB_LR, no_weight_decay={"linear.*"}, weight_decay=0.5,
                  filter_bias_and_bn=False), LAMB_LR,
          ("... 'lambw', weight_decay=0.5, filter_bias_and_bn=False, model.no_weight_decay() "
           "= {'linear.*'}")),
      "timm_lars_no_weight_decay": (
          factory("lars", LARS_LR, no_weight_decay={"zero_init.w"}, **lars_kw), LARS_LR,
          "... 'lars', model.no_weight_decay() = {'zero_init.w'}"),
      "timm_cadamw": (factory("cadamw", LAMB_LR, **lamb_kw), LAMB_LR,
                      "create_optimizer_v2(model, 'cadamw', lr, weight_decay=0.01)"),
      "timm_lamb_class": (lambda model: Lamb(model.parameters(), lr=LAMB_LR), LAMB_LR,
                          ("Lamb(model.parameters(), lr) (its defaults: weight_decay=0.01, "
                          "max_grad_norm=1.0, one group)")),
  }
  return {key: {"peer": f"timm {desc}",
                "constant": _run_torch(make, False, base),
                "warmup": _run_torch(make, True, base)}
          for key, (make, base, desc) in rows.items()}


def sparse_adam_row():
  """torch.optim.SparseAdam on an embedding table (constant and scheduled rate), and
  with maximize=True."""
  import torch
  rows_out = {}
  for key, kw in (("torch_sparse_adam", {}), ("torch_sparse_adam_maximize",
                                              {"maximize": True})):
    out = {"peer": "torch.optim.SparseAdam(params, lr=0.01"
                   + "".join(f", {k}={v}" for k, v in kw.items()) + ")"}
    for mode, schedule in (("constant", False), ("warmup", True)):
      table, grads = case.embedding_case()
      weight = torch.nn.Parameter(torch.tensor(table))
      opt = torch.optim.SparseAdam([weight], lr=0.01, **kw)
      for lr, (rows, values) in zip(_lrs(0.01, schedule), grads):
        opt.param_groups[0]["lr"] = lr
        weight.grad = torch.sparse_coo_tensor(torch.tensor([rows]), torch.tensor(values),
                                              case.EMBED_SHAPE)
        opt.step()
      out[mode] = {"embedding": weight.detach().numpy().copy()}
    rows_out[key] = out
  return rows_out


# --------------------------------------------------------------------------
# Keras 3 (JAX backend)
# --------------------------------------------------------------------------


def _run_keras(make_optimizer, schedule, base_lr):
  import keras
  lrs = np.asarray(_lrs(base_lr, schedule), np.float32)

  class Table(keras.optimizers.schedules.LearningRateSchedule):
    def __call__(self, step):
      return keras.ops.take(keras.ops.convert_to_tensor(lrs), keras.ops.cast(step, "int32"))

  variables = {name: keras.Variable(x, name=name.replace("/", "_"))
               for name, x in case.initial_params().items()}
  opt = make_optimizer(Table() if schedule else base_lr)
  names = list(variables)
  for grads in case.gradients():
    opt.apply([keras.ops.convert_to_tensor(grads[n]) for n in names],
              [variables[n] for n in names])
  return {n: np.asarray(variables[n].numpy()) for n in names}


def keras_rows():
  import keras
  rows = {
      "keras_lamb": (lambda lr: keras.optimizers.Lamb(learning_rate=lr),
                     "keras.optimizers.Lamb(learning_rate)"),
      "keras_lamb_weight_decay": (
          lambda lr: keras.optimizers.Lamb(learning_rate=lr, weight_decay=LAMB_WD),
          "keras.optimizers.Lamb(learning_rate, weight_decay=0.01)"),
      # The base optimizer's clips, at bounds the case's gradients cross.
      "keras_lamb_clipnorm": (
          lambda lr: keras.optimizers.Lamb(learning_rate=lr, weight_decay=LAMB_WD,
                                           clipnorm=0.1),
          "keras.optimizers.Lamb(learning_rate, weight_decay=0.01, clipnorm=0.1)"),
      "keras_lamb_global_clipnorm": (
          lambda lr: keras.optimizers.Lamb(learning_rate=lr, global_clipnorm=0.5),
          "keras.optimizers.Lamb(learning_rate, global_clipnorm=0.5)"),
      "keras_lamb_clipvalue": (
          lambda lr: keras.optimizers.Lamb(learning_rate=lr, clipvalue=0.05),
          "keras.optimizers.Lamb(learning_rate, clipvalue=0.05)"),
      # Accumulation: a step every 3 calls from the mean gradient; the schedule reads
      # every call, the bias correction counts steps.
      "keras_lamb_accumulation": (
          lambda lr: keras.optimizers.Lamb(learning_rate=lr, weight_decay=LAMB_WD,
                                           global_clipnorm=0.5, gradient_accumulation_steps=3),
          ("keras.optimizers.Lamb(learning_rate, weight_decay=0.01, global_clipnorm=0.5, "
           "gradient_accumulation_steps=3)")),
  }
  return {key: {"peer": desc, "constant": _run_keras(make, False, LAMB_LR),
                "warmup": _run_keras(make, True, LAMB_LR)}
          for key, (make, desc) in rows.items()}


# --------------------------------------------------------------------------
# optax and BYOL
# --------------------------------------------------------------------------


def _keep(tree):
  """optax's masks: True where decay and ratio apply (leaves of 2 or more dims)."""
  import jax
  return jax.tree.map(lambda x: x.ndim > 1, tree)


def _run_optax(make_tx, schedule, base_lr):
  import jax
  import jax.numpy as jnp
  import optax
  lr = (optax.warmup_cosine_decay_schedule(0.1 * base_lr, base_lr, case.WARMUP_STEPS,
                                           case.STEPS, 0.1 * base_lr)
        if schedule else base_lr)
  params = jax.tree.map(jnp.asarray, case.nested(case.initial_params()))
  tx = make_tx(lr)
  state = tx.init(params)
  for grads in case.gradients():
    g = jax.tree.map(jnp.asarray, case.nested(grads))
    updates, state = tx.update(g, state, params)
    params = optax.apply_updates(params, updates)
  return {k: np.asarray(v) for k, v in case.flat(params).items()}


def _wd_schedule(wd):
  import optax
  return optax.linear_schedule(wd, 0.1 * wd, case.STEPS)


def optax_rows():
  import optax
  rows = {
      "optax_lars": (lambda lr: optax.lars(lr, weight_decay=LARS_WD, weight_decay_mask=_keep,
                                           trust_coefficient=LARS_ETA, trust_ratio_mask=_keep,
                                           momentum=MOMENTUM), LARS_LR,
                     ("optax.lars(lr, weight_decay, weight_decay_mask=keep, trust_coefficient, "
                     "trust_ratio_mask=keep, momentum=0.9)")),
      "optax_lars_nesterov": (lambda lr: optax.lars(lr, weight_decay=LARS_WD,
                                                    weight_decay_mask=_keep,
                                                    trust_coefficient=LARS_ETA,
                                                    trust_ratio_mask=_keep, momentum=MOMENTUM,
                                                    nesterov=True), LARS_LR,
                              "optax.lars(..., nesterov=True)"),
      "optax_lamb": (lambda lr: optax.lamb(lr, weight_decay=LAMB_WD, mask=_keep), LAMB_LR,
                     "optax.lamb(lr, weight_decay=0.01, mask=keep)"),
      "optax_lamb_eps_root": (lambda lr: optax.lamb(lr, weight_decay=LAMB_WD, mask=_keep,
                                                    eps_root=1e-6), LAMB_LR,
                              "optax.lamb(lr, weight_decay=0.01, mask=keep, eps_root=1e-6)"),
      # weight_decay as a schedule (optax calls it with its own count, from 0).
      "optax_lars_wd_schedule": (
          lambda lr: optax.lars(lr, weight_decay=_wd_schedule(LARS_WD),
                                weight_decay_mask=_keep, trust_coefficient=LARS_ETA,
                                trust_ratio_mask=_keep, momentum=MOMENTUM), LARS_LR,
          "optax.lars(..., weight_decay=optax.linear_schedule(wd, 0.1 wd, 12))"),
      "optax_lamb_wd_schedule": (
          lambda lr: optax.lamb(lr, weight_decay=_wd_schedule(LAMB_WD), mask=_keep), LAMB_LR,
          "optax.lamb(..., weight_decay=optax.linear_schedule(0.01, 0.001, 12))"),
  }
  return {key: {"peer": desc, "constant": _run_optax(make, False, base),
                "warmup": _run_optax(make, True, base)}
          for key, (make, base, desc) in rows.items()}


def byol_rows(peers_dir):
  import jax
  import jax.numpy as jnp
  import optax
  sys.path.insert(0, str(peers_dir))
  import byol_optimizers as byol

  def run(schedule):
    params = jax.tree.map(jnp.asarray, case.nested(case.initial_params()))
    state = None
    for lr, grads in zip(_lrs(LARS_LR, schedule), case.gradients()):
      # BYOL's loop builds the optimizer with the step's learning rate.
      tx = byol.lars(lr, weight_decay=LARS_WD, momentum=MOMENTUM, eta=LARS_ETA,
                     weight_decay_filter=byol.exclude_bias_and_norm,
                     lars_adaptation_filter=byol.exclude_bias_and_norm)
      state = tx.init(params) if state is None else state
      updates, state = tx.update(jax.tree.map(jnp.asarray, case.nested(grads)), state, params)
      params = optax.apply_updates(params, updates)
    return {k: np.asarray(v) for k, v in case.flat(params).items()}

  return {"byol_lars": {"peer": "byol.utils.optimizers.lars(lr, weight_decay, momentum=0.9, "
                                "eta, weight_decay_filter=exclude_bias_and_norm, "
                                "lars_adaptation_filter=exclude_bias_and_norm)",
                        "constant": run(False), "warmup": run(True)}}


# --------------------------------------------------------------------------


def versions():
  import importlib.metadata as md
  return {p: md.version(p) for p in ("torch", "timm", "keras", "jax", "optax", "numpy")}


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--peers", default=str(HERE.parents[2] / "shared" / "peers"),
                      help="directory holding byol_optimizers.py")
  parser.add_argument("--out", default=str(HERE / "peers.json"))
  args = parser.parse_args()
  rows = {**timm_rows(), **sparse_adam_row(), **keras_rows(), **optax_rows(),
          **byol_rows(args.peers)}
  case.write_fixture(args.out, "tests/reference/make_peers.py", versions(),
                     {"lars_lr": LARS_LR, "lars_eta": LARS_ETA, "lars_wd": LARS_WD,
                      "momentum": MOMENTUM, "lamb_lr": LAMB_LR, "lamb_wd": LAMB_WD}, rows)


if __name__ == "__main__":
  main()
