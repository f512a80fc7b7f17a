"""Test-wide settings.

Eight fake CPU devices let every sharding test run on a laptop or CI; XLA reads the flag once, at
backend start-up, so it must be set before anything imports jax.
"""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
    os.environ["XLA_FLAGS"] = (_flags + " --xla_force_host_platform_device_count=8").strip()
