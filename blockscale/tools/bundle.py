"""Precompile every kernel the GPU tests and benchmarks need into a bundle directory.

``python -m blockscale.tools.bundle --out build/gpu [--target sm_90a]`` (``make gpu-bundle``)
collects ``bundle_specs(target)`` of every op module registered in ``blockscale.ops._core``,
compiles each spec (through the compiler's disk cache), writes it with
``launch.save_kernel(out, kernel_key(spec), binary)`` and prints one table row per kernel (op,
spec, key, registers, spills). ``manifest.json`` in the output directory lists the same. The GPU
machine then only needs the runtime: ``BLOCKSCALE_BUNDLE_DIR=build/gpu pytest -m gpu``.
Needs MLIR and the target's toolchain; no GPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import sys
import time
import traceback
from collections.abc import Sequence
from typing import Any

from blockscale.launch import KernelBinary, load_kernel, save_kernel

__all__ = ["BundleEntry", "build_bundle", "main"]


@dataclasses.dataclass
class BundleEntry:
    """One row of the bundle table / manifest."""

    op: str
    spec: str
    key: str
    kernel: str = ""
    target: str = ""
    registers: int | None = None
    spills: int | None = None
    dynamic_shared_bytes: int = 0
    seconds: float = 0.0
    status: str = "compiled"  # "compiled" | "present" | "failed: ..."


def _spec_text(spec: Any) -> str:
    """A compact one-line spec: its fields without the target (a column of its own)."""
    if dataclasses.is_dataclass(spec):
        fields = [f"{f.name}={getattr(spec, f.name)!r}" for f in dataclasses.fields(spec)
                  if f.name != "target"]
        return f"{type(spec).__name__}({', '.join(fields)})"
    return repr(spec)


def _entry_from(op: str, spec: Any, key: str, binary: KernelBinary, seconds: float,
                status: str) -> BundleEntry:
    meta = binary.meta or {}
    regs = meta.get("registers")
    spills = (None if "spill_stores" not in meta and "spill_loads" not in meta
              else int(meta.get("spill_stores") or 0) + int(meta.get("spill_loads") or 0))
    return BundleEntry(op, _spec_text(spec), key, binary.name, binary.target, regs, spills,
                       binary.dynamic_shared_bytes, round(seconds, 3), status)


def _collect_specs(core: Any, target: str, entries: list[BundleEntry], log: Any) -> list[Any]:
    """``bundle_specs(target)`` of each op module (registered or public); a module whose
    collection fails gets a "failed" entry and the others still count."""
    import importlib

    import blockscale.ops

    names = list(core.op_modules())  # registered ones, plus every public op module
    names += [f"blockscale.ops.{m}" for m in blockscale.ops.op_module_names()
              if f"blockscale.ops.{m}" not in names]
    specs: list[Any] = []
    for module_name in names:
        fn = getattr(importlib.import_module(module_name), "bundle_specs", None)
        if fn is None:
            continue
        try:
            specs.extend(fn(target))
        except Exception as e:  # noqa: BLE001
            entries.append(BundleEntry(module_name.rsplit(".", 1)[-1],
                                       f"bundle_specs({target!r})", "-", target=target,
                                       status=f"failed: {e!r}"))
            print(f"[bundle] {module_name}.bundle_specs({target!r}) failed:\n"
                  f"{traceback.format_exc()}", file=log)
    return specs


def _extra_specs(extra: Sequence[str], target: str) -> list[Any]:
    """Specs from ``module:function`` providers (e.g. the GPU fuzzer's ``fuzz_specs``)."""
    import importlib

    specs: list[Any] = []
    for item in extra:
        module_name, _, func = item.partition(":")
        if not func:
            raise ValueError(f"--extra must be MODULE:FUNCTION, got {item!r}")
        specs.extend(getattr(importlib.import_module(module_name), func)(target))
    return specs


def build_bundle(out: str, targets: Sequence[str], *, only: Sequence[str] = (),
                 force: bool = False, log: Any = sys.stdout,
                 extra: Sequence[str] = (), strip_mlir: bool = False) -> list[BundleEntry]:
    """Compile the registered ops' bundle specs for ``targets`` into ``out``.

    Entries already in ``out`` under the same key are kept unless ``force``. ``strip_mlir``:
    entries carry no MLIR text (a GPU machine launches the binary; only the interpreter
    device needs the MLIR, and it is most of a bundle's bytes). A spec that
    fails to compile, or an op module whose import or ``bundle_specs`` fails, is reported
    (status "failed: ...") and the others still run.
    """
    import importlib

    import blockscale.ops
    from blockscale.ops import _core

    entries: list[BundleEntry] = []
    for name in blockscale.ops.op_module_names():  # op modules register themselves on import
        try:
            importlib.import_module(f"blockscale.ops.{name}")
        except Exception as e:  # noqa: BLE001
            entries.append(BundleEntry(name, "-", "-", status=f"failed: import: {e!r}"))
            print(f"[bundle] import of blockscale.ops.{name} failed: {e!r}", file=log)
    if not _core.op_modules():
        raise RuntimeError("no op modules are registered in blockscale.ops._core; nothing to "
                           "bundle")
    for target in targets:
        for spec in _collect_specs(_core, target, entries, log) + _extra_specs(extra, target):
            op = str(getattr(spec, "op", type(spec).__name__))
            if only and op not in only:
                continue
            key = _core.kernel_key(spec)
            t0 = time.perf_counter()
            existing = None if force else load_kernel(out, key)
            if existing is not None:
                if strip_mlir and existing.mlir:
                    save_kernel(out, key, dataclasses.replace(existing, mlir=""))
                entries.append(_entry_from(op, spec, key, existing, 0.0, "present"))
                continue
            try:
                binary = _core.compile_kernel(spec).binary
            except Exception as e:  # noqa: BLE001 (keep going; report at the end)
                entries.append(BundleEntry(op, _spec_text(spec), key,
                                           status=f"failed: {type(e).__name__}: {e}"))
                print(f"[bundle] {op} {key} failed:\n{traceback.format_exc()}", file=log)
                continue
            save_kernel(out, key, dataclasses.replace(binary, mlir="") if strip_mlir else binary)
            entries.append(_entry_from(op, spec, key, binary, time.perf_counter() - t0,
                                       "compiled"))
    if only:  # module-level failures (import, bundle_specs) were printed; they are not asked for
        entries = [e for e in entries if e.key != "-"]
    return entries


def format_table(entries: Sequence[BundleEntry]) -> str:
    """The entries as an aligned text table."""
    header = ("op", "target", "spec", "key", "regs", "spills", "smem", "status")
    rows = [(e.op, e.target, e.spec, e.key,
             "-" if e.registers is None else str(e.registers),
             "-" if e.spills is None else str(e.spills), str(e.dynamic_shared_bytes),
             e.status if e.status != "compiled" else f"compiled {e.seconds:.1f}s")
            for e in entries]
    widths = [max([len(h)] + [min(len(r[i]), 90) for r in rows]) for i, h in enumerate(header)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths))]
    lines.append("  ".join("-" * w for w in widths))
    for r in rows:
        cells = [c if len(c) <= 90 else c[:87] + "..." for c in r]
        lines.append("  ".join(c.ljust(w) for c, w in zip(cells, widths)))
    return "\n".join(lines)


