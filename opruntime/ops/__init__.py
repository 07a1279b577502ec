"""The operators: one module per family; each defines validation, shape inference and a
float64 reference. :data:`OPS` maps operator names to their :class:`~.base.Operator`."""

from .base import Operator, result_dtype
from .conv import CONV2D, conv2d
from .matmul import MATMUL, matmul
from .softmax import LOG_SOFTMAX, SOFTMAX, log_softmax, softmax

OPS: dict[str, Operator] = {op.name: op for op in (MATMUL, CONV2D, SOFTMAX, LOG_SOFTMAX)}

__all__ = ["OPS", "Operator", "conv2d", "log_softmax", "matmul", "result_dtype", "softmax"]
