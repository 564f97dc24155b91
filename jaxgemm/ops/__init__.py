"""One package per op (`matmul/`, `ragged_dot/`, ...); `base.py`, `rules.py` and
`activations.py` hold what every op shares; `router.py`, above the ops, sends
`jaxgemm.matmul` to the op that computes the call."""
