"""Vision attention backends on the CPU: where (if anywhere) block_diagonal or grouped beat split.

Run: python benchmarks/attention_crossover.py [--quick] [--out-dir benchmarks/results]
On a GPU (benchmarks/gpu/run.sh): --device cuda --dtype bfloat16 adds the varlen backend, times with
the device synchronized around each call, and takes memory from the CUDA allocator's peak.
Times one vision-attention layer's attention (stock's split of q/k/v by segment, the backend's calls,
stock's torch.cat after them) for split, grouped and block_diagonal over shapes x total lengths x
equal-length segment counts; records each cell's median time, peak memory and each backend's output
against split. Writes attention_crossover.json and .png to --out-dir (default: $TMPDIR/syncfree-results)
and prints a Markdown table. The data decide AttentionChoice's ``auto`` rule off CUDA. Linux only (/proc).
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import platform
import statistics
import tempfile
import threading
import time
from types import SimpleNamespace

import torch
import transformers
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from syncfree.rewrite.attention import AttentionChoice, segment_attention, split_segments

SHAPES = {"qwen3-vl-2b": (16, 64), "qwen3-vl-8b": (16, 72)}  # vision (heads, head_dim); 24 and 27 layers
BACKENDS = ("split", "grouped", "block_diagonal")
MiB, GiB = 2**20, 2**30
_LIBC = ctypes.CDLL(None)


class PeakRSS:
    """The process RSS peak above its baseline during a block, from /proc/self/statm every ~1 ms.

    An approximation: a peak shorter than the interval can be missed, and pages the allocator still holds
    from earlier (freed, resident) are reused without showing. glibc's free heap is handed back
    (malloc_trim) before the baseline so that most of the block's allocations show; large ones (masks,
    outputs) are mmap'd and returned on free anyway.
    """

    def __enter__(self):
        gc.collect()
        _LIBC.malloc_trim(0)
        self.fd, self.samples, self.stop = os.open("/proc/self/statm", os.O_RDONLY), 0, threading.Event()
        self.base = self.peak = self.rss()
        self.thread = threading.Thread(target=self.sample, daemon=True)
        self.thread.start()
        return self

    def rss(self) -> int:
        return int(os.pread(self.fd, 128, 0).split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def sample(self) -> None:
        while not self.stop.wait(0.001):
            self.peak, self.samples = max(self.peak, self.rss()), self.samples + 1

    def __exit__(self, *exc):
        self.peak = max(self.peak, self.rss())  # the output is still alive: a call under 1 ms shows that much
        self.stop.set()
        self.thread.join()
        os.close(self.fd)
        self.mib = (self.peak - self.base) / MiB


def cpu_seconds() -> tuple[float, float]:
    """Busy CPU seconds so far, of the machine and of this process. Their difference over a cell is what
    other processes took: on 2 cores that spoils the timings (an OpenMP thread waits for a descheduled
    sibling: a 1 ms call takes 8), so such a cell is measured again."""
    with open("/proc/stat") as f:
        jiffies = [int(x) for x in f.readline().split()[1:9]]
    own = os.times()
    return (sum(jiffies) - jiffies[3] - jiffies[4]) / os.sysconf("SC_CLK_TCK"), own.user + own.system


def others_cores(before, after, wall: float) -> float:  # (machine - own) busy seconds per second
    return max(0.0, (after[0] - before[0]) - (after[1] - before[1])) / wall


def wait_for_idle(limit: float, patience: float) -> None:
    """Wait (``patience`` s at most) until other processes use under ``limit`` cores for a second."""
    deadline = time.monotonic() + patience
    while time.monotonic() < deadline:
        before = cpu_seconds()
        time.sleep(1.0)
        if others_cores(before, cpu_seconds(), 1.0) < limit:
            return


class PeakCuda:
    """The CUDA allocator's peak above what was allocated before the block (exact, unlike RSS)."""

    def __enter__(self):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        self.base = torch.cuda.memory_allocated()
        self.samples = 0
        return self

    def __exit__(self, *exc):
        torch.cuda.synchronize()
        self.mib = (torch.cuda.max_memory_allocated() - self.base) / MiB


