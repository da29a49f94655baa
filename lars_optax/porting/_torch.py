"""``torch.optim.SparseAdam``, in torch's words."""

from __future__ import annotations


import optax

from lars_optax import _links
from lars_optax import _assembly as assembly
from lars_optax import _masks as masks
from lars_optax.mxnet._adam_links import unchecked_scale_by_mxnet_adam
from lars_optax.sparse.lazy import lazy_update


@_links.optimizer()
def torch_sparse_adam(
    lr: optax.ScalarOrSchedule = 1e-3,
    *,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    maximize: bool = False,
    lr_mult: masks.LeafValues = None,
    multi_precision: bool = False,
) -> optax.GradientTransformation:
  r"""``torch.optim.SparseAdam(params, lr, betas, eps, maximize)``: lazy Adam on row-sparse
  gradients.

  Only the rows of a row-sparse gradient (:func:`lars_optax.sparse.value_and_grad`)
  move, and only their moments decay; :math:`\epsilon` is added to
  :math:`\sqrt{v_t}` before the bias correction, as in PyTorch. It is
  :func:`lars_optax.mxnet.adam` with ``lazy_update=True`` (MXNet's rule is
  PyTorch's); dense gradients update the rows whose gradient is not all zero.
  ``maximize=True`` ascends: the step of the negated gradient, as PyTorch takes it.

  References:
    PyTorch ``torch.optim.SparseAdam``; Kingma and Ba, `Adam
    <https://arxiv.org/abs/1412.6980>`_, 2015.
  """
  b1, b2 = betas
  # MXNet's lazy Adam (PyTorch's rule), from the links' rules: checked, in torch's words.
  tx = assembly.finish([unchecked_scale_by_mxnet_adam(b1, b2=b2, eps=eps),
                       assembly.learning_rate_part(lr), *assembly.lr_mult_part(lr_mult)],
                      "torch_sparse_adam", lazy=True, multi_precision=multi_precision,
                      complex_params=True)
  if not maximize:
    return tx
  # The gradient negated on its rows (a row-sparse gradient stays row-sparse).
  return optax.chain(lazy_update(optax.scale(-1.0)), tx)
