"""The exceptions and warnings opruntime raises.

Every error derives from :class:`OpRuntimeError`; most also derive from the builtin that a
NumPy user would expect (``ValueError`` for bad shapes or values, ``TypeError`` for dtypes), so
``except ValueError`` keeps working. Messages name the operator, the shapes / dtypes / devices
involved and what to do about it.
"""

from __future__ import annotations

from collections.abc import Iterable


class OpRuntimeError(Exception):
    """Base class of every error opruntime raises."""


class ShapeError(OpRuntimeError, ValueError):
    """Operand shapes that the operator cannot combine (rank, inner dims, broadcasting)."""


class AttributeValueError(OpRuntimeError, ValueError):
    """A bad operator attribute: stride, padding, dilation, groups, axis, ..."""


class IndexingError(OpRuntimeError, IndexError):
    """A Tensor index out of range, or of a kind Tensors do not take (advanced or boolean indexing,
    a slice with a step <= 0), as NumPy's ``IndexError``."""


class UnknownAttributeError(OpRuntimeError, TypeError):
    """A keyword the operator does not take (as Python's own TypeError for an unexpected keyword)."""


class DtypeError(OpRuntimeError, TypeError):
    """A dtype the operator or the device does not support."""


class InputTypeError(OpRuntimeError, TypeError):
    """An operand opruntime cannot take as it is: a masked array (its mask would be lost or
    ignored), an object array, an array type no device owns and NumPy cannot read."""


class DeviceError(OpRuntimeError):
    """Base class of device problems."""


class UnknownDeviceError(DeviceError, ValueError):
    """A device name that no backend knows (usually a typo)."""


class DeviceUnavailableError(DeviceError):
    """A known device kind that is not present on this machine (stack or hardware missing)."""


class DeviceMismatchError(DeviceError, ValueError):
    """Operands that live on different devices: opruntime never copies between them silently."""


class ConfigError(OpRuntimeError, ValueError):
    """A malformed configuration file, environment variable or ``configure()`` value."""


class PluginError(OpRuntimeError):
    """A backend plugin that failed to import, broke the hook contract or raised."""


class BackendUnavailable(OpRuntimeError):
    """Raised by a backend's ``opruntime_devices`` hook when its stack or hardware is missing.

    Args:
        reason: why, in words a user can act on ("pyopencl not installed").
        kinds: the device kinds this backend would provide ("opencl",).
    """

    def __init__(self, reason: str, kinds: Iterable[str] = ()) -> None:
        super().__init__(reason)
        self.reason = reason
        self.kinds = tuple(kinds)


class NoKernelError(OpRuntimeError):
    """No registered kernel supports the problem on the chosen device."""


class KernelError(OpRuntimeError):
    """A kernel failed to compile or to run (raised in strict mode, or when every candidate failed)."""


class KernelCompileError(KernelError):
    """A kernel's device source failed to build; the message carries the compiler log."""

    def __init__(self, kernel: str, device: str, log: str) -> None:
        super().__init__(f"kernel {kernel!r} failed to build for {device}:\n{log}")
        self.kernel, self.device, self.log = kernel, device, log


class CaptureError(OpRuntimeError):
    """A function given to :func:`opruntime.capture` that cannot be recorded as a device graph: it
    reads results on the host, mixes devices, or returns something other than Tensors."""


class OutOfMemoryError(OpRuntimeError, MemoryError):
    """The device could not allocate the memory a call needs (or the call's result is larger than
    the device's free memory: refused before any kernel runs)."""


class CacheError(OpRuntimeError):
    """The tuning cache cannot be used as asked: its directory is not writable or not a directory,
    or a file to import is not a valid export."""


class FallbackWarning(UserWarning):
    """Announces a fallback (a missing device, a failing kernel); raised instead in strict mode."""
