"""Code generation through TVM: each op lowers itself to a tensor-expression compute
(``OpDef.tvm_lowering``, built with :class:`~bevir.codegen.lower.Lowering`); kernels are
deduplicated by signature and built for the llvm target (the host build) or the C target
(sources built by the system C compiler, libc only). :class:`Program` runs a graph on its
kernels and checks each against the golden model. docs/codegen.md has the details."""
from ..target.schedule import lowerable  # noqa: F401
from .lower import KernelDef, Lowering, kernel_def, signature  # noqa: F401
from .program import CheckReport, Mismatch, Program  # noqa: F401

__all__ = ["CheckReport", "KernelDef", "Lowering", "Mismatch", "Program", "kernel_def",
           "lowerable", "signature"]
