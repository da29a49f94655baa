"""Is the inner transformation row-wise? A taint analysis of its traced computation (jaxpr)."""

from __future__ import annotations

from typing import Any

from jax.extend import core as _jcore

_ROWWISE = frozenset("""
abs acos acosh add add_any and asin asinh atan atan2 atanh cbrt ceil clamp convert_element_type
copy copy_p cos cosh div eq erf erf_inv erfc exp exp2 expm1 floor ge gt imag integer_pow is_finite
le log log1p logistic lt max min mul ne neg nextafter not or pow real reduce_precision rem round
rsqrt select_n sign sin sinh sqrt square sub tan tanh xor stop_gradient optimization_barrier
""".split())  # noqa: SIM905  (element-wise primitives: row r of the output needs row r of the inputs)
_REDUCTIONS = frozenset(
    "reduce_sum reduce_max reduce_min reduce_prod reduce_and reduce_or argmax argmin".split())  # noqa: SIM905


class _NotRowWise(Exception):

  def __init__(self, leaves: frozenset, what: str):
    super().__init__(what)
    self.leaves, self.what = leaves, what


def sub_jaxprs(params: dict) -> list[Any]:
  out = []
  for value in params.values():
    for item in (value if isinstance(value, (tuple, list)) else (value,)):
      if isinstance(item, _jcore.ClosedJaxpr):
        out.append(item.jaxpr)
      elif isinstance(item, _jcore.Jaxpr):
        out.append(item)
  return out


def _is_rowwise(eqn: Any) -> bool:
  """Element-wise, a reduction over other axes, or a broadcast that keeps axis 0."""
  name = eqn.primitive.name
  if name in _ROWWISE:
    return True
  if name in _REDUCTIONS:
    return 0 not in eqn.params.get("axes", (0,))
  if name == "broadcast_in_dim":
    return (not eqn.invars[0].aval.shape
            or tuple(eqn.params["broadcast_dimensions"][:1]) == (0,))
  return False


def _walk(jaxpr: Any, taints: list[frozenset]) -> list[frozenset]:
  """Propagates which sparse leaves each value depends on; raises if not row-wise."""
  env: dict[Any, frozenset] = {}
  empty: frozenset = frozenset()
  for var, t in zip(jaxpr.invars, taints):
    env[var] = t

  def read(v):
    return env.get(v, empty) if isinstance(v, _jcore.Var) else empty

  for eqn in jaxpr.eqns:
    ins = [read(v) for v in eqn.invars]
    union = frozenset().union(*ins)
    name = eqn.primitive.name
    if union:
      subs = sub_jaxprs(eqn.params)
      if _is_rowwise(eqn):
        pass
      elif name == "cond" and subs:
        for sub in subs:
          _walk(sub, ins[1:])
      elif len(subs) == 1 and len(subs[0].invars) == len(eqn.invars):
        outs = _walk(subs[0], ins)
        for var, t in zip(eqn.outvars, outs):
          env[var] = t
        continue
      else:
        raise _NotRowWise(union, name)
    for var in eqn.outvars:
      env[var] = union
  return [read(v) for v in jaxpr.outvars]


def check_rowwise(closed: Any, taints: list[frozenset], where: str) -> None:
  try:
    _walk(closed.jaxpr, taints)
  except _NotRowWise as e:
    names = ", ".join(repr(n) for n in sorted(e.leaves))
    raise ValueError(
        f"{where}: gradient {names} is row-sparse, but the inner transformation "
        f"is not row-wise (its '{e.what}' mixes rows, as a LARS trust ratio or a "
        "global-norm clip does), so it cannot run on the gathered rows only. "
        "Use a row-wise optimizer (e.g. lars_optax.mxnet.adam or lars_optax.mxnet.sgd with "
        "lazy_update=True), or pass the dense gradient (grad.todense()).") from None
