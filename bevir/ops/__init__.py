"""The op registry. Importing this package registers every op definition."""
from ..ir.opdef import (Attr, Bool, Ctx, Float, Floats, Int, Ints, OpDef, Str,  # noqa: F401
                        Tensor, all_ops, get_op)
from . import attention, elementwise, linalg, nn, qlinear, reduce, shape  # noqa: F401  (registers the ops)
from . import fixed_point, fixed_products, fixed_norms, fixed_attention  # noqa: F401  (the target fixed-point ops)
from . import fixed_pool, fixed_tables  # noqa: F401
from . import fused  # noqa: F401  (the fused ops of the fuse pass)
from . import memory  # noqa: F401  (dma_copy, inserted by plan-memory)
from . import multicore  # noqa: F401  (the ops of a graph partitioned across cores)


def interface_table() -> str:
    """One line per registered op: its name and the interfaces it implements."""
    ops = all_ops()
    width = max(map(len, ops))
    return "\n".join(f"{name:<{width}}  {' '.join(op.interfaces())}" for name, op in ops.items())
