"""Settings and their sources, later ones overriding earlier ones:

1. built-in defaults (device: the best present, by each device's priority);
2. one file: the one named by ``OPRUNTIME_CONFIG``, else the nearest ``opruntime.toml`` or
   ``pyproject.toml`` with a ``[tool.opruntime]`` table, searching up from the working directory.
   Files are not merged: the nearest directory wins, and in one directory ``opruntime.toml``
   wins over ``pyproject.toml``'s table, which is then ignored: a warning (logger ``opruntime``,
   once per process) names both files;
3. the environment (:data:`ENV`);
4. :func:`configure` in code (process-wide);
5. ``with opr.device(...)`` / ``with opr.override(...)`` (this thread / task only);
6. the ``device=`` argument of one call.

Keys (file, ``configure`` and ``override`` alike; :data:`KEYS` is the source of truth)::

    device    = "cuda:0" | ["cuda:0", "cpu"]   # a priority list: the first present wins
    tune      = "off" | "heuristic" | "autotune"
    bucket    = "exact" | "pow2"                # tuning-cache keys; also per operator
    tune_budget = 2.0                          # seconds per new problem when autotuning
    tune_top_k  = 8                            # candidates timed per problem
    strict    = false                          # raise instead of announcing a fallback
    log_tuning = false                         # print each tuning decision (logger opruntime.tuning)
    plugins   = ["-opencl"]                    # "-name" blocks a plugin; plain names allow only those
    cache_dir = "~/.cache/opruntime"
    [ops.softmax]                              # per operator (under [tool.opruntime.ops.softmax]
    device = "opencl:0"                        #  in pyproject.toml)
    kernel = "opencl.softmax.workgroup_row"    # pin a kernel by name
"""

from __future__ import annotations

import contextvars
import difflib
import logging
import math
import os
import threading
import tomllib
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from .errors import ConfigError
from .lru import DEFAULT_CAPACITY, LRU, set_capacity

log = logging.getLogger("opruntime")
TUNE_MODES = ("off", "heuristic", "autotune")

#: key -> (what it is, the values allowed); the documentation and the validation both read it.
KEYS: dict[str, tuple[str, str]] = {
    "device": ("device priority list; the first present device wins", 'a name or a list of names, e.g. ["cuda:0", "cpu"]'),
    "tune": ("how kernels are chosen", " | ".join(TUNE_MODES)),
    "strict": ("raise instead of announcing a fallback", "true | false"),
    "log_tuning": ("print each tuning decision to stderr: the problem, the candidates timed, the winner, "
                   "the time spent (or set the logger 'opruntime.tuning' to INFO)", "true | false"),
    "plugins": ("plugins to block ('-name') or, with plain names, the only ones to load", 'a list of names, e.g. ["-opencl"]'),
    "cache_dir": ("where tuning results are kept", "a directory path"),
    "bucket": ("tuning-cache keys: exact shapes, or each dim rounded up to a power of two", "exact | pow2"),
    "tune_budget": ("seconds the autotuner may spend on one new problem", "a number > 0"),
    "tune_top_k": ("candidates timed per problem, the lowest estimates first (vendor kernels always)", "an int >= 1"),
    "cache_entries": ("entries each in-memory cache keeps (plans, prepared launches, compiled programs)",
                      "an int >= 1"),
    "ops": ("per-operator settings: a table per operator with 'device', 'kernel' and/or 'bucket'",
            "[ops.<op>] device = ..., kernel = ..., bucket = ..."),
}
OP_KEYS = ("device", "kernel", "bucket")
BUCKETS = ("exact", "pow2")

#: environment variable -> settings key.
ENV = {
    "OPRUNTIME_DEVICE": "device",
    "OPRUNTIME_TUNE": "tune",
    "OPRUNTIME_STRICT": "strict",
    "OPRUNTIME_LOG_TUNING": "log_tuning",
    "OPRUNTIME_PLUGINS": "plugins",
    "OPRUNTIME_CACHE_DIR": "cache_dir",
    "OPRUNTIME_BUCKET": "bucket",
    "OPRUNTIME_CACHE_ENTRIES": "cache_entries",
}


@dataclass(frozen=True)
class OpSettings:
    """Settings for one operator: a device priority list and/or a pinned kernel name."""

    device: tuple[str, ...] = ()
    kernel: str | None = None
    bucket: str | None = None


