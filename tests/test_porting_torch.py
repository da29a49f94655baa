"""``lars_optax.porting.torch_sparse_adam``: torch's SparseAdam."""

from __future__ import annotations



import pytest

from porting_runs import P


def test_torch_sparse_adam_maximize_is_checked():
  with pytest.raises(TypeError, match=r"^maximize"):
    P.torch_sparse_adam(maximize="yes")
