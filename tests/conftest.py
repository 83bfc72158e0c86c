"""Test-wide settings: float64 is available to every test (each picks its dtype), and
every `attnflow` subprocess of the session shares one JAX compilation cache in a
temporary folder (never the user's own cache).

The pytest process itself never writes compiled programs to that cache (JAX's switch
`jax_enable_compilation_cache` is off here): it compiles thousands of programs in one
long process, and JAX's executable serialization crashed such a process (a
segmentation fault while writing the entry of a large differentiated solve), while the
command line runs one study per process. attnflow's own exported piece programs still
go to the session's folder when a test switches the cache folder on."""

import os
import tempfile

import jax

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_enable_compilation_cache", False)
os.environ.setdefault("ATTNFLOW_CACHE_DIR", tempfile.mkdtemp(prefix="attnflow-test-cache-"))
