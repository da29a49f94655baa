"""``create(name, **kwargs)``: build an optimizer by name, as ``mx.optimizer.create`` does.

Porting an MXNet training script usually means porting a line such as
``mx.optimizer.create('adam', learning_rate=..., wd=..., lr_scheduler=...)``.
:func:`create` takes the same name and the same arguments and returns the
matching optax transformation. Parameter names come from the tree paths of the
params (see :mod:`lars_optax.masks`), so ``lr_mult``/``wd_mult`` are dicts keyed
by leaf name and no ``param_idx2name`` is needed.

:func:`register` adds a user optimizer under a new name.
"""

from __future__ import annotations

import copy
import difflib
import inspect
import threading
import warnings
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from lars_optax import _utils as utils
from lars_optax import _validation as v
from lars_optax import precision
from lars_optax._lamb import lamb
from lars_optax._lans import lans
from lars_optax._lars import lars
from lars_optax.mxnet import _adagrad_family as adagrad_family
from lars_optax.mxnet import _adam_family as adam_family
from lars_optax.mxnet import _sgd_family as sgd_family
from lars_optax.sign import signsgd, signum

__all__ = ["BASE_ARGS", "create", "mxnet_schedule", "register", "registered"]

Factory = Callable[..., optax.GradientTransformation]

BASE_ARGS = ("learning_rate", "wd", "rescale_grad", "clip_gradient", "lr_scheduler",
             "begin_num_update", "multi_precision", "lr_mult", "wd_mult")
"""MXNet optimizer-base arguments that :func:`create` accepts for every name."""

# Accepted for compatibility and ignored: we follow MXNet's default path (fused,
# multi-tensor where it has one); its other paths give the same numbers except
# LAMB's single-tensor kernels (see create's docstring) and the plain-Python
# steps of AdamW and LANS (rejected below).
_NO_OP_ARGS = ("use_fused_step", "aggregate_num")

_UNFUSED_WHY = ("MXNet's plain-Python step (use_fused_step=False) follows another rule than "
                "its fused {kernel} kernel, which this optimizer reproduces: {how}")

# MXNet flags that a built-in optimizer takes only at MXNet's default (which
# changes nothing): name -> flag -> (that default, why no other value).
_DEFAULT_ONLY: dict[str, dict[str, tuple[bool, str]]] = {
    "lars": {"lazy_update": (False, ("LARS's trust ratio is taken from the norm of the "
                                     "whole layer, so rows cannot be updated on their own"))},
    "adamw": {"use_fused_step": (True, _UNFUSED_WHY.format(
        kernel="adamw_update",
        how=("the step decays the weight it has just updated, (1 - lr*wd) * (w - lr*d), "
             "where the kernel decays the previous one, w - lr*(d + wd*w): a difference "
             "of lr**2 * wd * d per step")))},
    "lans": {"use_fused_step": (True, _UNFUSED_WHY.format(
        kernel="multi_lans_update",
        how=("the step takes the weight decay of its second half from the weight that "
             "its first half has already moved, where the kernel uses the previous "
             "weight: they differ whenever wd > 0")))},
}

_REGISTRY: dict[str, Factory] = {}


