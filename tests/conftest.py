"""Test-wide settings: float64 is available to every test (each picks its dtype)."""

import jax

jax.config.update("jax_enable_x64", True)
