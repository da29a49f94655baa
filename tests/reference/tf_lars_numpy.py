"""A float64 NumPy transcription of TensorFlow's LARSOptimizer update (rule 2).

Used as the reference for the cases the TF test file does not cover (Nesterov,
``skip_list``, several leaves). Written from the rule in the reference
SEMANTICS (rule 2), not from TF's code: per leaf,

    skipped (any skip_list entry is a substring of the name): scaled_lr = lr
    else: trust = eeta*|w| / (|g| + weight_decay*|w| + epsilon) if |w|>0 and |g|>0 else 1
          scaled_lr = lr * trust
    a = momentum * a + g
    w -= scaled_lr * a                                  (use_nesterov=False)
    w -= scaled_lr * g + scaled_lr * momentum * a       (use_nesterov=True)
"""

from __future__ import annotations

import numpy as np


def tf_lars_steps(params, grads_per_step, *, lr, momentum=0.9, weight_decay=1e-4,
                  eeta=1e-3, epsilon=0.0, skip_list=None, use_nesterov=False):
  """Runs the rule; returns (weights after each step, accumulators after each step)."""
  w = {k: np.asarray(v, np.float64).copy() for k, v in params.items()}
  a = {k: np.zeros_like(v) for k, v in w.items()}
  ws, accs = [], []
  for grads in grads_per_step:
    for k in w:
      g = np.asarray(grads[k], np.float64)
      scaled_lr = lr
      if not (skip_list and any(s in k for s in skip_list)):
        wn, gn = np.linalg.norm(w[k].ravel()), np.linalg.norm(g.ravel())
        trust = eeta * wn / (gn + weight_decay * wn + epsilon) if wn > 0 and gn > 0 else 1.0
        scaled_lr = lr * trust
      a[k] = momentum * a[k] + g
      if use_nesterov:
        w[k] = w[k] - scaled_lr * g - scaled_lr * momentum * a[k]
      else:
        w[k] = w[k] - scaled_lr * a[k]
    ws.append({k: v.copy() for k, v in w.items()})
    accs.append({k: v.copy() for k, v in a.items()})
  return ws, accs
