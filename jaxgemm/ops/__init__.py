"""One package per op (`matmul/`); `base.py` holds what every op shares."""