def prune(out: str, entries: Sequence[BundleEntry]) -> int:
    """Delete the kernel files in ``out`` whose key is not among ``entries`` (stale kernels of
    edited generators); returns how many kernels were removed."""
    keep = {e.key for e in entries}
    removed = set()
    for name in os.listdir(out):
        stem, ext = os.path.splitext(name)
        if ext in (".json", ".cubin", ".hsaco") and name != "manifest.json" and stem not in keep:
            os.remove(os.path.join(out, name))
            removed.add(stem)
    return len(removed)


def write_manifest(out: str, targets: Sequence[str], entries: Sequence[BundleEntry]) -> str:
    """Write ``manifest.json`` (atomic); returns its path."""
    import blockscale

    path = os.path.join(out, "manifest.json")
    doc = {
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "blockscale_version": getattr(blockscale, "__version__", "0"),
        "targets": list(targets),
        "kernels": [dataclasses.asdict(e) for e in entries],
    }
    os.makedirs(out, exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
    os.replace(tmp, path)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m blockscale.tools.bundle",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="bundle directory (e.g. build/gpu)")
    parser.add_argument("--target", action="append", default=None,
                        help="GPUTarget name; repeat or comma-separate (default: sm_90a)")
    parser.add_argument("--op", action="append", default=[],
                        help="only this op (repeatable)")
    parser.add_argument("--force", action="store_true",
                        help="recompile entries already in --out")
    parser.add_argument("--extra", action="append", default=[],
                        help="MODULE:FUNCTION returning more specs for a target (repeatable)")
    parser.add_argument("--strip-mlir", action="store_true",
                        help="store no MLIR text in the entries (smaller; no interpreter)")
    parser.add_argument("--prune", action="store_true",
                        help="delete kernels in --out that this run did not list")
    args = parser.parse_args(argv)
    targets = [t for group in (args.target or ["sm_90a"]) for t in group.split(",") if t]
    entries = build_bundle(args.out, targets, only=args.op, force=args.force,
                           extra=args.extra, strip_mlir=args.strip_mlir)
    print(format_table(entries))
    if args.prune:
        if args.op:
            parser.error("--prune needs the whole bundle (no --op)")
        print(f"pruned {prune(args.out, entries)} stale kernels")
    manifest = write_manifest(args.out, targets, entries)
    failed = [e for e in entries if e.status.startswith("failed")]
    print(f"\n{len(entries) - len(failed)} kernels in {args.out} ({manifest}); "
          f"{len(failed)} failed")
    if not entries:
        print("warning: no bundle specs for these targets", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
