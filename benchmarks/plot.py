"""Draw the benchmark plots from a results.json, on any machine with matplotlib.

    python benchmarks/plot.py out/bench/results.json [--out DIR]

* ``roofline.png``: left, achieved TFLOP/s against arithmetic intensity (FLOP per byte moved)
  for the matmul and MoE cases, under the measured ceilings (copy bandwidth slope, cuBLAS bf16
  and FP8 GEMM); right, achieved TB/s of the quantize kernels beside the copy bandwidth.
* ``moe_latency.png``: gate_up latency against T per model, and the whole-MoE latency against
  batch, one line per implementation (ours and each baseline), with the published FlashInfer
  numbers and the HBM floor.

Only records with a number (status ok / published / derived) are drawn.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

if __package__ in (None, ""):
    sys.path.insert(0, __file__.rsplit("/benchmarks/", 1)[0])

from benchmarks.common import Record

DRAWN = ("ok", "published", "derived")


def _ceilings(records: Sequence[Record]) -> dict[str, float]:
    out: dict[str, float] = {}
    for r in records:
        if r.suite != "ceiling" or r.status != "ok":
            continue
        if r.tbps:
            out["copy TB/s"] = r.tbps
        elif r.tflops:
            key = "bf16" if r.fmt == "bf16" else "fp8"
            out[key] = max(out.get(key, 0.0), r.tflops)
    return out


def roofline(records: Sequence[Record], path: str) -> str:
    """The roofline figure (see the module docstring); returns ``path``."""
    import matplotlib.pyplot as plt

    ceil = _ceilings(records)
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(14, 5.5))
    pts = [r for r in records if r.status == "ok" and r.tflops and r.params.get("bytes")
           and r.params.get("flops") and r.suite in ("matmul", "moe_gate_up", "moe_e2e")]
    xs = [r.params["flops"] / r.params["bytes"] for r in pts] or [1.0, 1000.0]
    lo, hi = min(xs) / 2, max(xs) * 2
    grid = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    bw = ceil.get("copy TB/s")
    for key, style in (("bf16", "-"), ("fp8", "--")):
        if key in ceil:
            y = [min(ceil[key], bw * x) if bw else ceil[key] for x in grid]
            ax.plot(grid, y, "k" + style, lw=1, label=f"ceiling: cuBLAS {key} "
                    f"{ceil[key]:.0f} TFLOP/s" + (f", copy {bw:.2f} TB/s" if bw else ""))
    markers = {"matmul": "o", "moe_gate_up": "s", "moe_e2e": "^"}
    series = sorted({(r.suite, r.impl) for r in pts})
    for suite, impl in series:
        sel = [r for r in pts if r.impl == impl and r.suite == suite]
        ax.scatter([r.params["flops"] / r.params["bytes"] for r in sel],
                   [r.tflops for r in sel], s=22, label=f"{suite}: {impl}",
                   marker=markers.get(suite, "o"))
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP / byte moved)")
    ax.set_ylabel("achieved TFLOP/s")
    ax.set_title("matmul (o), MoE gate_up (s), whole MoE (^)")
    ax.legend(fontsize=6, loc="lower right")
    ax.grid(True, which="both", lw=0.3)
    q = [r for r in records if r.suite == "quantize" and r.status == "ok" and r.tbps]
    if q:
        labels = [f"{r.case} {r.fmt}: {r.impl}" for r in q]
        bx.barh(range(len(q)), [r.tbps for r in q], color="tab:blue")
        bx.set_yticks(range(len(q)), labels, fontsize=6)
        if bw:
            bx.axvline(bw, color="k", ls="--", lw=1, label=f"D2D copy {bw:.2f} TB/s")
            bx.legend(fontsize=7)
        bx.set_xlabel("achieved TB/s (bytes read + written)")
        bx.set_title("quantize bandwidth")
    else:
        bx.text(0.5, 0.5, "no quantize results", ha="center", transform=bx.transAxes)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


def moe_latency(records: Sequence[Record], path: str) -> str:
    """The MoE latency figure (see the module docstring); returns ``path``."""
    import matplotlib.pyplot as plt

    gate = [r for r in records if r.suite == "moe_gate_up" and r.status in DRAWN and r.ms]
    e2e = [r for r in records if r.suite == "moe_e2e" and r.status in DRAWN and r.ms]
    models = sorted({r.params.get("model", "?") for r in gate})
    panels = [(f"gate_up {m}", [r for r in gate if r.params.get("model") == m], "T (tokens)")
              for m in models] + [("whole MoE E=256 top-6 4096/2048", e2e, "batch (tokens)")]
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 5), squeeze=False)
    for ax, (title, recs, xlabel) in zip(axes[0], panels):
        for impl in sorted({r.impl for r in recs}):
            sel = sorted((r for r in recs if r.impl == impl), key=lambda r: r.params["T"])
            style = ":" if sel[0].status == "derived" else "-"
            marker = "*" if sel[0].status == "published" else "o"
            ax.plot([r.params["T"] for r in sel], [r.ms for r in sel], style, marker=marker,
                    label=impl)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("ms")
        ax.set_title(title)
        ax.grid(True, which="both", lw=0.3)
        if recs:
            ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


def draw_all(records: Sequence[Record], out_dir: str) -> list[str]:
    """Both figures into ``out_dir``; returns their paths."""
    os.makedirs(out_dir, exist_ok=True)
    return [roofline(records, os.path.join(out_dir, "roofline.png")),
            moe_latency(records, os.path.join(out_dir, "moe_latency.png"))]


def main(argv: Sequence[str] | None = None) -> int:
    from benchmarks.report import load_json

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("json", help="results.json written by benchmarks/run.py")
    p.add_argument("--out", default=None, help="directory for the PNGs (default: the JSON's)")
    ns = p.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    _, records = load_json(ns.json)
    for path in draw_all(records, ns.out or os.path.dirname(os.path.abspath(ns.json))):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