def _own_args(factory: Factory) -> set[str]:
  params = inspect.signature(factory).parameters.values()
  return {p.name for p in params
          if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


def register(name: str, *, factory: Factory | None = None, overwrite: bool = False):
  """Adds ``factory`` to :func:`create` under ``name`` (case-insensitive).

  Usable as a decorator (``@lars_optax.mxnet.register("mysgd")``) or a call
  (``register("mysgd", my_factory)``). ``factory(**kwargs)`` must return an
  optax transformation; it receives the optimizer-base arguments it declares
  (``learning_rate`` as an optax schedule when ``lr_scheduler`` is given,
  ``wd``, ...) plus its own.

  Raises:
    ValueError: the name is taken (pass ``overwrite=True`` to replace it).
    TypeError: the name is not a string, the factory is not callable or is
      annotated to return None. A factory that returns anything but an optax
      transformation is reported by :func:`create` (a TypeError naming it).
  """
  if not isinstance(name, str) or not name:
    raise TypeError(f"name: expected a non-empty string, got {name!r}.")
  key = name.lower()

  def add(fn: Factory) -> Factory:
    if not callable(fn):
      raise TypeError(f"factory: expected a callable, got {type(fn).__name__}.")
    try:
      returns = inspect.signature(fn).return_annotation
    except (TypeError, ValueError):  # builtins without a signature
      returns = inspect.Signature.empty
    if returns is None or returns == "None":
      raise TypeError(f"factory: {getattr(fn, '__name__', fn)!r} is annotated to return "
                      "None; it must return an optax.GradientTransformation.")
    if key in _REGISTRY and not overwrite:
      raise ValueError(f"name: an optimizer called {name!r} is already registered; "
                       "pass overwrite=True to replace it.")
    _REGISTRY[key] = fn
    return fn

  return add if factory is None else add(factory)


def registered() -> list[str]:
  """The names :func:`create` accepts, sorted.

  The built-in names (MXNet's, for the optimizers this library implements)
  and any added with :func:`register`, all in lower case.
  """
  return sorted(_REGISTRY)


def mxnet_schedule(lr_scheduler: Callable[[Any], Any], *,
                   begin_num_update: int = 0) -> Callable[[jax.Array], jax.Array]:
  """Turns an MXNet-style scheduler into an optax schedule.

  MXNet calls its scheduler with the update count, which is
  ``begin_num_update + 1`` at the first update; optax calls a schedule with
  the number of updates done so far (0 at the first). The returned schedule
  is ``count -> lr_scheduler(count + 1 + begin_num_update)``, an int32 count
  that stops growing at ``2**31 - 1`` (so ``begin_num_update`` is at most
  ``2**31 - 2``).

  ``lr_scheduler`` may be a JAX-traceable function of the count (one of
  :mod:`lars_optax.mxnet.lr_scheduler`, an optax schedule, a ``lambda n: ...`` with
  ``jnp`` ops), used as is under ``jit``.
  A Python scheduler that cannot be traced (one that branches on the count or
  keeps state, like MXNet's own ``FactorScheduler`` objects) is called on the
  host through :func:`jax.pure_callback` with the concrete count.

  The rate is a function of the state's count, so ``update`` stays pure even
  for a stateful scheduler: restoring an earlier optimizer state (a rollback,
  a checkpoint) and replaying gives the same rates. The rate for count ``n``
  is what a copy of ``lr_scheduler`` (taken here, before any call) returns
  when called with every count from the first up to ``n`` in order, as in a
  run without rollback. A count below the last one restarts from a fresh copy
  (one host call per count to catch up: about a second per million steps);
  the same count again returns the same rate. A scheduler that
  :func:`copy.deepcopy` cannot copy is called as is (a UserWarning says that
  replay after a rollback then needs a fresh optimizer).

  Raises:
    TypeError: ``lr_scheduler`` is not callable, or returns anything but a
      real scalar (``None``, an array, a complex number, a bool, a string).
      A traceable scheduler is checked here; a host scheduler here on a copy
      (its first rate, when it can be copied) and at every call: the error
      then surfaces from the update as JAX's runtime error, with this text.
  """
  if not callable(lr_scheduler):
    raise TypeError(f"lr_scheduler: expected a callable of the update count, got "
                    f"{type(lr_scheduler).__name__}.")
  v.check_count("begin_num_update", begin_num_update, maximum=v.MAX_INITIAL_COUNT,
                why=v.COUNT_WHY)
  offset = int(begin_num_update) + 1
  # Copied before anything calls it (a traced call below never reaches the host).
  replay = None if hasattr(lr_scheduler, "as_optax") else _Replay(lr_scheduler, offset)

  def lr_dtype():
    # float64 when x64 is on (as MXNet's Python-float rate), else float32; checked at call time.
    return jax.dtypes.canonicalize_dtype(jnp.float64)

  def traced(count):
    rate = lr_scheduler(utils.saturating_add(count, offset))
    problem = _rate_problem(rate, "when traced")
    if problem:
      raise _NotARate(problem)
    return jnp.asarray(rate, lr_dtype())

  try:
    out = jax.eval_shape(traced, jax.ShapeDtypeStruct((), jnp.int32))
    traceable = out.shape == ()
  except _NotARate as e:
    raise TypeError(str(e)) from None
  except Exception:  # noqa: BLE001 - any failure to trace means "call it on the host"
    traceable = False
  if traceable:
    return traced
  if replay is None:
    replay = _Replay(lr_scheduler, offset)
  replay.probe()

  def on_host(count):
    dtype = lr_dtype()

    def host(n):
      # The count saturates so that MXNet's num_update stays within int32.
      n = min(int(n), v.INT32_MAX - offset)
      rate = replay(n)
      problem = _rate_problem(rate, f"for update count {n + offset}")
      if problem:
        raise TypeError(problem)
      return np.asarray(rate, dtype)

    return jax.pure_callback(host, jax.ShapeDtypeStruct((), dtype), jnp.asarray(count, jnp.int32))

  return on_host


class _NotARate(Exception):
  """A traced scheduler returned something that is not a learning rate."""


def _rate_problem(rate: Any, when: str) -> str | None:
  """The error message (naming ``lr_scheduler``) unless ``rate`` is a real scalar.

  (``jnp.asarray(None, float)`` is NaN: without this check a scheduler that
  forgets to return its rate trains on NaN.)
  """
  dtype = getattr(rate, "dtype", None)
  if isinstance(rate, (bool, np.bool_)):
    ok = False
  elif dtype is None:
    ok = isinstance(rate, (int, float))
  else:
    ok = np.shape(rate) == () and bool(jnp.issubdtype(dtype, jnp.integer)
                                       or jnp.issubdtype(dtype, jnp.floating))
  if ok:
    return None
  if dtype is not None:
    what = f"an array of shape {np.shape(rate)} and dtype {dtype}"
  else:
    what = "None" if rate is None else f"{rate!r:.80} ({type(rate).__name__})"
  return (f"lr_scheduler: returned {what} {when}; it must return the learning rate as "
          "a real scalar (a Python or NumPy number or a 0-d array). Did it forget to "
          "return the rate?")


class _Replay:
  """A host scheduler made a function of the count (see :func:`mxnet_schedule`).

  ``self(n)`` is the rate a fresh copy returns after being called with every
  count from 0 to ``n`` in order (MXNet's ``num_update`` is ``n + offset``).
  Only the working copy and the last rate are kept.
  """

  def __init__(self, scheduler: Callable[[Any], Any], offset: int):
    self._offset = offset
    try:
      self._pristine: Any = copy.deepcopy(scheduler)
    except Exception:  # noqa: BLE001 - any failure to copy: call it as is
      self._pristine = None
    self._working = scheduler
    self._next = 0  # the next count the working copy expects
    self._last: Any = None
    self._lock = threading.Lock()
    self._warned = False

  def probe(self) -> None:
    """Checks the first rate on a copy, so that a bad return fails at construction.

    Only where the copy is a new object (a plain function is its own deep copy,
    and calling it here could have side effects); any other failure is left to
    the first update.
    """
    if self._pristine is None or self._pristine is self._working:
      return
    try:
      rate = copy.deepcopy(self._pristine)(self._offset)
    except Exception:  # noqa: BLE001 - reported by the first update, as before
      return
    problem = _rate_problem(rate, f"for update count {self._offset}")
    if problem:
      raise TypeError(problem)

  def __call__(self, n: int) -> Any:
    with self._lock:
      if n == self._next - 1:  # the same count again (a skipped or repeated step)
        return self._last
      if n < self._next:  # a rollback: restart from the state at creation
        if self._pristine is None:
          if not self._warned:
            self._warned = True
            warnings.warn(
                "lr_scheduler: the optimizer went back to an earlier step, but the "
                f"scheduler ({type(self._working).__name__}) cannot be copied, so its "
                "rate may differ from the first time; build a fresh optimizer to "
                "replay exactly.", stacklevel=2)
        else:
          self._working = copy.deepcopy(self._pristine)
          self._next = 0
      if self._pristine is not None:
        while self._next < n:  # catch up on the counts not seen
          self._working(self._next + self._offset)
          self._next += 1
      self._last = self._working(n + self._offset)
      self._next = n + 1
      return self._last


class _Unset:
  """The default of :func:`create`'s base arguments: not given (the optimizer's default)."""

  def __repr__(self) -> str:
    return "unset"


_UNSET: Any = _Unset()


def create(
    name: str,
    *,
    learning_rate: Any = _UNSET,
    wd: Any = _UNSET,
    rescale_grad: Any = _UNSET,
    clip_gradient: Any = _UNSET,
    lr_scheduler: Any = _UNSET,
    begin_num_update: Any = _UNSET,
    multi_precision: Any = _UNSET,
    lr_mult: Any = _UNSET,
    wd_mult: Any = _UNSET,
    **kwargs: Any,
) -> optax.GradientTransformation:
  """Builds an optimizer by name with MXNet's arguments (``mx.optimizer.create``).

  Names (case-insensitive): MXNet's names of the optimizers this library
  implements, and any added with :func:`register`; :func:`registered` lists
  them all, as the error for an unknown name does. Every name takes the MXNet
  optimizer-base arguments (:data:`BASE_ARGS`):

  * ``learning_rate``, ``wd``, ``rescale_grad``, ``clip_gradient``
    (``learning_rate=None`` means the scheduler's, or 0.01 without one, as in
    MXNet);
  * ``lr_scheduler``: called with the update count, 1 at the first update
    (``begin_num_update`` shifts it), see :func:`mxnet_schedule`. An optax
    schedule given as ``learning_rate`` instead is called with the number of
    updates done, 0 at the first update (optax's convention). As in MXNet,
    a scheduler object with a ``base_lr`` attribute gets ``base_lr`` set to
    the learning rate (the optimizer's default when none is given), on a copy:
    the object passed in is not changed. A plain callable takes the place of
    the learning rate, so giving both is an error;
  * ``begin_num_update``: also the start of Adam's bias-correction count;
  * ``multi_precision``: float32 master weights for float16/bfloat16 params;
  * ``lr_mult``, ``wd_mult``: per-leaf multipliers by leaf name (dicts such as
    MXNet's ``set_lr_mult`` takes, or ``(mask, value)`` rules);

  plus each optimizer's own (e.g. ``momentum``, ``eta``, ``beta1``,
  ``lazy_update``, ``wd_lh``). ``use_fused_step`` and ``aggregate_num`` are
  accepted and change nothing: every optimizer follows MXNet's path at its
  default ``use_fused_step`` and ``aggregate_num`` (the multi-tensor kernels
  where MXNet has them), which is what the reference tests compare with.
  ``adamw`` and ``lans`` reject ``use_fused_step=False`` (a ValueError): MXNet's
  plain-Python step for them follows another rule when ``wd > 0``.
  Where MXNet's paths disagree, the default one is matched. MXNet 2.0's LAMB
  is such a case: its single-tensor kernels (``aggregate_num`` 0 or 1) differ
  from its default multi-tensor path (see :func:`lars_optax.lamb`), and
  ``create("lamb", aggregate_num=1)`` still gives the default path's numbers.

  ``lr_scheduler`` may be one of :mod:`lars_optax.mxnet.lr_scheduler` (MXNet's
  ``FactorScheduler``, ``MultiFactorScheduler``, ``PolyScheduler``,
  ``CosineScheduler``): it is traced, with no host call, and its ``base_lr`` is
  set through its ``with_base_lr`` (a copy), with MXNet's effect on each.

  A base argument left out (``unset`` in the signature) takes the optimizer's
  default.

  Under :func:`optax.inject_hyperparams`, bind the name with
  :func:`functools.partial`: the numeric base arguments (``learning_rate``,
  ``wd``, ...) become hyperparameters in the state, which you may change
  between steps; an optimizer's own arguments are passed as they are (to
  inject those too, wrap the optimizer's function, e.g.
  ``optax.inject_hyperparams(lars_optax.mxnet.adam)``):

  >>> import functools
  >>> import optax
  >>> import lars_optax
  >>> tx = optax.inject_hyperparams(functools.partial(lars_optax.mxnet.create, "adam"))(
  ...     learning_rate=0.1, beta1=0.8)

  Raises:
    ValueError: an unknown name or argument (the message lists the valid
      ones), or an argument the optimizer rejects.
  """
  if not isinstance(name, str):
    raise TypeError(f"name: expected a string, got {name!r}.")
  # optax.inject_hyperparams binds its call to this signature and passes the
  # bound ``**kwargs`` back as one keyword argument, ``kwargs``: unpack it.
  if isinstance(kwargs.get("kwargs"), dict):
    kwargs = {**kwargs.pop("kwargs"), **kwargs}
  given = {"learning_rate": learning_rate, "wd": wd, "rescale_grad": rescale_grad,
           "clip_gradient": clip_gradient, "lr_scheduler": lr_scheduler,
           "begin_num_update": begin_num_update, "multi_precision": multi_precision,
           "lr_mult": lr_mult, "wd_mult": wd_mult}
  kwargs.update({k: x for k, x in given.items() if x is not _UNSET})
  key = name.lower()
  if key not in _REGISTRY:
    close = difflib.get_close_matches(key, list(_REGISTRY), n=1)
    raise ValueError(f"name: unknown optimizer {name!r}"
                     + (f" (did you mean {close[0]!r}?)" if close else "")
                     + f"; valid names are {registered()}.")
  factory = _REGISTRY[key]
  own = _own_args(factory)
  for arg, (default, why) in _DEFAULT_ONLY.get(key, {}).items():
    if arg in kwargs and arg not in own:
      value = kwargs.pop(arg)
      if not (isinstance(value, (bool, np.bool_)) and bool(value) == default):
        raise ValueError(f"{arg}: {key!r} takes only {arg}={default!r} (MXNet's default), "
                         f"got {value!r}: {why}.")
  if "param_idx2name" in kwargs or "sym" in kwargs or "param_dict" in kwargs:
    bad = next(k for k in ("param_idx2name", "sym", "param_dict") if k in kwargs)
    trainer = (" A Gluon Trainer gives MXNet only param_dict, so its LARS skips no "
               "parameter by name: port its run with skip=None." if bad == "param_dict" else "")
    raise ValueError(f"{bad}: not needed; parameter names come from the paths of the "
                     "params tree (use lr_mult / wd_mult dicts keyed by leaf name)." + trainer)
  valid = sorted(set(BASE_ARGS) | own | set(_NO_OP_ARGS))
  unknown = sorted(set(kwargs) - set(valid))
  if unknown:
    raise ValueError(f"{unknown[0]}: not an argument of {key!r}"
                     + (f" (also unknown: {unknown[1:]})" if len(unknown) > 1 else "")
                     + f"; valid arguments are {valid}.")
  for k in _NO_OP_ARGS:
    kwargs.pop(k, None)

  lr_scheduler = kwargs.pop("lr_scheduler", None)
  begin = kwargs.pop("begin_num_update", 0)
  lr = kwargs.pop("learning_rate", _UNSET)
  if lr is not _UNSET and lr_scheduler is None:
    # MXNet: learning_rate=None without a scheduler means 0.01.
    kwargs["learning_rate"] = 0.01 if lr is None else lr
  v.check_count("begin_num_update", begin, maximum=v.MAX_INITIAL_COUNT, why=v.COUNT_WHY)
  if lr_scheduler is not None:
    kwargs["learning_rate"] = mxnet_schedule(_with_base_lr(lr_scheduler, lr, factory),
                                             begin_num_update=begin)
  if "begin_num_update" in own:
    kwargs["begin_num_update"] = begin

  # A base argument that a registered factory does not declare is fine at its
  # neutral value and an error otherwise (it would be silently ignored).
  neutral = {"wd": 0.0, "rescale_grad": 1.0, "clip_gradient": None,
             "multi_precision": False, "lr_mult": None, "wd_mult": None}
  wrap = False
  if "multi_precision" not in own and "multi_precision" in kwargs:
    # MXNet's base class gives every optimizer master weights; so does the wrapper.
    wrap = v.check_flag("multi_precision", kwargs.pop("multi_precision"))
  for k in sorted(set(kwargs) - own):
    if k in neutral and kwargs[k] == neutral[k]:
      del kwargs[k]
    else:
      raise ValueError(f"{k}: {key!r} does not support this argument; its "
                       f"arguments are {sorted(own)}.")
  tx = factory(**kwargs)
  if not isinstance(tx, optax.GradientTransformation):
    raise TypeError(f"name: the factory registered as {key!r} returned "
                    f"{type(tx).__name__}, not an optax.GradientTransformation "
                    "(did it forget to return the optimizer?).")
  return precision.multi_precision(tx) if wrap else tx


def _with_base_lr(lr_scheduler: Any, lr: Any, factory: Factory) -> Any:
  """MXNet's rule: a scheduler object's ``base_lr`` becomes the learning rate."""
  if not hasattr(lr_scheduler, "base_lr") and not hasattr(lr_scheduler, "with_base_lr"):
    if lr is not _UNSET and lr is not None:
      raise ValueError("learning_rate: give either learning_rate or a plain "
                       "lr_scheduler callable, not both (the scheduler returns the "
                       "learning rate).")
    return lr_scheduler
  if lr is _UNSET:
    lr = _default(factory, "learning_rate")  # MXNet uses the class default too
  if lr is None or lr is _UNSET:  # None: MXNet keeps the scheduler's base_lr
    return lr_scheduler
  v.check_scalar("learning_rate", lr, low=0.0)
  old_lr = lr_scheduler.base_lr
  if hasattr(lr_scheduler, "with_base_lr"):  # ours: immutable, returns a copy
    if old_lr != lr:
      warnings.warn(f"lr_scheduler: base_lr {old_lr} is replaced by "
                    f"learning_rate {lr}, as MXNet does.", stacklevel=3)
    return lr_scheduler.with_base_lr(lr)
  try:
    lr_scheduler = copy.deepcopy(lr_scheduler)
  except Exception as e:  # any failure to copy gets the same advice
    raise TypeError(
        f"lr_scheduler: cannot copy {type(lr_scheduler).__name__} to set its base_lr to "
        f"learning_rate ({type(e).__name__}: {e}); pass learning_rate=None to keep the "
        "scheduler's base_lr, or a scheduler that copy.deepcopy can copy.") from e
  try:
    lr_scheduler.base_lr = lr
  except (AttributeError, TypeError) as e:
    raise TypeError(
        f"lr_scheduler: cannot set base_lr on {type(lr_scheduler).__name__} "
        f"({type(e).__name__}: {e}); pass learning_rate=None to keep the scheduler's "
        "base_lr, or give it a writable base_lr.") from e
  if old_lr != lr:
    warnings.warn(f"lr_scheduler: base_lr {old_lr} is replaced by "
                  f"learning_rate {lr}, as MXNet does.", stacklevel=3)
  return lr_scheduler


def _default(factory: Factory, arg: str) -> Any:
  p = inspect.signature(factory).parameters.get(arg)
  return _UNSET if p is None or p.default is p.empty else p.default


register("lars", factory=lars)
register("signum", factory=signum)
register("signsgd", factory=signsgd)
register("adam", factory=adam_family.adam)
register("sgd", factory=sgd_family.sgd)
register("nag", factory=sgd_family.nag)
register("dcasgd", factory=sgd_family.dcasgd)
register("sgld", factory=sgd_family.sgld)
register("adagrad", factory=adagrad_family.adagrad)
register("groupadagrad", factory=adagrad_family.groupadagrad)
register("rmsprop", factory=adagrad_family.rmsprop)
register("adadelta", factory=adagrad_family.adadelta)
register("ftrl", factory=adagrad_family.ftrl)
register("lamb", factory=lamb)
register("lans", factory=lans)
register("adamw", factory=adam_family.adamw)
register("adamax", factory=adam_family.adamax)
register("nadam", factory=adam_family.nadam)
register("adabelief", factory=adam_family.adabelief)
register("ftml", factory=adam_family.ftml)
