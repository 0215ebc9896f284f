"""The GPU a case runs on, as backends and records see it, with its one constructor from torch."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class GpuInfo:
    """What `Backend.supports` may look at about the device a case would run on.

    The CPU is `GpuInfo.cpu()` (index -1, capability (0, 0)): `sm` is then 0.
    """

    index: int = 0
    name: str = "unknown"
    uuid: str | None = None
    capability: tuple[int, int] = (0, 0)
    sm_count: int | None = None
    total_memory_bytes: int | None = None
    l2_bytes: int | None = None

    @property
    def sm(self) -> int:
        """e.g. 90 for Hopper, 100 for Blackwell B200; 0 off-GPU."""
        return self.capability[0] * 10 + self.capability[1]

    @classmethod
    def cpu(cls) -> "GpuInfo":
        return cls(index=-1, name="cpu")

    @classmethod
    def from_torch(cls, index: int, nvml: dict[str, Any] | None = None) -> "GpuInfo":
        """The CUDA device `index` as torch sees it (this initialises CUDA). `nvml`, a GPU
        block from NVML (suite.envinfo.gpu_info), fills what torch does not say: the UUID
        NVML reports, the L2 size on old torch builds."""
        import torch

        props = torch.cuda.get_device_properties(index)
        nvml = nvml or {}
        return cls(
            index=index,
            name=props.name,
            uuid=nvml.get("uuid") or torch_uuid(props),
            capability=(props.major, props.minor),
            sm_count=props.multi_processor_count,
            total_memory_bytes=props.total_memory,
            l2_bytes=getattr(props, "L2_cache_size", None) or nvml.get("l2_bytes"),
        )


def torch_uuid(props: Any) -> str | None:
    """torch's device UUID in NVML's spelling ('GPU-...'), or None where torch has none."""
    uuid = getattr(props, "uuid", None)
    if uuid is None:
        return None
    text = str(uuid)
    return text if text.startswith("GPU-") else f"GPU-{text}"