@dataclass(frozen=True, eq=False)
class Settings:
    """The effective settings of one context. Immutable; equal content gives the same object."""

    device: tuple[str, ...] = ()
    tune: str = "heuristic"
    strict: bool = False
    log_tuning: bool = False
    plugins: tuple[str, ...] = ()
    cache_dir: str | None = None
    bucket: str = "exact"
    tune_budget: float = 2.0
    tune_top_k: int = 8
    cache_entries: int = DEFAULT_CAPACITY
    ops: Mapping[str, OpSettings] = field(default_factory=dict)
    origin: Mapping[str, str] = field(default_factory=dict)  # key -> the source that set it

    def bucket_for(self, op: str) -> str:
        """The bucketing mode for ``op``'s tuning-cache keys."""
        op_s = self.ops.get(op)
        return (op_s.bucket if op_s and op_s.bucket else None) or self.bucket

    @property
    def blocked_plugins(self) -> tuple[str, ...]:
        return tuple(p[1:] for p in self.plugins if p.startswith("-"))

    @property
    def allowed_plugins(self) -> tuple[str, ...]:
        return tuple(p for p in self.plugins if not p.startswith("-"))

    def content(self) -> tuple:
        return tuple((f.name, _freeze(getattr(self, f.name))) for f in fields(self) if f.name != "origin")

    def __repr__(self) -> str:
        parts = [f"{k}={v!r} ({self.origin.get(k, 'default')})" for k, v in self.content() if v not in ((), None)]
        return "Settings(" + ", ".join(parts) + ")"


def _freeze(v: Any) -> Any:
    if isinstance(v, Mapping):
        return tuple(sorted((k, _freeze(x)) for k, x in v.items()))
    return v


# -- parsing and validation ---------------------------------------------------------------
def _names(value: Any, where: str, key: str) -> tuple[str, ...]:
    if isinstance(value, str) or hasattr(value, "provider"):  # a name, or an opr.Device
        items = [v.strip() for v in str(value).split(",")]
    elif isinstance(value, (list, tuple)) and all(isinstance(v, str) or hasattr(v, "provider") for v in value):
        items = [str(v).strip() for v in value]
    else:
        raise ConfigError(f"{where}: {key!r} must be {KEYS.get(key, ('', 'a list of names'))[1]}, got {value!r}")
    if not all(items):
        raise ConfigError(f"{where}: {key!r} has an empty name in {value!r}")
    return tuple(items)


