"""What machine a benchmark ran on, printed beside every table."""

from __future__ import annotations

import os
import platform


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def describe() -> str:
    import jax

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    device = jax.devices()[0]
    return (f"{cpu_model()}, {cores} cores usable, Python {platform.python_version()}, "
            f"jax {jax.__version__} on {device.platform} ({device.device_kind})")
