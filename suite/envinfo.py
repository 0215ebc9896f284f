"""The environment a measurement ran in: GPUs (NVML, plus torch for SM count and L2),
driver, CUDA, clocks and library versions. `foscar-bench env` prints it; a sweep records
it once per run. Every probe is optional: a missing library or GPU gives None, not an error.
"""
from __future__ import annotations

import importlib
import platform
import socket
import statistics
import sys
from typing import Any

from core.bytes_model import bus_peak_tbps, datasheet_peak_tbps

LIBRARIES = ("torch", "triton", "flashinfer", "bit_decode", "numpy", "pandas", "pynvml")
# Distribution names where they differ from the module (for importlib.metadata).
DISTRIBUTIONS = {"pynvml": "nvidia-ml-py", "flashinfer": "flashinfer-python", "bit_decode": "bit_decode"}


def _version(module: str) -> str | None:
    try:
        mod = importlib.import_module(module)
    except Exception:  # noqa: BLE001 - absent or broken: no version
        return None
    version = getattr(mod, "__version__", None)
    if version is None:
        try:
            from importlib.metadata import version as dist_version

            version = dist_version(DISTRIBUTIONS.get(module, module))
        except Exception:  # noqa: BLE001
            version = "unknown"
    return str(version)


def library_versions() -> dict[str, str | None]:
    versions = {name: _version(name) for name in LIBRARIES}
    try:
        import torch

        versions["torch_cuda"] = torch.version.cuda
    except Exception:  # noqa: BLE001
        versions["torch_cuda"] = None
    return versions