DEVICE = {"device": "cpu", "dtype": torch.float32}  # set by --device / --dtype


def _now() -> float:
    if DEVICE["device"] == "cuda":
        torch.cuda.synchronize()  # (around each timed call: the kernels are asynchronous)
    return time.perf_counter()


def qkv_like_the_model(total: int, heads: int, dim: int, seed: int) -> tuple[torch.Tensor, ...]:
    """q/k/v in the layout Qwen3-VL's vision attention passes on: q and k fresh (seq, heads, d) tensors
    (the rotary embedding's output), v a view into the fused qkv projection, all transposed to (1, heads,
    seq, d). The strides matter: grouped batches views of them, SDPA may copy them."""
    fused = torch.randn(total, 3, heads, dim, generator=torch.Generator().manual_seed(seed))
    fused = fused.to(DEVICE["device"], DEVICE["dtype"]).permute(1, 0, 2, 3)
    return tuple(t.transpose(0, 1).unsqueeze(0) for t in (fused[0].contiguous(), fused[1].contiguous(), fused[2]))


def sdpa_path_with_mask(q, k, v) -> str:
    """SDPA's kernel for block_diagonal's (1, 1, S, S) mask: 'flash' reads the mask blockwise, 'math'
    materializes heads x S x S scores. An expanded mask costs no memory to ask with."""
    if q.device.type != "cpu":
        return "device"  # (the CPU's choice is what decides memory on the host; on a GPU the allocator tells)
    mask = torch.ones(1, 1, 1, 1, dtype=torch.bool).expand(1, 1, q.shape[2], k.shape[2])
    try:
        return {0: "math", 1: "flash"}.get(int(torch._fused_sdp_choice(q, k, v, mask, 0.0, False)), "other")
    except (AttributeError, RuntimeError, TypeError):
        return "unknown"  # a private API; counted as math, the safe side for --max-gib


def block_diagonal_bytes(total: int, heads: int, itemsize: int, path: str) -> int:
    """What block_diagonal allocates beyond the others: the bool S x S mask and the additive float mask
    SDPA converts it to (peak RSS matches 1 + itemsize bytes per entry), on the math path also the
    scores q k^T and their softmax (heads x S x S each), and the int64 segment ids (+ their arange)."""
    scores = 0 if path == "flash" else 2 * heads * total * total * itemsize
    return total * total * (1 + itemsize) + scores + 16 * total


def time_backend(backend, qkv, sizes, cu_seqlens, call, max_repeats, budget_s):
    choice, seen = AttentionChoice(backend), []

    def counted(q, k, v, attention_mask=None):  # which calls a backend really makes, checked by the caller
        seen.append(attention_mask is not None)
        return call(q, k, v, attention_mask=attention_mask)

    def layer():  # one layer as the patched model runs it, from stock's lengths to stock's torch.cat
        lengths = cu_seqlens[1:] - cu_seqlens[:-1]
        splits = split_segments(lengths, cu_seqlens, sizes, choice, qkv)  # None for block_diagonal
        return torch.cat(segment_attention(counted, splits, qkv, cu_seqlens, choice), dim=1)

    watch = PeakCuda if DEVICE["device"] == "cuda" else PeakRSS
    with watch() as memory:  # memory is watched in the warm-up call, whose time is not reported
        start = _now()
        out = layer()
        warm = _now() - start
    calls, masked = len(seen), sum(seen)
    # Fewer repeats for slow cells (one 16k-patch block_diagonal call takes ~15 s on 2 cores); one at least.
    times = []
    for _ in range(max(1, min(max_repeats, int(budget_s / max(warm, 1e-6))))):
        start = _now()
        layer()
        times.append(_now() - start)
    return out, {"ms": 1e3 * statistics.median(times), "times_ms": [1e3 * t for t in times],
                 "peak_rss_mib": memory.mib, "rss_samples": memory.samples, "calls": calls, "masked_calls": masked}


def active_backends() -> tuple[str, ...]:
    """split, grouped, block_diagonal; and varlen where it runs (CUDA, PyTorch >= 2.10, bf16/fp16)."""
    from syncfree.rewrite.attention import varlen_available

    half = DEVICE["dtype"] in (torch.bfloat16, torch.float16)
    return BACKENDS + (("varlen",) if DEVICE["device"] == "cuda" and half and varlen_available() else ())


