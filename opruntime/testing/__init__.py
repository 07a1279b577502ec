"""The conformance suite a backend author runs against their plugin, and the helpers the
project's own tests share.

Run it with pytest (``docs/conformance.md``)::

    pytest -p opruntime.testing.plugin --pyargs opruntime.testing --opruntime-device=acme:0
    python -m opruntime.testing --device acme:0 [--plugin acme]     # the same, shorter

or call the checks from your own tests; each returns a list of :class:`Finding`::

    from opruntime.testing import check_hooks, check_kernel, check_memory, failures
    assert not failures(check_memory(opr.Device("acme:0")))

What it checks: the plugin loaded and its hookimpls match the hookspecs (``check_hooks``,
``check_lazy_import``); device memory round-trips every supported dtype and shape, size 0
included (``check_memory``); every kernel, with every config, solves generated problems
(odd sizes, size-1 dims, 1-D and broadcast operands, strided views, every conv attribute) within
the dtype's tolerance of the float64 reference, called directly with the Problem the frontend
builds (``check_kernel``) and through the frontend with the kernel pinned (``check_pinned``);
size-0 results come back right on the device (``check_frontend_edges``).
"""

from .findings import Finding, failures, summary
from .hooks import check_hooks, check_lazy_import, device_plugin, plugin_kernels
from .kernels import check_frontend_edges, check_kernel, check_pinned
from .memory import check_memory, supported_dtypes
from .numerics import TOLERANCE, compare, np_dtype, random_array, rel_err
from .problems import CASES, EMPTY, QUICK_CASES, Case, build

__all__ = [
    "CASES", "EMPTY", "QUICK_CASES", "TOLERANCE", "Case", "Finding", "build", "check_frontend_edges", "check_hooks", "check_kernel",
    "check_lazy_import", "check_memory", "check_pinned", "compare", "device_plugin", "failures", "np_dtype",
    "plugin_kernels", "random_array", "rel_err", "summary", "supported_dtypes",
]
