"""The cupy backend (being built: it reports itself unavailable until its devices exist)."""

from opruntime import hookimpl
from opruntime.errors import BackendUnavailable


@hookimpl
def opruntime_devices() -> list:
    raise BackendUnavailable("the cupy backend is not built yet", kinds=["cuda"])
