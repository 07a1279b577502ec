#!/usr/bin/env python3
"""Compile every CUDA source of the backends for sm_90 and sm_80 (and sm_90a for the files that
use Hopper-only instructions), without a GPU and without CuPy.

    python scripts/compile_cu.py            # every backends/**/*.cu and examples/**/*.cu
    python scripts/compile_cu.py -v         # also print each variant's registers / spills
    python scripts/compile_cu.py FILE.cu    # some files only

Which variants to compile comes from the plugins themselves: the runtime's registry loads every
plugin of the ``opruntime.backends`` entry-point group and calls its ``opruntime_build_variants()``
hook through pluggy (``opruntime_cupy`` lists every config its kernels register). Each listed
``(path, defines)`` is compiled with its ``-D`` defines; a relative path is relative to the
plugin's package folder. A file no plugin lists is compiled once with no
defines (its own ``#ifndef`` defaults), as are the examples' sources. Uses ``nvcc -cubin`` when
nvcc is on PATH, else NVRTC through ctypes (libnvrtc); with neither it says so and exits 0
(there is nothing to compile with). The hooks are called first either way, so a plugin that
fails to import or whose hook raises or names a missing ``.cu`` file fails the check.
Exits non-zero on any compile error; one summary line per file.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ARCHS = ("90", "80")


def variants_by_file(files: list[Path]) -> tuple[dict[Path, list[dict]], bool]:
    """Every file's variants from the plugins' ``opruntime_build_variants`` hooks, gathered by the
    runtime's own registry (``[{}]`` for a file none lists), and whether gathering them failed
    (each failure printed)."""
    sys.path[:0] = [str(ROOT), str(ROOT / "backends")]
    import warnings

    from opruntime.plugins import Registry

    with warnings.catch_warnings():  # a plugin that fails is reported below, as a failure
        warnings.simplefilter("ignore")
        reg = Registry()  # the backends of the entry-point group, as at run time
    failed = False
    for rec in reg.records.values():
        if rec.status == "failed":  # importing a backend never needs its device stack (the hookspecs' rule)
            print(f"FAIL plugin {rec.name}: {rec.reason}")
            failed = True
    out: dict[Path, list[dict]] = {f: [] for f in files}
    try:
        pairs = reg.build_variants()  # one plugin at a time, relative paths made absolute
    except Exception as exc:
        print(f"FAIL: opruntime_build_variants() raised {type(exc).__name__}: {exc}")
        return {f: [{}] for f in files}, True
    for given, defines in pairs:
        path = Path(given).resolve()
        if path.suffix == ".cu" and not path.is_file():
            print(f"FAIL: opruntime_build_variants() names {given}, which does not exist")
            failed = True
        elif path in out:
            out[path].append(dict(defines))
    return {f: (v or [{}]) for f, v in out.items()}, failed


def _flag(name: str, value: object) -> str:
    return f"-D{name}={int(value) if isinstance(value, bool) else value}"


def archs_of(file: Path) -> tuple[str, ...]:
    """sm_90 and sm_80 for every file; also sm_90a for a file marked ``opruntime-arch: sm_90a``
    (its wgmma code compiles only there: elsewhere it builds to a stub)."""
    return ARCHS + (("90a",) if "opruntime-arch: sm_90a" in file.read_text() else ())


def nvcc(file: Path, arch: str, defines: dict) -> tuple[bool, str]:
    target = f"-gencode=arch=compute_{arch},code=sm_{arch}" if arch.endswith("a") else f"-arch=sm_{arch}"
    with tempfile.TemporaryDirectory() as tmp:
        cmd = ["nvcc", target, "-cubin", "--std=c++17", "-Xptxas", "-v", "-I", str(file.parent),
               *[_flag(k, v) for k, v in defines.items()], "-o", os.path.join(tmp, "out.cubin"), str(file)]
        res = subprocess.run(cmd, capture_output=True, text=True)
    return res.returncode == 0, res.stdout + res.stderr


class Nvrtc:
    """NVRTC through ctypes: compile a source to a cubin and return the log."""

    def __init__(self) -> None:
        name = ctypes.util.find_library("nvrtc")
        candidates = [name] if name else []
        candidates += ["libnvrtc.so", "libnvrtc.so.13", "libnvrtc.so.12"]
        self.lib = None
        for c in candidates:
            try:
                self.lib = ctypes.CDLL(c)
                break
            except OSError:
                continue
        if self.lib is None:
            raise OSError("libnvrtc not found")

    def __call__(self, file: Path, arch: str, defines: dict) -> tuple[bool, str]:
        text = _inline(file)
        head = "".join(f"#define {k} {int(v) if isinstance(v, bool) else v}\n" for k, v in defines.items())
        prog = ctypes.c_void_p()
        src = (head + text).encode()
        self.lib.nvrtcCreateProgram(ctypes.byref(prog), src, file.name.encode(), 0, None, None)
        opts = [b"--std=c++17", f"-arch=sm_{arch}".encode()]
        arr = (ctypes.c_char_p * len(opts))(*opts)
        rc = self.lib.nvrtcCompileProgram(prog, len(opts), arr)
        size = ctypes.c_size_t()
        self.lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        self.lib.nvrtcGetProgramLog(prog, log)
        self.lib.nvrtcDestroyProgram(ctypes.byref(prog))
        return rc == 0, log.value.decode(errors="replace")


def _inline(file: Path, seen: set | None = None) -> str:
    seen = set() if seen is None else seen
    seen.add(file.name)

    def sub(m: re.Match) -> str:
        inc = file.parent / m.group(1)
        if not inc.is_file():
            return m.group(0)
        return "" if inc.name in seen else _inline(inc, seen)

    return re.sub(r'^\s*#\s*include\s+"([^"]+)"\s*$', sub, file.read_text(), flags=re.M)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="*", type=Path)
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    files = [f.resolve() for f in args.files] or sorted((ROOT / "backends").rglob("*.cu")) + sorted((ROOT / "examples").rglob("*.cu"))
    variants, failed = variants_by_file(files)
    if shutil.which("nvcc"):
        compiler, tool = nvcc, "nvcc"
    else:
        try:
            compiler, tool = Nvrtc(), "nvrtc"
        except OSError:
            count = sum(len(v) for v in variants.values())
            print(f"compile_cu: neither nvcc nor libnvrtc found; {len(files)} .cu file(s), {count} variant(s) "
                  f"not compiled")
            return 1 if failed else 0
    jobs = [(f, arch, d) for f in files for d in variants[f] for arch in archs_of(f)]
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        results = list(pool.map(lambda j: (j, compiler(*j)), jobs))
    for f in files:
        mine = [(j, r) for j, r in results if j[0] == f]
        bad = [(j, r) for j, r in mine if not r[0]]
        regs = [int(x) for _, (ok, log) in mine for x in re.findall(r"Used (\d+) registers", log)]
        spills = [int(x) for _, (ok, log) in mine for x in re.findall(r"(\d+) bytes spill stores", log)]
        facts = f"max {max(regs)} registers, max {max(spills)} B spilled" if regs and spills else ""
        rel = f.relative_to(ROOT) if f.is_relative_to(ROOT) else f
        status = "FAIL" if bad else "ok  "
        print(f"{status} {rel}: {len(variants[f])} variant(s) x sm_{'/sm_'.join(archs_of(f))} with {tool}"
              + (f"; {facts}" if facts else "") + (f"; {len(bad)} failed" if bad else ""))
        for (_, arch, d), (_, log) in bad[:3]:
            print(f"  sm_{arch} {' '.join(_flag(k, v) for k, v in d.items())}\n" + "\n".join(
                "    " + line for line in log.strip().splitlines()[:20]))
        if args.verbose:
            for (_, arch, d), (_, log) in mine:
                r = re.findall(r"Used (\d+) registers", log)
                s = re.findall(r"(\d+) bytes spill stores", log)
                print(f"    sm_{arch} {r} regs, {s} B spills: {' '.join(_flag(k, v) for k, v in d.items())}")
        failed |= bool(bad)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
