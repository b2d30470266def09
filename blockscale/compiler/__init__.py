"""The compiler: MLIR kernel building, pass pipelines, toolchain, cache (needs MLIR).

Submodules import MLIR lazily or at their own import; ``import blockscale.compiler`` itself
imports nothing heavy. See docs/internals.md for the interfaces.
"""
