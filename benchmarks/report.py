"""Turn benchmark records into the markdown table, the JSON file, RESULTS.md and plots.

* :func:`run_metadata`: date, commit (``BLOCKSCALE_COMMIT``, else read from ``.git``), device,
  command, library versions;
* :func:`markdown`: per-suite tables (a row per implementation and case; no number where the
  output failed its check or the case did not run, the reason instead), plus a compact MoE
  latency table with one column per implementation;
* :func:`write_json`, :func:`append_results`, :func:`write_plots` (matplotlib when it imports,
  else a sentence saying so; ``benchmarks/plot.py`` redraws them from the JSON anywhere).
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import sys
from collections.abc import Sequence
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, __file__.rsplit("/benchmarks/", 1)[0])

from benchmarks.common import Record

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SUITE_TITLES = {
    "ceiling": "Ceilings (measured on this machine)",
    "quantize": "Quantize (bf16 -> NVFP4 / MXFP4 / MXFP8, 5-D scales)",
    "matmul": "Dense block-scaled matmul (benchmarks/bench_matmul.py)",
    "moe_gate_up": "MoE gate_up grouped GEMM (uniform random routing)",
    "moe_e2e": "Whole MoE expert computation (E=256, top-6, hidden 4096, intermediate 2048)",
}


# ----------------------------------------------------------------------------- metadata


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().strip()
    except OSError:
        return None


def git_commit(root: str = ROOT) -> str:
    """``$BLOCKSCALE_COMMIT``, else HEAD read from ``.git`` files (no git needed), else
    "unknown"."""
    env = os.environ.get("BLOCKSCALE_COMMIT", "").strip()
    if env:
        return env
    git = os.path.join(root, ".git")
    if os.path.isfile(git):  # worktree / submodule: "gitdir: <path>"
        text = _read(git) or ""
        if text.startswith("gitdir:"):
            git = os.path.join(root, text.split(":", 1)[1].strip())
    head = _read(os.path.join(git, "HEAD"))
    if head is None:
        return "unknown"
    if not head.startswith("ref:"):
        return head[:12]
    ref = head.split(":", 1)[1].strip()
    common = _read(os.path.join(git, "commondir"))
    dirs = [git] + ([os.path.join(git, common)] if common else [])
    for d in dirs:
        value = _read(os.path.join(d, ref))
        if value:
            return value[:12]
        packed = _read(os.path.join(d, "packed-refs")) or ""
        for line in packed.splitlines():
            if line.endswith(" " + ref):
                return line.split()[0][:12]
    return f"unknown ({ref})"


def _version(name: str) -> str:
    try:
        module = __import__(name)
    except Exception:  # noqa: BLE001 - absent or broken: say so
        return "absent"
    return str(getattr(module, "__version__", "?"))


def run_metadata(argv: Sequence[str], device: str) -> dict[str, Any]:
    """What RESULTS.md and the JSON record about one run."""
    return {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": git_commit(),
        "device": device,
        "command": " ".join(["python", *argv]),
        "python": platform.python_version(),
        "torch": _version("torch"),
        "triton": _version("triton"),
        "numpy": _version("numpy"),
    }


# ----------------------------------------------------------------------------- markdown


def _num(v: float | None, digits: int = 3) -> str:
    if v is None:
        return "—"
    if v >= 100:
        return f"{v:.0f}"
    return f"{v:.{digits}g}" if v < 1 else f"{v:.{digits}f}"


def _cell(text: str, limit: int = 110) -> str:
    text = " ".join(str(text).split()).replace("|", "\\|")
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _detail_table(recs: Sequence[Record]) -> list[str]:
    lines = ["| case | implementation | fmt | ms | TB/s | TFLOP/s | status | check / note |",
             "|---|---|---|---:|---:|---:|---|---|"]
    for r in recs:
        ms = _num(r.ms, 4) if r.ms is not None else "—"
        why = r.check if r.status in ("ok", "published", "derived") else r.check or r.note
        lines.append(f"| {_cell(r.case, 40)} | {_cell(r.impl, 60)} | {r.fmt} | {ms} | "
                     f"{_num(r.tbps)} | {_num(r.tflops)} | {r.status} | {_cell(why)} |")
    return lines


def _latency_pivot(recs: Sequence[Record]) -> list[str]:
    """Cases as rows, implementations as columns, ms (or the status) in the cells."""
    impls: list[str] = []
    cases: list[str] = []
    cell: dict[tuple[str, str], str] = {}
    for r in recs:
        if r.impl == "all":
            continue
        if r.impl not in impls:
            impls.append(r.impl)
        if r.case not in cases:
            cases.append(r.case)
        cell[(r.case, r.impl)] = _num(r.ms, 4) if r.ms is not None else r.status
    lines = ["| case | " + " | ".join(_cell(i, 48) for i in impls) + " |",
             "|---|" + "---:|" * len(impls)]
    for c in cases:
        lines.append(f"| {c} | " + " | ".join(cell.get((c, i), "") for i in impls) + " |")
    return lines


def markdown(records: Sequence[Record], meta: dict[str, Any], notes: Sequence[str] = ()
             ) -> str:
    """The run as markdown: a header with the run's metadata, then one section per suite."""
    out = [f"## {meta['date']} — {meta['device']}", "",
           (f"commit `{meta['commit']}`; command `{meta['command']}`; python "
            f"{meta['python']}, torch {meta['torch']}, triton {meta['triton']}, numpy "
            f"{meta['numpy']}"), ""]
    for suite, title in SUITE_TITLES.items():
        recs = [r for r in records if r.suite == suite]
        if not recs:
            continue
        out += [f"### {title}", ""]
        if suite in ("moe_gate_up", "moe_e2e"):
            out += ["Latency in ms (a status instead of a number: see the detail rows).", ""]
            out += _latency_pivot(recs) + [""]
        out += _detail_table(recs) + [""]
    if notes:
        out += ["Notes:", ""] + [f"- {n}" for n in notes] + [""]
    return "\n".join(out)


# ----------------------------------------------------------------------------- files


def write_json(records: Sequence[Record], meta: dict[str, Any], out_dir: str) -> str:
    """``<out_dir>/results.json`` with the metadata and every record."""
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "results.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"meta": meta, "records": [r.to_dict() for r in records]}, f, indent=1)
    return path


def load_json(path: str) -> tuple[dict[str, Any], list[Record]]:
    """(metadata, records) from a results.json."""
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    return doc.get("meta", {}), [Record.from_dict(d) for d in doc.get("records", [])]


def append_results(md: str, path: str) -> None:
    """Append one run's markdown to RESULTS.md (created with no header if missing)."""
    with open(path, "a", encoding="utf-8") as f:
        f.write("\n" + md.rstrip() + "\n")


def write_plots(records: Sequence[Record], out_dir: str) -> list[str] | str:
    """PNG plots in ``out_dir`` (paths), or a sentence saying why there are none."""
    try:
        import matplotlib

        matplotlib.use("Agg")
    except ImportError:
        return ("matplotlib is not installed here: no plots; run `python benchmarks/plot.py "
                f"{os.path.join(out_dir, 'results.json')}` where it is")
    from benchmarks import plot

    return plot.draw_all(records, out_dir)
