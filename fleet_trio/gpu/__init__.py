"""GPU sources, VRAM samplers and the footprint store (node.md §4, §5, §7.2).

``nvml.py`` is the only module that imports ``pynvml`` (lazily); ``smi.py`` runs and parses
``nvidia-smi``; ``fake.py`` is a GPU driven by real processes. See docs/gpu.md.
"""

from fleet_trio.gpu.arch import GPU_VENDOR, gpu_arch
from fleet_trio.gpu.footprints import (
    DEFAULT_MARGIN,
    FootprintEntry,
    FootprintKey,
    FootprintRecord,
    FootprintStore,
    FootprintTable,
    default_store_path,
)
from fleet_trio.gpu.sampler import (
    NO_SNAPSHOT,
    SAMPLER_MODES,
    STALE_SNAPSHOT,
    GlobalDelta,
    GlobalSampler,
    job_pids,
    measure_job_peak,
    serve_global_sampler,
)
from fleet_trio.gpu.smi import parse_smi_memory
from fleet_trio.gpu.source import GIB, GpuError, GpuSource, VramSnapshot, open_source

__all__ = [
    "DEFAULT_MARGIN",
    "GIB",
    "GPU_VENDOR",
    "NO_SNAPSHOT",
    "SAMPLER_MODES",
    "STALE_SNAPSHOT",
    "FootprintEntry",
    "FootprintKey",
    "FootprintRecord",
    "FootprintStore",
    "FootprintTable",
    "GlobalDelta",
    "GlobalSampler",
    "GpuError",
    "GpuSource",
    "VramSnapshot",
    "default_store_path",
    "gpu_arch",
    "job_pids",
    "measure_job_peak",
    "open_source",
    "parse_smi_memory",
    "serve_global_sampler",
]