def _bool(value: Any, where: str, key: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("1", "true", "yes", "on", "0", "false", "no", "off", ""):
        return value.strip().lower() in ("1", "true", "yes", "on")
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise ConfigError(f"{where}: {key!r} must be true or false (or 1/0), got {value!r}")


def _choice(value: Any, allowed: tuple[str, ...], where: str, key: str) -> str:
    if value not in allowed:
        raise ConfigError(f"{where}: {key!r} must be one of {', '.join(allowed)}, got {value!r}")
    return value


def _number(value: Any, kind: type, above: float, what: str, where: str, key: str) -> Any:
    """``value`` as ``kind`` (float or int) when it is one and greater than ``above``."""
    try:
        number = kind(value)
        ok = (not isinstance(value, bool) and number > above and math.isfinite(number)
              and (kind is float or str(number) == str(value).strip()))
    except (TypeError, ValueError, OverflowError):
        ok = False
    if not ok:
        raise ConfigError(f"{where}: {key!r} must be {what}, got {value!r}")
    return number


def parse(raw: Mapping[str, Any], where: str) -> dict[str, Any]:
    """Validate one source's raw mapping into settings fields. ``where`` names the source."""
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in KEYS:
            raise ConfigError(f"{where}: unknown key {key!r}; allowed keys: {', '.join(KEYS)}")
        if key == "device":
            out[key] = _names(value, where, key)
        elif key == "plugins":
            out[key] = _plugin_names(_names(value, where, key), where)
        elif key in ("tune", "bucket"):
            out[key] = _choice(value, TUNE_MODES if key == "tune" else BUCKETS, where, key)
        elif key in ("strict", "log_tuning"):
            out[key] = _bool(value, where, key)
        elif key == "cache_dir":
            if not isinstance(value, (str, os.PathLike)):
                raise ConfigError(f"{where}: 'cache_dir' must be a directory path, got {value!r}")
            out[key] = str(Path(value).expanduser())
        elif key == "tune_budget":
            out[key] = _number(value, float, 0.0, "a number of seconds > 0", where, key)
        elif key in ("tune_top_k", "cache_entries"):
            out[key] = _number(value, int, 0, "an int >= 1", where, key)
        elif key == "ops":
            out[key] = _parse_ops(value, where)
    return out


#: ``() -> names``: the plugin names the ``plugins`` setting may use (installed entry points and
#: plugins given to ``opr.register``), set by the registry (the layer above) when it is imported
PLUGIN_NAMES: Any = None


def _plugin_names(names: tuple[str, ...], where: str) -> tuple[str, ...]:
    """``names`` when each (less a leading ``-``) names a plugin; else ConfigError with the
    closest name: a typo would silently block nothing, or allow nothing."""
    known = sorted(PLUGIN_NAMES()) if PLUGIN_NAMES is not None else []
    for name in names:
        bare = name[1:] if name.startswith("-") else name
        if known and bare not in known:
            close = difflib.get_close_matches(bare, known, n=1)
            hint = f" Did you mean {name[:len(name) - len(bare)] + close[0]!r}?" if close else ""
            raise ConfigError(f"{where}: unknown plugin {bare!r} in 'plugins'.{hint} Plugins here: {', '.join(known)} "
                              f"(block one with '-name', or list the only ones to load)")
    return names


#: name -> Operator, filled by ``opruntime.ops`` as it loads the operators: the names 'ops' tables
#: may use, and how the Tensor's ``+ - * / @`` reach their operators (tensor.py sits below ops)
OPERATORS: dict[str, Any] = {}


def _parse_ops(value: Any, where: str) -> dict[str, OpSettings]:
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where}: 'ops' must be a table of operators, got {value!r}")
    ops = {}
    for op, table in value.items():
        if OPERATORS and op not in OPERATORS:
            close = difflib.get_close_matches(str(op), sorted(OPERATORS), n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"{where}: unknown operator {op!r} under 'ops'.{hint} Operators: {', '.join(sorted(OPERATORS))}")
        if isinstance(table, OpSettings):
            ops[op] = table
            continue
        if not isinstance(table, Mapping):
            raise ConfigError(f"{where}: 'ops.{op}' must be a table with {' and/or '.join(OP_KEYS)}, got {table!r}")
        bad = set(table) - set(OP_KEYS)
        if bad:
            raise ConfigError(f"{where}: unknown key(s) {sorted(bad)} in 'ops.{op}'; allowed: {', '.join(OP_KEYS)}")
        kernel = table.get("kernel")
        if kernel is not None and not isinstance(kernel, str):
            raise ConfigError(f"{where}: 'ops.{op}.kernel' must be a kernel name, got {kernel!r}")
        device = _names(table["device"], where, f"ops.{op}.device") if "device" in table else ()
        bucket = table.get("bucket")
        if bucket is not None:
            bucket = _choice(bucket, BUCKETS, where, f"ops.{op}.bucket")
        ops[op] = OpSettings(device, kernel, bucket)
    return ops


def find_file(start: Path | None = None) -> tuple[Path, dict[str, Any]] | None:
    """The config file in force and its raw ``opruntime`` table, or None. An ``opruntime.toml``
    beside a ``pyproject.toml`` with a ``[tool.opruntime]`` table wins; that is announced once."""
    named = os.environ.get("OPRUNTIME_CONFIG")
    if named:
        path = Path(named).expanduser()
        if not path.is_file():
            raise ConfigError(f"OPRUNTIME_CONFIG names {str(path)!r}, which is not a file")
        return path, _read(path)
    here = (start or Path.cwd()).resolve()
    for d in (here, *here.parents):
        own = d / "opruntime.toml"
        pyproject = d / "pyproject.toml"
        if own.is_file():
            if pyproject.is_file() and _read(pyproject) and (own, pyproject) not in _shadowed:
                _shadowed.add((own, pyproject))
                log.warning("opruntime: %s is in force; the [tool.opruntime] table of %s beside it is ignored "
                            "(opruntime.toml wins over pyproject.toml in one directory; keep the settings in one "
                            "of them)", own, pyproject)
            return own, _read(own)
        if pyproject.is_file():
            table = _read(pyproject)
            if table:
                return pyproject, table
    return None


_shadowed: set[tuple[Path, Path]] = set()  # (opruntime.toml, pyproject.toml) pairs announced


def _read(path: Path) -> dict[str, Any]:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read configuration: {exc}") from exc
    if path.name == "pyproject.toml":
        return data.get("tool", {}).get("opruntime", {})
    return data.get("tool", {}).get("opruntime", data)


