"""Building the CUDA backend's device code, without a GPU: the sources as NVRTC gets them, the
variants CI compiles (the ``opruntime_build_variants`` hook, called through pluggy as
``scripts/compile_cu.py`` calls it) and the bounded module cache.

``make compile-cu`` compiles every variant listed here with nvcc or NVRTC; these tests check the
Python side everywhere.
"""

from __future__ import annotations

import re
from importlib import resources

import pluggy
import pytest

from opruntime import hookspecs
from opruntime.lru import LRU

C_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def test_source_inlines_local_includes_and_injects_defines():
    from opruntime_cupy import compile

    text = compile.render("matmul_sgemm.cu", {"BM": 64, "VEC_A": True})
    assert text.startswith("#define BM 64\n#define VEC_A 1\n")
    assert "cp_async16" in text and '#include "common.cuh"' not in text  # common.cuh inlined
    with pytest.raises(ValueError, match="bad #define name"):
        compile.render("matmul_sgemm.cu", {"not a name": 1})


def test_build_variants_name_every_source_of_the_package():
    import opruntime_cupy

    folder = resources.files("opruntime_cupy")
    sources = {p.name for p in folder.iterdir() if p.name.endswith(".cu")}
    variants = opruntime_cupy.opruntime_build_variants()
    named = {path for path, _ in variants}
    assert named == sources, f"not listed: {sources - named}; missing files: {named - sources}"
    for path, defines in variants:
        assert folder.joinpath(path).is_file(), path
        assert defines and all(C_NAME.match(k) for k in defines), (path, defines)
    assert len({(p, tuple(sorted(d.items()))) for p, d in variants}) == len(variants), "a variant listed twice"


def test_build_variants_hook_through_pluggy():
    """The hook is marked and matches its spec: pluggy calls it, as scripts/compile_cu.py does."""
    import opruntime_cupy

    assert hookspecs.contract_errors(opruntime_cupy) == []
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    pm.register(opruntime_cupy, name="cupy")
    pm.check_pending()
    (variants,) = pm.hook.opruntime_build_variants()
    assert variants == opruntime_cupy.opruntime_build_variants()


def test_module_cache_is_a_bounded_lru_and_devices_are_not_names():
    from opruntime_cupy import compile

    assert isinstance(compile._modules, LRU)
    with pytest.raises(TypeError, match="provider"):
        compile.device_id("cuda:0")
    assert compile.device_id(3) == 3

    class Provider:
        index = 2

    assert compile.device_id(Provider()) == 2
