"""Compilation errors with everything needed to reproduce them."""

from __future__ import annotations

import os
import shlex
import sys
import tempfile
from collections.abc import Sequence
from typing import Any


class ToolNotFoundError(RuntimeError):
    """A required external tool (ptxas, llc, ld.lld, ...) was not found."""


class CompilationError(RuntimeError):
    """A kernel failed to compile.

    Attributes:
        stage: the stage that failed ("lower", "ptx", "cubin", "amdgcn", "hsaco", ...).
        diagnostics: MLIR diagnostics as strings ("<location>: <message>", notes indented).
        command: the external tool command line, when a tool failed.
        log: the tool's output, when a tool failed.
        repro_file: the pre-pipeline MLIR written to disk (None for tool failures).
        pipeline: the pass pipeline string that failed.
        repro_command: a shell command that reproduces the failure.
    """

    def __init__(self, message: str, *, stage: str, diagnostics: Sequence[str] = (),
                 command: Sequence[str] | None = None, log: str = "",
                 repro_file: str | None = None, pipeline: str | None = None) -> None:
        self.stage = stage
        self.diagnostics = list(diagnostics)
        self.command = list(command) if command else None
        self.log = log
        self.repro_file = repro_file
        self.pipeline = pipeline
        self.repro_command = None
        if repro_file is not None and pipeline is not None:
            self.repro_command = repro_command(repro_file, pipeline)
        elif self.command:
            self.repro_command = shlex.join(self.command)
        parts = [message]
        if self.diagnostics:
            parts.append("MLIR diagnostics:\n  " + "\n  ".join(self.diagnostics))
        if self.command:
            parts.append("command: " + shlex.join(self.command))
        if self.log:
            parts.append("log:\n" + self.log.rstrip())
        if self.repro_command:
            parts.append("reproduce with: " + self.repro_command)
        super().__init__("\n".join(parts))


def repro_command(mlir_file: str, pipeline: str) -> str:
    """The command that runs ``pipeline`` on ``mlir_file`` (no mlir-opt needed)."""
    return shlex.join([sys.executable, "-m", "blockscale.compiler.repro", mlir_file, pipeline])


def write_repro_file(mlir_text: str, kernel_name: str, directory: str | None = None) -> str:
    """Write the pre-pipeline MLIR to ``directory`` (default: a new temp dir); return the path."""
    if directory:
        os.makedirs(directory, exist_ok=True)
    else:
        directory = tempfile.mkdtemp(prefix="blockscale-repro-")
    path = os.path.join(directory, f"{kernel_name}.repro.mlir")
    with open(path, "w", encoding="utf-8") as f:
        f.write(mlir_text)
    return path


def format_diagnostic(diag: Any, indent: str = "") -> list[str]:
    """Lines of one ``ir.DiagnosticInfo`` (or ``ir.Diagnostic``) and its notes."""
    lines = [f"{indent}{diag.location}: {diag.message}"]
    for note in getattr(diag, "notes", ()):
        lines.extend(format_diagnostic(note, indent + "  note: "))
    return lines
