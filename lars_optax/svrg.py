r"""SVRG (stochastic variance-reduced gradient) as optax building blocks.

Johnson and Zhang, `Accelerating Stochastic Gradient Descent using Predictive
Variance Reduction <https://papers.nips.cc/paper/4937>`_, NeurIPS 2013; the
scheme of Apache MXNet's ``mxnet.contrib.svrg_optimization`` (``SVRGModule``).

Every ``update_freq`` epochs, at the start of the epoch, the current params are
kept as the *snapshot* :math:`\tilde w` and the full gradient
:math:`\mu = \nabla F(\tilde w)` (over the whole dataset) is computed. Each batch
then uses

.. math:: g_{svrg} = \nabla f_B(w) - \nabla f_B(\tilde w) + \mu,

an unbiased gradient whose variance vanishes as :math:`w` and :math:`\tilde w`
approach the optimum, and any optax optimizer takes the step.

The pieces:

* :func:`svrg` -- wraps an optimizer; its state holds :math:`\tilde w` and
  :math:`\mu`, and its ``update(grads, state, params, snapshot_grads=...)``
  forms :math:`g - \tilde g + \mu` before the wrapped optimizer sees it;
* :func:`value_and_grads` -- one jit-compiled call giving the batch loss
  and both gradients;
* :func:`full_gradient` -- :math:`\mu` over a dataset (a list of batches, or
  stacked arrays scanned with ``lax.scan``), batches weighted by their size;
* :func:`refresh` and :func:`due` -- store a new snapshot, and say
  whether an epoch starts with one.

A whole training loop, on least squares:

>>> import jax, jax.numpy as jnp, optax, lars_optax
>>> x = jax.random.normal(jax.random.key(0), (64, 3))
>>> batches = [(x[i:i + 16], x[i:i + 16] @ jnp.array([1.0, 2.0, 3.0]))
...            for i in range(0, 64, 16)]
>>> def loss_fn(params, batch):
...   xb, yb = batch
...   return 0.5 * jnp.mean((xb @ params - yb) ** 2)
>>> params, num_epochs = jnp.zeros(3), 20
>>> tx = lars_optax.svrg.svrg(optax.sgd(0.1))  # any optax optimizer (LARS: decay its lr)
>>> grads_fn = lars_optax.svrg.value_and_grads(loss_fn)
>>> state = tx.init(params)
>>> for epoch in range(num_epochs):
...   if lars_optax.svrg.due(epoch, update_freq=2):
...     mu = lars_optax.svrg.full_gradient(loss_fn, params, batches)
...     state = lars_optax.svrg.refresh(state, params, mu)
...   for batch in batches:
...     snap = lars_optax.svrg.snapshot(state)
...     loss, g, g_snap = grads_fn(params, snap, batch)
...     updates, state = tx.update(g, state, params, snapshot_grads=g_snap)
...     params = optax.apply_updates(params, updates)
>>> bool(jnp.allclose(params, jnp.array([1.0, 2.0, 3.0]), atol=1e-2))
True

``loss_fn(params, batch)`` returns the mean loss over the batch. For data
parallelism, pass ``axis_name`` to :func:`value_and_grads` and
:func:`full_gradient` inside ``pmap``/``shard_map`` (gradients are averaged
with ``lax.pmean``); under ``jit`` with sharded data the means are global
already.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from optax import GradientTransformation, GradientTransformationExtraArgs

from lars_optax import _utils as utils
from lars_optax import _validation as v

__all__ = [
  "SVRGState",
  "due",
  "full_gradient",
  "refresh",
  "snapshot",
  "svrg",
  "value_and_grads",
]

LossFn = Callable[[Any, Any], jax.Array]


class SVRGState(NamedTuple):
  """State of :func:`svrg`.

  Attributes:
    snapshot: the snapshot params :math:`\\tilde w`, or None before the first
      :func:`refresh`.
    full_grad: the full gradient :math:`\\mu` at the snapshot, or None.
    inner_state: the wrapped optimizer's state.

  The two fields change from None to arrays at the first
  :func:`refresh`, so a checkpoint written after it is restored into a
  template built the same way:
  ``refresh(tx.init(p), p, jax.tree.map(jnp.zeros_like, p))``.
  """

  snapshot: Any
  full_grad: Any
  inner_state: optax.OptState


@v.keyword_hints({})
def svrg(inner: GradientTransformation) -> GradientTransformationExtraArgs:
  r"""Feeds ``inner`` the SVRG gradient :math:`g - \tilde g + \mu`.

  ``update(grads, state, params, snapshot_grads=g_snap)`` takes the batch
  gradient at the current params (``grads``) and at the snapshot
  (``snapshot_grads``, the same batch), forms

  .. math:: g_{svrg} = g - \tilde g + \mu

  with :math:`\mu` from the state, and returns ``inner``'s update for
  :math:`g_{svrg}`. The snapshot and :math:`\mu` are set with
  :func:`refresh`; before that, ``update`` raises a ValueError.

  Args:
    inner: any optax transformation (``optax.sgd``, :func:`lars_optax.lars`,
      ...). It receives ``params`` and any extra arguments.

  Returns:
    An :class:`optax.GradientTransformationExtraArgs` with an
    :class:`SVRGState`.
  """
  v.check_transformation(inner)
  inner_tx = optax.with_extra_args_support(inner)

  def init_fn(params):
    return SVRGState(snapshot=None, full_grad=None, inner_state=inner_tx.init(params))

  def update_fn(updates, state, params=None, *, snapshot_grads=None, **extra_args):
    if state.full_grad is None:
      raise ValueError("svrg: no snapshot yet; compute the full gradient and call "
                       "lars_optax.svrg.refresh(state, params, full_grad) before the "
                       "first update (at the start of every update_freq-th epoch).")
    if snapshot_grads is None:
      raise ValueError("snapshot_grads: svrg's update needs the batch gradient at the "
                       "snapshot params: tx.update(grads, state, params, "
                       "snapshot_grads=...); see lars_optax.svrg.value_and_grads.")
    v.check_same_structure(snapshot_grads, updates, "snapshot_grads")
    v.check_same_structure(state.full_grad, updates, "svrg (full gradient vs gradients)")
    g = jax.tree.map(lambda a, b, m: (a - b.astype(a.dtype)) + m.astype(a.dtype),
                     updates, snapshot_grads, state.full_grad)
    new_updates, inner_state = inner_tx.update(g, state.inner_state, params, **extra_args)
    return new_updates, state._replace(inner_state=inner_state)

  return GradientTransformationExtraArgs(init_fn, update_fn)


def refresh(state: optax.OptState, params: Any, full_grad: Any) -> optax.OptState:
  """Stores ``params`` as the snapshot and ``full_grad`` as :math:`\\mu`.

  Works on the state of :func:`svrg` or on a state that contains one (e.g. a
  chain); returns the new state.

  Raises:
    ValueError: ``full_grad``'s tree does not match ``params``, or the state
      holds no :class:`SVRGState`.
  """
  v.check_same_structure(full_grad, params, "full_grad")
  snap = jax.tree.map(jnp.asarray, params)
  mu = jax.tree.map(lambda m, p: jnp.asarray(m, jnp.result_type(p)), full_grad, params)
  if utils.find_state(state, SVRGState) is None:
    raise ValueError("state: no SVRGState found; pass the state of lars_optax.svrg.svrg(...) "
                     "or of a chain containing it.")
  return optax.tree_utils.tree_set(state, snapshot=snap, full_grad=mu)


def snapshot(state: optax.OptState) -> Any:
  """The snapshot params :math:`\\tilde w` held in ``state``.

  Raises:
    ValueError: no :class:`SVRGState` in ``state``, or no snapshot yet.
  """
  found = utils.find_state(state, SVRGState)
  if found is None:
    raise ValueError("state: no SVRGState found; pass the state of lars_optax.svrg.svrg(...).")
  if found.snapshot is None:
    raise ValueError("svrg: no snapshot yet; call lars_optax.svrg.refresh first.")
  return found.snapshot


def due(epoch: int, *, update_freq: int) -> bool:
  """True when ``epoch`` (0-based) starts with a new snapshot: every ``update_freq``.

  MXNet's ``SVRGModule`` refreshes at epochs 0, ``update_freq``,
  ``2 * update_freq``, ...

  Raises:
    ValueError: ``update_freq`` is not an int >= 1, or ``epoch`` not an int >= 0.
  """
  v.check_count("update_freq", update_freq, minimum=1, arrays=False)
  v.check_count("epoch", epoch, arrays=False)
  return epoch % update_freq == 0


def _pmean(tree: Any, axis_name: str | None) -> Any:
  return utils.collective(jax.lax.pmean, tree, axis_name)


def _varies(x: Any, axis_name: str) -> bool:
  """Whether ``x`` is typed as varying over ``axis_name`` (``shard_map``)."""
  return axis_name in utils.vma(x)


def _mean_grads(loss: jax.Array, grads: Any, axis_name: str | None) -> Any:
  """The mean over ``axis_name`` of each device's gradient of its mean loss.

  Under ``pmap`` every gradient is the device's own: ``lax.pmean``. Under
  ``shard_map`` JAX already sums the gradient of a replicated (invariant)
  parameter over the axis when the loss varies over it (the transpose of the
  implicit broadcast); that sum is divided by the axis size instead.
  """
  if axis_name is None:
    return grads
  n = utils.collective(lambda _, a: jax.lax.axis_size(a), None, axis_name)  # unbound: clear error
  if not _varies(loss, axis_name):
    return _pmean(grads, axis_name)
  return jax.tree.map(lambda g: _pmean(g, axis_name) if _varies(g, axis_name) else g / n,
                      grads)


def value_and_grads(
    loss_fn: LossFn, *, axis_name: str | None = None, jit: bool = True,
) -> Callable[[Any, Any, Any], tuple[jax.Array, Any, Any]]:
  """One call giving ``(loss, grads at params, grads at snapshot)`` on a batch.

  Args:
    loss_fn: ``loss_fn(params, batch)``, the mean loss over the batch.
    axis_name: inside ``pmap``/``shard_map``, average the loss and both
      gradients over this axis (data parallelism).
    jit: compile the call with ``jax.jit`` (both gradients in one program).

  Returns:
    ``fn(params, snapshot_params, batch) -> (loss, grads, snapshot_grads)``;
    ``loss`` is at ``params``.
  """
  if not callable(loss_fn):
    raise TypeError(f"loss_fn: expected a callable, got {type(loss_fn).__name__}.")
  v.check_axis_name(axis_name)
  if not isinstance(jit, (bool, np.bool_)):
    raise TypeError(f"jit: expected a bool, got {jit!r}.")
  vg = jax.value_and_grad(loss_fn)

  def fn(params, snapshot_params, batch):
    loss, grads = vg(params, batch)
    snap_loss, snap_grads = vg(snapshot_params, batch)
    return (_pmean(loss, axis_name), _mean_grads(loss, grads, axis_name),
            _mean_grads(snap_loss, snap_grads, axis_name))

  return jax.jit(fn) if jit else fn


def _batch_size(batch: Any) -> int:
  leaves = jax.tree.leaves(batch)
  if not leaves or np.ndim(leaves[0]) == 0:
    raise ValueError("data: a batch must be a pytree of arrays with a leading batch axis.")
  return int(np.shape(leaves[0])[0])


def full_gradient(
    loss_fn: LossFn,
    params: Any,
    data: Iterable[Any] | Any,
    *,
    batch_size: int | None = None,
    axis_name: str | None = None,
) -> Any:
  r"""The full gradient :math:`\mu = \nabla F(w)` of the mean loss over ``data``.

  ``data`` is either

  * an iterable of batches (e.g. a list, or a data loader): each batch's
    gradient is computed by one jitted call and the gradients are averaged,
    weighted by batch size (the leading axis of the batch's first leaf), so
    a smaller last batch counts for what it holds. With equal batches this is
    the plain mean over batches that MXNet's ``SVRGModule`` takes; or
  * a pytree of stacked arrays, all with the whole dataset along axis 0, with
    ``batch_size``: the full batches are scanned with ``lax.scan`` in one
    compiled program and a last partial batch is added with its weight.

  Args:
    loss_fn: ``loss_fn(params, batch)``, the mean loss over the batch.
    params: where to take the gradient (the snapshot).
    data: see above.
    batch_size: required for stacked arrays; must be None for an iterable.
    axis_name: inside ``pmap``/``shard_map``, average over this axis too (each
      device holds its share of the data).

  Returns:
    A pytree like ``params``: float32 (or the params' dtype if wider).
  """
  if not callable(loss_fn):
    raise TypeError(f"loss_fn: expected a callable, got {type(loss_fn).__name__}.")
  v.check_axis_name(axis_name)
  vg = jax.value_and_grad(loss_fn)

  def grad_fn(params, batch):  # averaged over axis_name (each device: its share)
    loss, grads = vg(params, batch)
    return _mean_grads(loss, grads, axis_name)

  def acc_dtype(p):
    return jnp.promote_types(jnp.result_type(p), jnp.float32)

  if batch_size is not None:
    v.check_count("batch_size", batch_size, minimum=1, arrays=False)
    n = _batch_size(data)
    if any(np.shape(x)[:1] != (n,) for x in jax.tree.leaves(data)):
      raise ValueError("data: every array must have the same length along axis 0.")
    if n == 0:
      raise ValueError("data: the dataset is empty.")
    full, rest = divmod(n, batch_size)

    def run(params, data):
      total = jax.tree.map(lambda p: jnp.zeros(jnp.shape(p), acc_dtype(p)), params)
      if full:
        stacked = jax.tree.map(
            lambda x: x[:full * batch_size].reshape((full, batch_size, *x.shape[1:])), data)

        def body(acc, batch):
          g = grad_fn(params, batch)
          return jax.tree.map(lambda a, x: a + x.astype(a.dtype), acc, g), None

        total, _ = jax.lax.scan(body, total, stacked)
        total = jax.tree.map(lambda a: a * batch_size, total)
      if rest:
        last = jax.tree.map(lambda x: x[full * batch_size:], data)
        g = grad_fn(params, last)
        total = jax.tree.map(lambda a, x: a + x.astype(a.dtype) * rest, total, g)
      return jax.tree.map(lambda a: a / n, total)

    return run(params, data) if axis_name else jax.jit(run)(params, data)

  if isinstance(data, (dict, tuple)) and not isinstance(data, list) and _looks_stacked(data):
    raise ValueError("batch_size: data looks like stacked arrays (a pytree of arrays); "
                     "pass batch_size=..., or pass a list of batches.")
  step = (lambda p, b: grad_fn(p, b)) if axis_name else jax.jit(grad_fn)
  total, count = None, 0
  for batch in data:
    m = _batch_size(batch)
    g = step(params, batch)
    g = jax.tree.map(lambda x, p, m=m: x.astype(acc_dtype(p)) * m, g, params)
    total = g if total is None else jax.tree.map(jnp.add, total, g)
    count += m
  if total is None or count == 0:
    raise ValueError("data: no batches (the dataset is empty).")
  return jax.tree.map(lambda a: a / count, total)


def _looks_stacked(data: Any) -> bool:
  leaves = jax.tree.leaves(data)
  return bool(leaves) and all(hasattr(x, "shape") for x in leaves)