def run_cell(name, heads, dim, total, count, args, call) -> dict:
    length = total // count
    qkv = qkv_like_the_model(length * count, heads, dim, seed=total + count)
    cu_seqlens = (torch.arange(count + 1, dtype=torch.int32) * length).to(DEVICE["device"])
    path = sdpa_path_with_mask(*qkv)
    need = block_diagonal_bytes(length * count, heads, qkv[0].element_size(), path)
    cell = {"shape": name, "heads": heads, "head_dim": dim, "total": length * count, "segments": count,
            "segment_length": length, "sdpa_path_with_mask": path, "block_diagonal_analytic_mib": need / MiB,
            "backends": {}}
    for backend in active_backends():
        if backend == "block_diagonal" and need > args.max_gib * GiB:
            cell["backends"][backend] = {"skipped": f"skipped (would need {need / GiB:.1f} GiB)"}
            continue
        out, result = time_backend(backend, qkv, [length] * count, cu_seqlens, call, args.repeats, args.cell_budget)
        # A backend that fell back to another (the calls it made tell) would be measured under a false name.
        expected = {"split": (count, 0), "grouped": (1, 0), "block_diagonal": (1, 1), "varlen": (0, 0)}[backend]
        if (result["calls"], result["masked_calls"]) != expected:
            raise RuntimeError(f"{backend} made {result['calls']} calls ({result['masked_calls']} masked), not "
                               f"{expected[0]} ({expected[1]}): syncfree's backends changed, update this script")
        if backend == "split":
            reference = out
        elif backend == "grouped":
            result["equal_to_split"] = torch.equal(out, reference)
        else:  # one call over everything: its softmax sums run in another blocking, equal to rounding only
            result["max_abs_diff_vs_split"] = (out - reference).abs().max().item()
        cell["backends"][backend] = result
    return cell