# -- the layers -----------------------------------------------------------------------------
_lock = threading.RLock()
_code: dict[str, Any] = {}  # layer 4: configure()
_base: Settings | None = None  # defaults + file + env + code, merged
_layers: list[tuple[str, dict[str, Any]]] = []  # the layers _base was merged from
_interned: dict[tuple, Settings] = {}
_override: contextvars.ContextVar[tuple[tuple[str, Any], ...]] = contextvars.ContextVar("opruntime_override", default=())
_effective = LRU("settings in force per override", 256)


def _merge(layers: list[tuple[str, dict[str, Any]]]) -> Settings:
    values: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for source, layer in layers:
        for key, v in layer.items():
            if key == "ops":
                merged = dict(values.get("ops", {}))
                for op, s in v.items():
                    old = merged.get(op, OpSettings())
                    merged[op] = OpSettings(s.device or old.device, s.kernel or old.kernel, s.bucket or old.bucket)
                    origin[f"ops.{op}"] = source
                v = merged
            values[key] = v
            origin[key] = source
    s = Settings(**values, origin=origin)
    return _interned.setdefault(s.content(), s)


def _base_layers() -> list[tuple[str, dict[str, Any]]]:
    layers: list[tuple[str, dict[str, Any]]] = []
    found = find_file()
    if found:
        layers.append((str(found[0]), parse(found[1], str(found[0]))))
    env = {key: os.environ[var] for var, key in ENV.items() if os.environ.get(var, "").strip()}
    for var, key in ENV.items():
        if key in env:
            layers.append((f"${var}", parse({key: env[key]}, f"environment variable {var}")))
    if _code:
        layers.append(("configure()", dict(_code)))
    return layers


def settings() -> Settings:
    """The settings in force in this context (cheap: cached until something changes)."""
    global _base
    base = _base
    if base is None:
        with _lock:
            _layers[:] = _base_layers()
            base = _base = _merge(_layers)
            set_capacity(base.cache_entries)
    over = _override.get()
    if not over:
        return base
    key = (id(base), over)
    eff = _effective.get(key)
    if eff is None:
        context = {k: dict(v) if k == "ops" else v for k, v in over}
        eff = _effective[key] = _merge([*_layers, ("context", context)])
    return eff


#: ``listener(old, new)`` is called after the settings were re-read (the registry rebuilds itself
#: when the plugin list changed); the layers above register here
listeners: list[Any] = []


def reload() -> None:
    """Re-read the file and the environment (after changing them in a running process)."""
    global _base
    with _lock:
        old = _base
        _base = None
        _effective.clear()
    try:
        new = settings()
    except ConfigError:
        return  # raised again, with its message, by the next settings()
    for listener in listeners:
        listener(old, new)


def configure(**values: Any) -> None:
    """Set process-wide settings in code (layer 4); ``None`` removes a key set earlier.

    Example: ``opr.configure(device=["cuda:0", "cpu"], strict=True, ops={"softmax": {"kernel": "cupy.softmax.warp_row"}})``
    """
    removed = {k for k, v in values.items() if v is None}
    parsed = parse({k: v for k, v in values.items() if v is not None}, "configure()")
    with _lock:
        for k in removed:
            _code.pop(k, None)
        _code.update(parsed)
    reload()


@contextmanager
def override(**values: Any) -> Iterator[Settings]:
    """Settings for this block in this thread / task only (layer 5)."""
    parsed = parse(values, "override()")
    token = _override.set(_override.get() + tuple((k, _freeze_value(v)) for k, v in parsed.items()))
    try:
        yield settings()
    finally:
        _override.reset(token)


def _freeze_value(v: Any) -> Any:
    return tuple(sorted(v.items())) if isinstance(v, dict) else v


def device(name: str | list[str] | tuple[str, ...]) -> AbstractContextManager[Any]:
    """``with opr.device("cuda:0"):`` places host data of this block on that device.

    A list is a priority list (the first present device wins); a mesh (``opr.mesh``) places host
    data on its members.
    """
    if getattr(name, "spans_devices", False):
        return name.placing()  # type: ignore[union-attr]
    return override(device=name)


#: the mesh of ``with opr.device(mesh)`` in this thread / task (``opruntime.mesh``), else None
placement: contextvars.ContextVar[Any] = contextvars.ContextVar("opruntime_placement", default=None)
