"""Pallas Mosaic GPU kernels of `jaxgemm.glu` (H = act(X Wg + bg) * (X Wu + bu)).

    dual.py   the persistent warp-specialized matmul body with its dual switch: each
              K step loads X's tile once and both weight tiles, each consumer
              warpgroup accumulates both products, the GLU epilogue combines them

Shared helpers are in jaxgemm.kernels.pallas.common; the epilogue math in
jaxgemm.kernels.pallas.epilogue.
"""
