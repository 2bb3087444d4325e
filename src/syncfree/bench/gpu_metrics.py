"""What the CUDA profiler says about one forward: kernel time, how busy the GPU was, memcpys, stream syncs."""

from __future__ import annotations

__all__ = ["busy_time", "profile_forward"]


def busy_time(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of ``(start, end)`` intervals: the time at least one kernel ran."""
    total, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop <= end:
            continue
        total += stop - max(start, end)
        end = stop
    return total


def profile_forward(fn) -> dict:
    """Run ``fn`` once under the profiler; returns kernel and copy statistics (times in ms)."""
    import time

    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        wall_ms = (time.perf_counter() - start) * 1e3
    kernels, counts = [], {"memcpy_htod": 0, "memcpy_dtoh": 0, "stream_syncs": 0}
    for e in prof.events():
        name = e.name
        if name.startswith("Memcpy HtoD"):
            counts["memcpy_htod"] += 1
        elif name.startswith("Memcpy DtoH"):
            counts["memcpy_dtoh"] += 1
        elif name in ("cudaStreamSynchronize", "cudaDeviceSynchronize"):
            counts["stream_syncs"] += 1
        if e.device_type == DeviceType.CUDA and not name.startswith("Memcpy"):
            kernels.append((e.time_range.start / 1e3, e.time_range.end / 1e3))
    kernel_ms = sum(b - a for a, b in kernels)
    busy_ms = busy_time(kernels)
    return {"wall_ms": wall_ms, "kernel_ms": kernel_ms, "busy_fraction": busy_ms / wall_ms if wall_ms else None,
            **counts}
