"""Test-wide settings: float64 is available to every test (each picks its dtype), and
every run of the session, in-process or a `attnflow` subprocess, shares one JAX
compilation cache in a temporary folder (never the user's own cache)."""

import os
import tempfile

import jax

jax.config.update("jax_enable_x64", True)
os.environ.setdefault("ATTNFLOW_CACHE_DIR", tempfile.mkdtemp(prefix="attnflow-test-cache-"))