def plot(cells, totals, path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(totals), figsize=(5.5 * len(totals), 9), squeeze=False)
    shown = [b for b in BACKENDS + ("varlen",) if any(b in c["backends"] for c in cells)]
    colors = dict(zip(BACKENDS + ("varlen",), ("tab:blue", "tab:green", "tab:red", "tab:purple")))
    counts = sorted({c["segments"] for c in cells})
    for col, total in enumerate(totals):
        top, bottom = axes[0][col], axes[1][col]
        for name, style in zip(SHAPES, ("-", "--")):
            mine = [c for c in cells if c["total"] == total and c["shape"] == name]
            short = name.removeprefix("qwen3-vl-").upper()
            for backend in shown:
                done = [c for c in mine if "ms" in c["backends"].get(backend, {})]
                xs, results = [c["segments"] for c in done], [c["backends"][backend] for c in done]
                kw = {"color": colors[backend], "marker": "o", "label": f"{backend} {short}"}
                top.plot(xs, [r["ms"] for r in results], style, **kw)
                bottom.plot(xs, [max(r["peak_rss_mib"], 0.1) for r in results], style, **kw)
                hit = [(c["segments"], c["backends"][backend]["ms"]) for c in done if c["disturbed"]]
                top.plot(*zip(*hit), "o", color=colors[backend], mfc="white") if hit else None
            bottom.plot([c["segments"] for c in mine], [c["block_diagonal_analytic_mib"] for c in mine], style,
                        color="black", alpha=0.5, label=f"block_diagonal analytic {short}")
        top.set_title(f"{total} patches: time per layer (median)")
        bottom.set_title(f"{total} patches: peak RSS above baseline")
        for ax, ylabel in ((top, "ms"), (bottom, "MiB (floor 0.1)")):
            ax.set(xscale="log", yscale="log", xlabel="equal-length segments", ylabel=ylabel)
            ax.set_xticks(counts, [str(n) for n in counts])
            ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(fontsize=8, loc="lower left"), axes[1][-1].legend(fontsize=8, loc="center right")
    fig.suptitle(f"Vision attention backends on the CPU: fp32, SDPA, {torch.get_num_threads()} threads, torch "
                 f"{torch.__version__}\nsolid: Qwen3-VL-2B vision (16 heads x 64), dashed: 8B (16 heads x 72); "
                 "hollow: other processes took cores during the cell (3 tries)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def summarize(cells, margin: float = 0.05) -> dict:
    """Cells where block_diagonal beats both others, and where grouped is slower than split by more than
    ``margin`` (with one segment grouped makes split's very call: there the ratio is the noise)."""
    key = lambda c: f'{c["shape"]} {c["total"]}x{c["segments"]}'  # noqa: E731
    ms = lambda c, b: c["backends"][b].get("ms", float("inf"))  # noqa: E731
    return {"block_diagonal_beats_split_and_grouped": [key(c) for c in cells if ms(c, "block_diagonal") < min(
                ms(c, "split"), ms(c, "grouped"))],
            "grouped_slower_than_split_by_5pct": [f'{key(c)} ({ms(c, "grouped") / ms(c, "split"):.2f}x)' for c in cells
                                                  if ms(c, "grouped") > (1 + margin) * ms(c, "split")],
            "disturbed_cells": [key(c) for c in cells if c["disturbed"]]}


def print_table(cells, summary) -> None:
    print("\n| shape | total x segments | split ms | grouped ms | block_diagonal ms | block_diagonal MiB "
          "(RSS / analytic) |\n|---|---|---:|---:|---:|---:|")
    for c in cells:
        b, bd = c["backends"], c["backends"]["block_diagonal"]
        bd_ms, rss = (f"{bd['ms']:.1f}", f"{bd['peak_rss_mib']:.0f}") if "ms" in bd else (bd["skipped"], "-")
        print(f"| {c['shape']} | {c['total']} x {c['segments']} | {b['split']['ms']:.1f} | {b['grouped']['ms']:.1f} "
              f"| {bd_ms} | {rss} / {c['block_diagonal_analytic_mib']:.0f} |")
    for name, found in summary.items():
        print(f"{name.replace('_', ' ')}: {found or 'no cell'}")


def _save(args, cells, began) -> tuple[dict, str]:
    """The JSON of what was measured so far (rewritten after every cell: a run cut short keeps its cells)."""
    summary = summarize(cells)
    result = {"benchmark": "attention_crossover", "quick": args.quick,
              "device": args.device, "dtype": args.dtype,
              "machine": {"gpu": torch.cuda.get_device_name() if args.device == "cuda" else None,
                          "torch": torch.__version__, "transformers": transformers.__version__,
                          "threads": torch.get_num_threads(), "cpu_count": os.cpu_count(),
                          "cpu_capability": torch.backends.cpu.get_cpu_capability(),
                          "processor": platform.processor() or platform.machine(), "python": platform.python_version()},
              "attention_call": f"transformers.integrations.sdpa_attention.sdpa_attention_forward, {args.dtype}, "
                                "no dropout",
              "timed": "torch.split of q/k/v + segment_attention + torch.cat; median of the repeats after a warm-up",
              "memory": "peak_rss_mib: process RSS peak above baseline in the warm-up call, /proc/self/statm every "
                        "~1 ms (approximate; on CUDA the allocator's peak); block_diagonal_analytic_mib: its masks "
                        "(+ scores on the math path)",
              "grid": {"shapes": {n: SHAPES[n] for n in args.shapes}, "totals": args.totals, "segments": args.segments,
                       "backends": list(active_backends()), "repeats": args.repeats, "cell_budget_s": args.cell_budget,
                       "max_gib": args.max_gib, "max_others": args.max_others, "retries": args.retries},
              "wall_s": time.perf_counter() - began, "summary": summary, "cells": cells}
    os.makedirs(args.out_dir, exist_ok=True)
    stem = "attention_crossover" + ("" if args.device == "cpu" else f"-{args.device}")
    json_path = os.path.join(args.out_dir, f"{stem}.json")
    with open(json_path, "w") as f:
        json.dump(result, f, indent=1)
    return result, json_path


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    arg = parser.add_argument
    arg("--quick", action="store_true", help="a tiny grid in seconds (the test runs it)")
    arg("--shapes", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    arg("--totals", nargs="+", type=int, default=[1024, 4096, 16384], help="patches per layer call")
    arg("--segments", nargs="+", type=int, default=[1, 2, 4, 8, 16, 32, 64])
    arg("--repeats", type=int, default=5, help="timed calls per cell at most, after one warm-up")
    arg("--cell-budget", type=float, default=2.0, help="seconds of timed calls per backend and cell (>= 1 call)")
    arg("--max-gib", type=float, default=6.0, help="skip block_diagonal where it would need more")
    arg("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    arg("--max-others", type=float, default=0.2, help="cores other processes may take during a cell, else again")
    arg("--retries", type=int, default=2, help="measurements again of a cell other processes disturbed")
    arg("--patience", type=float, default=60.0, help="seconds to wait for an idle machine before a cell")
    arg("--out-dir", default=os.path.join(tempfile.gettempdir(), "syncfree-results"),
        help="where to write (default: the temp folder; the recorded run used benchmarks/results)")
    arg("--device", default="cpu", choices=("cpu", "cuda"))
    arg("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    args = parser.parse_args(argv)
    DEVICE.update(device=args.device, dtype=getattr(torch, args.dtype))
    if args.device == "cuda":
        args.max_others, args.retries, args.patience = float("inf"), 0, 0  # host load does not disturb the GPU
    if args.quick:
        args.totals, args.segments, args.repeats, args.retries, args.patience = [128, 512], [1, 4, 16], 2, 0, 0
    if args.threads:
        torch.set_num_threads(args.threads)

    # SDPA as Transformers runs it, through the lambda VISION_ATTENTION builds (models/edits.py); the
    # stand-in module carries what sdpa_attention_forward reads from Qwen3VLVisionAttention.
    module = SimpleNamespace(is_causal=False, num_key_value_groups=1, training=False)
    calls = {dim: (lambda q, k, v, attention_mask=None, s=dim**-0.5: sdpa_attention_forward(
        module, q, k, v, attention_mask=attention_mask, scaling=s, dropout=0.0, is_causal=False)[0])
        for _, dim in SHAPES.values()}
    time_backend("split", qkv_like_the_model(256, 16, 64, 0), [256], torch.tensor([0, 256], device=args.device),
                 calls[64], 1, 0)  # warm

    cells, began = [], time.perf_counter()
    for name in args.shapes:
        for total in args.totals:
            for count in args.segments:
                for attempt in range(1 + args.retries):
                    wait_for_idle(args.max_others, args.patience)
                    before, start = cpu_seconds(), time.perf_counter()
                    cell = run_cell(name, *SHAPES[name], total, count, args, calls[SHAPES[name][1]])
                    cell["others_cores"] = round(others_cores(before, cpu_seconds(), time.perf_counter() - start), 3)
                    cell["attempts"], cell["disturbed"] = attempt + 1, cell["others_cores"] > args.max_others
                    if not cell["disturbed"] or attempt == args.retries:
                        break
                    print(f"  other processes took {cell['others_cores']:.2f} cores: {name} {total} x {count} again")
                cells.append(cell)
                b = cell["backends"]
                print(f"[{time.perf_counter() - began:5.0f} s] {name} {total:>5} x {count:>2} (others "
                      f"{cell['others_cores']:.2f} cores): " + ", ".join(
                          f"{k} {v['ms']:.1f} ms" if "ms" in v else f"{k} {v['skipped']}" for k, v in b.items())
                      + f"; grouped equal: {b['grouped']['equal_to_split']}, block_diagonal max diff: "
                      + f"{b['block_diagonal'].get('max_abs_diff_vs_split', '-')}", flush=True)
                _save(args, cells, began)

    result, json_path = _save(args, cells, began)
    summary, stem = result["summary"], os.path.basename(json_path).removesuffix(".json")
    try:
        plot(cells, args.totals, os.path.join(args.out_dir, f"{stem}.png"))
    except ImportError:
        print("no PNG written: matplotlib is not installed (pip install matplotlib)")
    print_table(cells, summary)
    print(f"wrote {json_path} ({result['wall_s']:.0f} s)")
    return result


if __name__ == "__main__":
    main()
