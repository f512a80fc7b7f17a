"""IntraSkill-JAX: skill-model co-evolution for LLM shopping agents, in JAX."""

import os as _os
import sys as _sys

# XLA:CPU calls OpenBLAS (the DeltaNet's triangular solve) from its own worker threads; OpenBLAS's
# threads then fight XLA's for the cores (a 7 ms solve took seconds) and training steps have been
# seen to stall outright. OpenBLAS reads this once when numpy loads it, so set it first.
if "numpy" not in _sys.modules:
    _os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

__version__ = "0.1.0"
