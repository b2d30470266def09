"""A CTA tile's epilogue staged through shared memory and written by bulk copies (sm_90a).

Imports MLIR only in :func:`store_tile_staged`. Used by the two-phase matmul's phase 2
(:mod:`blockscale.ops.matmul_twophase`, ``store="staged"``) in place of
:func:`blockscale.ops.matmul_sm90.store_tile`, whose per-element 2-byte global stores (128
``STG.E.U16`` per thread and tile, 8 of every 32 bytes
of a sector used) took ~23 % of phase 2's warp stall samples on the H200 (Nsight Compute,
2026-11-30: ``lg`` throttle on the epilogue stores while the tensor cores idle).

Per tile (``bm`` x ``bn``, every thread of the CTA):

1. a CTA barrier: every warpgroup has retired its wgmmas (``wait_group 0``) and no bulk copy
   into the ring is in flight, so the ring's bytes are free;
2. each thread computes its accumulator pairs (columns ``2t, 2t + 1`` of an m16n8 C tile) as
   :func:`~blockscale.ops.matmul_sm90.store_tile` does (``scale``, the fused epilogue, the
   cast: the same values) and stores the pair as one 4-byte (bf16) / 8-byte (f32) word at
   ``row * pitch + col * esize`` of the stage, ``pitch = bn * esize + 16`` (the 16 bytes of
   padding put the 8 rows of a warp's store in distinct banks);
3. ``fence.proxy.async.shared::cta`` (the generic stores become visible to the bulk copies)
   and a CTA barrier;
4. thread ``r < bm`` copies row ``r`` of the tile (``min(bn, N - n0) * esize`` bytes, rows
   ``m0 + r < M`` only) to ``C[m0 + r, n0:]`` with one ``cp.async.bulk.global.shared::cta``,
   commits it and waits until its source was read (``wait_group.read 0``).

So the output bytes are the direct store's; rows / columns past M / N are neither computed
into C nor copied. Needs ``N * esize % 16 == 0`` and a 16-byte aligned C (:func:`supported`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def elem_bytes(out_dtype: str) -> int:
    """Bytes of one output element."""
    return 2 if out_dtype == "bfloat16" else 4


def pitch(out_dtype: str, bn: int) -> int:
    """Bytes between two rows of the staged tile."""
    return bn * elem_bytes(out_dtype) + 16


def stage_bytes(out_dtype: str, bm: int, bn: int) -> int:
    """Shared bytes the staged tile needs."""
    return bm * pitch(out_dtype, bn)


#: BLOCKSCALE_SM90_STAGED_STORE=0 makes the dispatch choose direct stores. compute-sanitizer's
#: initcheck does not see the bulk copies' global writes (it reports every staged output byte
#: as uninitialized; the bytes equal the direct stores', tests/test_matmul_twophase.py on the
#: H200), so tools/sanitize.sh runs initcheck with it
ENV_SWITCH = "BLOCKSCALE_SM90_STAGED_STORE"


def supported(out_dtype: str, n: int) -> bool:
    """Whether rows of an ``n``-column output start on 16-byte boundaries (the bulk copies)."""
    return (n * elem_bytes(out_dtype)) % 16 == 0


def check_store(store: str, out_dtype: str, n: int) -> None:
    """ValueError when a ``store`` epilogue ("direct" / "staged") cannot write rows of ``n``
    columns."""
    if store == "staged" and not supported(out_dtype, n):
        raise ValueError(f"store 'staged' needs n * {elem_bytes(out_dtype)} bytes to be a "
                         f"multiple of 16 (16-byte aligned output rows), got n={n}")


def dispatch_store(out_dtype: str, n: int) -> str:
    """The dispatch's epilogue store: "staged" where :func:`supported` and not switched off
    (:data:`ENV_SWITCH`), else "direct"."""
    import os

    off = os.environ.get(ENV_SWITCH, "1") in ("0", "false", "off")
    return "staged" if supported(out_dtype, n) and not off else "direct"


def hoisted(epilogue: Any) -> Any:
    """The per-thread form of ``epilogue`` (``epilogue.fn.hoist``), or None (every existing
    epilogue: the per-element path, unchanged). An epilogue whose inputs are per row / column
    can give one, so the store loops load them once per row / column of a thread's fragment
    instead of once per element inside each store guard (issue #9). Its protocol:

    * ``row(buffers, m, m_count)`` / ``col(buffers, n, n_count)``: a state for output row
      ``m`` / column ``n``, emitted outside the store guards (``m`` / ``n`` may lie past the
      output: clamp before loading);
    * ``apply(value, row_state, col_state, ctx)``: the whole epilogue's value at (m, n);
    * ``loads_in_apply``: whether ``apply`` still loads inputs at (m, n) (then only inside C);
    * optional ``fast(buffers, rows, m_count, n0, n_count, bn) -> (cond, variant)``: an i1
      uniform over the warp (all 32 lanes call it: it may shuffle) and a variant (the same
      protocol) that computes the same values wherever ``cond`` holds for the warp's rows
      (``rows``: this lane's) and its columns ``n0 .. n0 + bn`` (``n0`` here: the warp's
      first column); the loops then branch once per m-tile (:func:`tiles`).
    """
    return getattr(epilogue.fn, "hoist", None) if epilogue is not None else None


def tiles(hoist: Any, acc: list, wc: Any, m0: Any, n0: Any, m_count: Any, n_count: Any,
          buffers: dict, body: Callable[..., None]) -> None:
    """The n-tiles of ``acc`` with a :func:`hoisted` epilogue: ``body(h, mt, nt, vals, rows,
    row_states, cols, col_states)`` per n-tile (rows ``g``, ``g + 8``, columns ``2t``, ``2t +
    1``; the row states once per m-tile, the column states once per n-tile, outside any
    guard); ``h`` is ``hoist``, or under its ``fast`` condition its variant (one branch per
    m-tile and thread, the two loops in its arms)."""
    from blockscale.compiler import ir as bir

    for mt, row in enumerate(acc):
        rows = [bir.add(m0, wc.c_row(mt, p)) for p in (0, 2)]

        def loop(h: Any, mt: int = mt, row: list = row, rows: list = rows) -> None:
            row_states = [h.row(buffers, m, m_count) for m in rows]
            for nt, vals in enumerate(row):
                cols = [bir.add(n0, wc.c_col(nt, j)) for j in (0, 1)]
                col_states = [h.col(buffers, n, n_count) for n in cols]
                body(h, mt, nt, vals, rows, row_states, cols, col_states)

        split = getattr(hoist, "fast", None)
        if split is None:
            loop(hoist)
            continue
        # the warp's columns: n0 + col0 .. + 8 per n-tile
        cond, fast = split(buffers, rows, m_count, bir.add(n0, wc.col0), n_count, 8 * len(row))
        br = bir.if_(cond, [])
        with br.then():
            loop(fast)
            br.yield_()
        with br.else_():
            loop(hoist)
            br.yield_()


def store_tile_staged(spec: Any, kb: Any, acc: list, wc: Any, smem: Any, m0: Any, n0: Any,
                      m_count: Any, n_count: Any, scale: Callable[[Any, Any, Any], Any],
                      bm: int, bn: int, writers: Any = None, base: int = 0) -> None:
    """Store the accumulator tiles ``acc`` (m16n8 C tiles, :class:`WarpCoords` ``wc``) of the
    ``bm`` x ``bn`` tile at ``(m0, n0)`` to ``c`` through the shared buffer ``smem`` (an i8
    memref of at least :func:`stage_bytes`), as the module docstring says. ``scale(v, m,
    n)`` and ``spec.epilogue`` as :func:`~blockscale.ops.matmul_sm90.store_tile`.
    ``writers``: an i1 value, true in the threads whose ``acc`` is stored (step 2 runs under
    it: e.g. the consumer warpgroups of a warp-specialized CTA, whose other threads only
    join the barriers and bulk copies); None: every thread (no branch). ``base``: the staged
    tile's byte offset in ``smem`` (a multiple of 16; e.g. past a persistent CTA's ring,
    which keeps loading the next tile meanwhile: step 1 then orders this epilogue after the
    previous tile's, whose copies finished reading before their threads went on)."""
    if base % 16:
        raise ValueError(f"base must be a multiple of 16, got {base}")
    from mlir.dialects import arith

    from blockscale.compiler import ir as bir
    from blockscale.compiler.arch import cpasync
    from blockscale.compiler.arch import wgmma as W
    from blockscale.ops.matmul_epilogue import EpilogueContext

    epilogue = getattr(spec, "epilogue", None)
    bf16 = spec.out_dtype == "bfloat16"
    out_t = bir.bf16() if bf16 else bir.f32()
    esize, row_pitch = elem_bytes(spec.out_dtype), pitch(spec.out_dtype, bn)
    pair_i8 = bir.vec(2 * esize, bir.i8())
    buffers = {i.name: (i, kb.arg(i.name)) for i in epilogue.inputs} if epilogue else {}

    def value(v: Any, m: Any, n: Any) -> Any:
        v = scale(v, m, n)
        if epilogue is not None:
            v = epilogue.fn(v, EpilogueContext(m, n, n_count, out_t, buffers))
        if v.type != out_t:
            if v.type != bir.f32():
                raise TypeError(f"epilogue must return an f32 or {out_t} value, got {v.type}")
            v = arith.truncf(out_t, v)
        return v

    bir.barrier()  # 1. every warpgroup's wgmmas retired: the ring is free (or: the last
    # tile's bulk copies, waited for by their threads, finished reading the staged bytes)
    hoist = hoisted(epilogue)
    if hoist is not None:
        def stage() -> None:
            _stage_hoisted(hoist, acc, wc, smem, m0, n0, m_count, n_count, scale, out_t,
                           pair_i8, esize, row_pitch, buffers, base)
        if writers is None:
            stage()
        else:
            with bir.when(writers):
                stage()
    elif writers is None:
        _stage(acc, wc, smem, m0, n0, m_count, n_count, value, out_t, pair_i8, esize,
               row_pitch, epilogue is None, base)
    else:
        with bir.when(writers):
            _stage(acc, wc, smem, m0, n0, m_count, n_count, value, out_t, pair_i8, esize,
                   row_pitch, epilogue is None, base)
    W.fence_proxy_async_shared()  # 3. the stores become visible to the async proxy
    bir.barrier()
    tid = bir.thread_idx("x")
    rows = bir.sub(bir.umin(bir.add(m0, bm), m_count), m0)
    with bir.when(bir.ult(tid, rows)):  # 4. one bulk copy per row
        nbytes = bir.mul(bir.sub(bir.umin(bir.add(n0, bn), n_count), n0), esize)
        dst = bir.add(cpasync.global_address(kb.arg("c")),
                      bir.as_i64(bir.mul(bir.add(bir.mul(bir.add(m0, tid), n_count), n0), esize)))
        src = bir.add(W.shared_address(smem), bir.as_i64(bir.add(bir.mul(tid, row_pitch), base)))
        cpasync.bulk_store(dst, src, bir.as_i32(nbytes))
        cpasync.bulk_commit()
        cpasync.bulk_wait_read(0)


def _stage(acc: list, wc: Any, smem: Any, m0: Any, n0: Any, m_count: Any, n_count: Any,
           value: Callable[[Any, Any, Any], Any], out_t: Any, pair_i8: Any, esize: int,
           row_pitch: int, no_loads: bool, base: int = 0) -> None:
    """Step 2 of :func:`store_tile_staged`: this thread's accumulator pairs into ``smem``."""
    from mlir.dialects import vector

    from blockscale.compiler import ir as bir

    for mt, row in enumerate(acc):
        for nt, vals in enumerate(row):
            for p in (0, 2):  # elements (p, p + 1): columns 2t, 2t + 1 of one row
                r, col = wc.c_row(mt, p), wc.c_col(nt, p)
                m, n = bir.add(m0, r), bir.add(n0, col)
                if no_loads:  # no loads: compute the padding too (never copied)
                    pair = [value(vals[p + j], m, bir.add(n, j)) for j in range(2)]
                else:  # the epilogue may load inputs at (m, n): only inside C
                    br = bir.if_(bir.logical_and(bir.ult(m, m_count), bir.ult(n, n_count)),
                                 [out_t, out_t])
                    with br.then():
                        br.yield_(*(value(vals[p + j], m, bir.add(n, j)) for j in range(2)))
                    with br.else_():
                        br.yield_(bir.const(0.0, out_t), bir.const(0.0, out_t))
                    pair = list(br.results)
                word = vector.bitcast(pair_i8, vector.from_elements(bir.vec(2, out_t), pair))
                off = bir.add(bir.mul(r, row_pitch), bir.mul(col, esize))
                bir.vector_store(word, smem, bir.add(off, base) if base else off,
                                 alignment=2 * esize)


def _stage_hoisted(hoist: Any, acc: list, wc: Any, smem: Any, m0: Any, n0: Any, m_count: Any,
                   n_count: Any, scale: Callable[[Any, Any, Any], Any], out_t: Any,
                   pair_i8: Any, esize: int, row_pitch: int, buffers: dict, base: int) -> None:
    """Step 2 with a :func:`hoisted` epilogue (:func:`tiles`); no guard at all when its
    ``apply`` loads nothing (the padding is computed, never copied)."""
    from mlir.dialects import arith, vector

    from blockscale.compiler import ir as bir
    from blockscale.ops.matmul_epilogue import EpilogueContext

    def value(h: Any, v: Any, m: Any, n: Any, rs: Any, cs: Any) -> Any:
        v = h.apply(scale(v, m, n), rs, cs, EpilogueContext(m, n, n_count, out_t, buffers))
        if v.type != out_t:
            if v.type != bir.f32():
                raise TypeError(f"epilogue must return an f32 or {out_t} value, got {v.type}")
            v = arith.truncf(out_t, v)
        return v

    def body(h: Any, mt: int, nt: int, vals: list, rows: list, row_states: list, cols: list,
             col_states: list) -> None:
        for half, p in enumerate((0, 2)):  # elements (p, p + 1): columns 2t, 2t + 1 of one row
            m = rows[half]
            args = [(h, vals[p + j], m, cols[j], row_states[half], col_states[j])
                    for j in (0, 1)]
            if not h.loads_in_apply:
                pair = [value(*a) for a in args]
            else:
                br = bir.if_(bir.logical_and(bir.ult(m, m_count), bir.ult(cols[0], n_count)),
                             [out_t, out_t])
                with br.then():
                    br.yield_(*(value(*a) for a in args))
                with br.else_():
                    br.yield_(bir.const(0.0, out_t), bir.const(0.0, out_t))
                pair = list(br.results)
            word = vector.bitcast(pair_i8, vector.from_elements(bir.vec(2, out_t), pair))
            off = bir.add(bir.mul(wc.c_row(mt, p), row_pitch), bir.mul(wc.c_col(nt, 0), esize))
            bir.vector_store(word, smem, bir.add(off, base) if base else off,
                             alignment=2 * esize)

    tiles(hoist, acc, wc, m0, n0, m_count, n_count, buffers, body)
