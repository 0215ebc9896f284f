"""Every decode-attention kernel the suite measures, behind one interface (baselines.base)."""
from baselines.base import (  # noqa: F401 - the public interface
    Backend,
    CompileError,
    GpuInfo,
    Prepared,
    SourceKV,
    Unsupported,
    all_backends,
    get_backend,
    register,
    select_backends,
)
