"""The DCGM exporter's counters file: which DCGM fields become Prometheus metrics.

The exporter's own default list (dcgm-exporter 4.1.1, ``etc/default-counters.csv`` at tag
4.2.3-4.1.1) leaves ECC, retired pages, NVLink errors, throttling and SM activity commented out;
the alerts need them. Field names are the ones upstream lists in ``default-counters.csv`` and
``dcp-metrics-included.csv`` at that tag (tests/infra/upstream/dcgm-exporter-4.1.1, checked by
tests/workloads/test_monitoring.py).

Note ``DCGM_FI_DEV_XID_ERRORS`` is a gauge holding the *last* XID code the GPU raised ("Value of
the last XID error encountered"), labelled ``err_code``/``err_msg`` by the exporter
(internal/pkg/collector/gpu_collector.go): alerts compare its value with XID codes, never rate it.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Counter:
    field: str
    kind: str  # gauge | counter | label (Prometheus type in the exporter's CSV)
    help: str


COUNTERS: tuple[Counter, ...] = (
    # Clocks, temperature, power
    Counter("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz)."),
    Counter("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz)."),
    Counter("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C)."),
    Counter("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C)."),
    Counter("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W)."),
    Counter("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter", "Total energy consumption since boot (in mJ)."),
    # PCIe
    Counter("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries."),
    # Utilization and memory
    Counter("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %)."),
    Counter("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %)."),
    Counter("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB)."),
    Counter("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB)."),
    # Errors and throttling: the violation counters are microseconds spent throttled
    Counter("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered."),
    Counter("DCGM_FI_DEV_POWER_VIOLATION", "counter", "Throttling duration due to power constraints (in us)."),
    Counter("DCGM_FI_DEV_THERMAL_VIOLATION", "counter", "Throttling duration due to thermal constraints (in us)."),
    Counter("DCGM_FI_DEV_BOARD_LIMIT_VIOLATION", "counter", "Throttling duration due to board limit constraints (in us)."),
    Counter("DCGM_FI_DEV_RELIABILITY_VIOLATION", "counter", "Throttling duration due to reliability constraints (in us)."),
    # ECC: single-bit (corrected) and double-bit (uncorrectable), volatile (since boot) and aggregate (lifetime)
    Counter("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "counter", "Total number of single-bit volatile ECC errors."),
    Counter("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter", "Total number of double-bit volatile ECC errors."),
    Counter("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "counter", "Total number of single-bit persistent ECC errors."),
    Counter("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "counter", "Total number of double-bit persistent ECC errors."),
    # Retired pages (pre-Ampere) and remapped rows (Ampere and newer)
    Counter("DCGM_FI_DEV_RETIRED_SBE", "counter", "Total number of retired pages due to single-bit errors."),
    Counter("DCGM_FI_DEV_RETIRED_DBE", "counter", "Total number of retired pages due to double-bit errors."),
    Counter("DCGM_FI_DEV_RETIRED_PENDING", "counter", "Total number of pages pending retirement."),
    Counter("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter", "Number of remapped rows for uncorrectable errors"),
    Counter("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter", "Number of remapped rows for correctable errors"),
    Counter("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed"),
    # NVLink errors (absent on GPUs without NVLink)
    Counter("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "counter", "Total number of NVLink flow-control CRC errors."),
    Counter("DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", "counter", "Total number of NVLink data CRC errors."),
    Counter("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "counter", "Total number of NVLink retries."),
    Counter("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", "counter", "Total number of NVLink recovery errors."),
    Counter("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "counter", "Total number of NVLink bandwidth counters for all lanes."),
    # Static information, as labels on the other metrics
    Counter("DCGM_FI_DRIVER_VERSION", "label", "Driver Version"),
    # Profiling (DCP) metrics: Volta and newer datacenter GPUs; absent where unsupported
    Counter("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "Ratio of time the graphics engine is active."),
    Counter("DCGM_FI_PROF_SM_ACTIVE", "gauge", "The ratio of cycles an SM has at least 1 warp assigned."),
    Counter("DCGM_FI_PROF_SM_OCCUPANCY", "gauge", "The ratio of number of warps resident on an SM."),
    Counter("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge", "Ratio of cycles the tensor (HMMA) pipe is active."),
    Counter("DCGM_FI_PROF_DRAM_ACTIVE", "gauge",
            "Ratio of cycles the device memory interface is active sending or receiving data."),
    Counter("DCGM_FI_PROF_PCIE_TX_BYTES", "counter",
            "The number of bytes of active pcie tx data including both header and payload."),
    Counter("DCGM_FI_PROF_PCIE_RX_BYTES", "counter",
            "The number of bytes of active pcie rx data including both header and payload."),
)


def counters_csv() -> str:
    """The file in the exporter's format: ``FIELD, type, help`` per line, ``#`` comments."""
    lines = ["# DCGM FIELD, Prometheus metric type, help message",
             "# Generated by workloads/monitoring/dcgm.py; edit there."]
    lines += [f"{c.field}, {c.kind}, {c.help}" for c in COUNTERS]
    return "\n".join(lines) + "\n"


def metric_names() -> frozenset[str]:
    """The Prometheus metrics the exporter produces from this file (labels excluded)."""
    return frozenset(c.field for c in COUNTERS if c.kind != "label")
