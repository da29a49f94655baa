"""ResNet-50 (v1.5) parameter shapes as a pytree of float32 arrays.

161 leaves, 25,557,032 parameters: the convolution kernels (HWIO), batch-norm
``gamma``/``beta`` and the final dense ``weight``/``bias``, named the MXNet way
(``..._weight``, ``..._gamma``, ``..._beta``, ``..._bias``) so the MXNet skip rule
applies to the batch-norm and bias leaves as it would in a real model.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

STAGES = ((64, 3), (128, 4), (256, 6), (512, 3))  # (bottleneck width, blocks)


def resnet50_shapes() -> dict[str, tuple[int, ...]]:
  """Returns an ordered ``name -> shape`` dict of ResNet-50 parameters."""
  shapes: dict[str, tuple[int, ...]] = {}

  def conv_bn(prefix: str, k: int, cin: int, cout: int) -> None:
    shapes[f"{prefix}_conv_weight"] = (k, k, cin, cout)
    shapes[f"{prefix}_bn_gamma"] = (cout,)
    shapes[f"{prefix}_bn_beta"] = (cout,)

  conv_bn("stem", 7, 3, 64)
  cin = 64
  for s, (width, blocks) in enumerate(STAGES):
    for b in range(blocks):
      p = f"stage{s + 1}_unit{b + 1}"
      conv_bn(f"{p}_a", 1, cin, width)
      conv_bn(f"{p}_b", 3, width, width)
      conv_bn(f"{p}_c", 1, width, 4 * width)
      if b == 0:
        conv_bn(f"{p}_sc", 1, cin, 4 * width)
      cin = 4 * width
  shapes["fc_weight"] = (cin, 1000)
  shapes["fc_bias"] = (1000,)
  return shapes


def resnet50_params(seed: int = 0, dtype=jnp.float32) -> dict[str, jax.Array]:
  """Random ResNet-50-shaped params (float32 by default)."""
  rng = np.random.default_rng(seed)
  return {
      name: jnp.asarray(rng.standard_normal(shape, dtype=np.float32) * 0.05,
                        dtype=dtype)
      for name, shape in resnet50_shapes().items()
  }


if __name__ == "__main__":
  sh = resnet50_shapes()
  print(len(sh), sum(int(np.prod(s)) for s in sh.values()))
