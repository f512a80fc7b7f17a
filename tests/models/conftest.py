"""Model tests are dominated by XLA compile time on tiny shapes; LLVM optimisation level 0 cuts
CPU compiles about 2.5x without changing numerics. XLA reads the flag once, when the backend
starts, so it only takes effect if no earlier test module has started it."""

import os

_flags = os.environ.get("XLA_FLAGS", "")
if "xla_backend_optimization_level" not in _flags:
    os.environ["XLA_FLAGS"] = (_flags + " --xla_backend_optimization_level=0").strip()