def _nvml():
    """The pynvml module, initialised, or None when NVML is not there (no driver)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml
    except Exception:  # noqa: BLE001 - no library, no driver, no GPU
        return None


def _call(fn, *args, default=None):
    try:
        value = fn(*args)
    except Exception:  # noqa: BLE001 - NVML raises for unsupported queries
        return default
    return value.decode() if isinstance(value, bytes) else value


def nvml_handle_for(nv, torch_index: int | None = None, uuid: str | None = None):
    """The NVML handle of a GPU, by UUID when known (torch and NVML number GPUs
    differently when CUDA_VISIBLE_DEVICES is set), else by index."""
    if uuid:
        for cand in (uuid, f"GPU-{uuid}" if not uuid.startswith("GPU-") else uuid):
            h = _call(nv.nvmlDeviceGetHandleByUUID, cand)
            if h is not None:
                return h
    if torch_index is not None:
        return _call(nv.nvmlDeviceGetHandleByIndex, torch_index)
    return None


def throttle_reasons(nv, handle) -> tuple[int | None, list[str]]:
    """The NVML clock-event (throttle) bitmask and the names of the reasons that slow
    clocks (idle and application-clock settings are not slowdowns and are left out)."""
    fn = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
        nv, "nvmlDeviceGetCurrentClocksThrottleReasons", None
    )
    mask = _call(fn, handle) if fn else None
    if mask is None:
        return None, []
    names = {
        "SwPowerCap": 0x4,
        "HwSlowdown": 0x8,
        "SyncBoost": 0x10,
        "SwThermalSlowdown": 0x20,
        "HwThermalSlowdown": 0x40,
        "HwPowerBrakeSlowdown": 0x80,
        "DisplayClockSetting": 0x100,
    }
    return int(mask), [n for n, bit in names.items() if mask & bit]


def clock_sample(nv, handle) -> dict[str, Any]:
    """SM and memory clocks now, with throttle reasons: sampled before and after timing."""
    if nv is None or handle is None:
        return {"sm_clock_mhz": None, "mem_clock_mhz": None, "throttle_mask": None, "throttle_reasons": []}
    mask, reasons = throttle_reasons(nv, handle)
    return {
        "sm_clock_mhz": _call(nv.nvmlDeviceGetClockInfo, handle, nv.NVML_CLOCK_SM),
        "mem_clock_mhz": _call(nv.nvmlDeviceGetClockInfo, handle, nv.NVML_CLOCK_MEM),
        "temperature_c": _call(nv.nvmlDeviceGetTemperature, handle, nv.NVML_TEMPERATURE_GPU),
        "power_w": (lambda mw: mw / 1000 if mw else None)(_call(nv.nvmlDeviceGetPowerUsage, handle)),
        "throttle_mask": mask,
        "throttle_reasons": reasons,
    }


def load_clocks(before: dict[str, Any], under_load: list[dict[str, Any]]) -> dict[str, Any]:
    """What the clocks did while a case was timed: `before` (clock_sample before the first
    sample) and one clock_sample per timed batch, taken while the batch ran.

    Returns the lowest and the median SM clock under load, the highest power drawn, the
    slowdown reasons seen before or in any batch (sorted), and the fraction of batches that
    saw one (None without readings). A run that slowed in its middle batches is flagged
    even if its last reading was clean.
    """
    clocks = [c["sm_clock_mhz"] for c in under_load if c.get("sm_clock_mhz") is not None]
    powers = [c["power_w"] for c in under_load if c.get("power_w") is not None]
    read = [c for c in under_load if c.get("throttle_mask") is not None]  # batches whose reasons NVML gave
    reasons = set(before.get("throttle_reasons") or [])
    for c in under_load:
        reasons.update(c.get("throttle_reasons") or [])
    return {
        "sm_clock_mhz_min": min(clocks) if clocks else None,
        "sm_clock_mhz_median": statistics.median(clocks) if clocks else None,
        "power_w_max": max(powers) if powers else None,
        "throttle_reasons": sorted(reasons),
        "throttled_frac": sum(1 for c in read if c.get("throttle_reasons")) / len(read) if read else None,
    }


def _torch_props(index: int) -> dict[str, Any]:
    try:
        import torch

        if not torch.cuda.is_available():
            return {}
        p = torch.cuda.get_device_properties(index)
        return {
            "torch_index": index,
            "name": p.name,
            "sm_count": p.multi_processor_count,
            "capability": f"{p.major}.{p.minor}",
            "l2_bytes": getattr(p, "L2_cache_size", None),
            "total_memory_bytes": p.total_memory,
            "uuid": torch_uuid(p),
        }
    except Exception:  # noqa: BLE001
        return {}


def gpu_info(nv, handle, torch_index: int | None = None, use_torch: bool = True) -> dict[str, Any]:
    """One GPU's block: NVML facts, torch's SM count and L2, the two peaks."""
    info: dict[str, Any] = {}
    if nv is not None and handle is not None:
        mem = _call(nv.nvmlDeviceGetMemoryInfo, handle)
        cc = _call(nv.nvmlDeviceGetCudaComputeCapability, handle)
        info.update(
            nvml_index=_call(nv.nvmlDeviceGetIndex, handle),
            name=_call(nv.nvmlDeviceGetName, handle),
            uuid=_call(nv.nvmlDeviceGetUUID, handle),
            capability=f"{cc[0]}.{cc[1]}" if cc else None,
            memory_bus_width_bits=_call(nv.nvmlDeviceGetMemoryBusWidth, handle),
            max_mem_clock_mhz=_call(nv.nvmlDeviceGetMaxClockInfo, handle, nv.NVML_CLOCK_MEM),
            max_sm_clock_mhz=_call(nv.nvmlDeviceGetMaxClockInfo, handle, nv.NVML_CLOCK_SM),
            total_memory_bytes=getattr(mem, "total", None),
            power_limit_w=(lambda mw: mw / 1000 if mw else None)(
                _call(nv.nvmlDeviceGetEnforcedPowerLimit, handle)
            ),
            clocks_now=clock_sample(nv, handle),
        )
    if use_torch and torch_index is not None:
        props = _torch_props(torch_index)
        for k, v in props.items():
            if v is not None and (k not in info or info[k] is None or k in ("sm_count", "l2_bytes", "torch_index")):
                info[k] = v
    info.setdefault("sm_count", None)
    info.setdefault("l2_bytes", None)
    info["bus_peak_tbps"] = bus_peak_tbps(info.get("max_mem_clock_mhz"), info.get("memory_bus_width_bits"))
    info["datasheet_peak_tbps"] = datasheet_peak_tbps(info.get("name"))
    return info


def _torch_device_count() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # noqa: BLE001
        return 0


def collect(use_torch: bool = True) -> dict[str, Any]:
    """The whole environment: host, driver, CUDA, every visible GPU, library versions.

    use_torch=False keeps CUDA uninitialised in this process (NVML only), as the sweep's
    parent does; its workers add SM count and L2 from torch on their own GPU.
    """
    nv = _nvml()
    env: dict[str, Any] = {
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "libraries": library_versions(),
        "driver_version": _call(nv.nvmlSystemGetDriverVersion) if nv else None,
        "cuda_driver_version": None,
        "gpus": [],
    }
    if nv is not None:
        v = _call(nv.nvmlSystemGetCudaDriverVersion)
        if v:
            env["cuda_driver_version"] = f"{v // 1000}.{(v % 1000) // 10}"
    if use_torch and _torch_device_count():
        # torch's view is what the sweep runs on (CUDA_VISIBLE_DEVICES applied).
        for i in range(_torch_device_count()):
            props = _torch_props(i)
            handle = nvml_handle_for(nv, i, props.get("uuid")) if nv else None
            env["gpus"].append(gpu_info(nv, handle, i, use_torch=True))
    elif nv is not None:
        for i in range(_call(nv.nvmlDeviceGetCount, default=0) or 0):
            env["gpus"].append(gpu_info(nv, _call(nv.nvmlDeviceGetHandleByIndex, i), None, use_torch=False))
    if not env["gpus"]:
        env["no_gpu"] = "no CUDA GPU is visible (NVML found none, or no NVIDIA driver is loaded)"
    return env


def visible_gpu_count() -> int:
    """GPUs a sweep can use, without initialising CUDA here (NVML, honouring
    CUDA_VISIBLE_DEVICES roughly by count); falls back to torch."""
    import os

    nv = _nvml()
    n = _call(nv.nvmlDeviceGetCount, default=0) if nv else 0
    vis = os.environ.get("CUDA_VISIBLE_DEVICES")
    if vis is not None:
        n = min(n, len([x for x in vis.split(",") if x.strip() and x.strip() != "-1"]))
    if n == 0 and nv is None:
        n = _torch_device_count()
    return n or 0
