"""tma.TileMaps without a GPU: the address probe and both ways of making a call's tensor map,
with the driver's encoder replaced by fakes that store the address plainly or not."""

import numpy as np
import pytest
from opruntime_cupy import tma


def _fake_encoder(store, salt=0):
    """A stand-in for a map encoder of one geometry: words from ``salt``, the address through
    ``store`` at word 2; counts its calls."""
    calls = []

    def encode(ptr):
        calls.append(ptr)
        words = np.arange(16, dtype=np.uint64) * np.uint64(salt + 3)
        words[2] = np.uint64(store(ptr))
        return words.view(tma.MAP)[0]

    return encode, calls


def test_plain_address_word_is_patched():
    encode, calls = _fake_encoder(lambda p: p, salt=4096)
    maps = tma.TileMaps(encode, "a 1024x4096 tile map")
    assert maps.patched and maps.slot == 2 and len(calls) == 3  # the probe: three encodings
    m = maps(0x7F00_0000_1000)
    ref = encode(0x7F00_0000_1000)
    assert bytes(m) == bytes(ref)  # the patched map is the one the driver would encode
    assert len(calls) == 4  # ... and making it called nothing
    assert "patched at word 2" in repr(maps) and "1024x4096" in repr(maps)


def test_address_not_stored_plainly_is_encoded_per_buffer():
    encode, calls = _fake_encoder(lambda p: p >> 4)  # not the address itself: no patching
    maps = tma.TileMaps(encode, size=2)
    assert not maps.patched
    probes = len(calls)
    a, b, c = 0x1000, 0x2000, 0x3000
    assert bytes(maps(a)) == bytes(encode(a))
    calls.clear()
    maps(a)
    assert calls == []  # kept
    maps(b), maps(c)  # the LRU holds two: a is dropped
    maps(a)
    assert calls == [b, c, a] and probes == 3
    assert "2 encoded" in repr(maps)


def test_probe_refused_by_the_driver_leaves_per_call_encoding():
    def refuse(ptr):
        raise RuntimeError("cuTensorMapEncodeTiled failed (CUresult 1)")

    maps = tma.TileMaps(refuse)
    assert not maps.patched
    with pytest.raises(RuntimeError, match="CUresult 1"):
        maps(0x1000)


def test_tiles_and_im2col_pass_the_geometry_to_the_driver(monkeypatch):
    """The encoders' ctypes arguments: dims innermost first, byte strides of the outer dims, the
    box (tiled) or the corners, channels, pixels and steps (im2col)."""
    seen = {}

    def driver(name):
        def call(out, dtype, rank, ptr, dims, strides, *rest):
            seen[name] = (dtype, rank, ptr, list(dims[:rank]), list(strides[:rank - 1]), rest)
            return 0
        return call

    monkeypatch.setattr(tma, "_encoder", driver)
    maps = tma.tiles("bfloat16", (64, 9, 128), (128, 1152), (64, 1, 128))
    assert maps.patched is False  # the fake writes nothing: every map the same, no address word
    assert seen["cuTensorMapEncodeTiled"][:5] == (9, 3, 0x7F3A_5C40_1230, [64, 9, 128], [128, 1152])  # the last probe
    assert list(seen["cuTensorMapEncodeTiled"][5][0][:3]) == [64, 1, 128]
    tma.im2col_map(0x1000, "float16", (64, 56, 56, 32), (128, 7168, 401408), (-1, -1), (-1, -1), 64, 256,
                   (1, 1, 1, 1))
    dtype, rank, ptr, dims, strides, rest = seen["cuTensorMapEncodeIm2col"]
    assert (dtype, rank, ptr, dims, strides) == (6, 4, 0x1000, [64, 56, 56, 32], [128, 7168, 401408])
    lower, upper, channels, pixels, steps = rest[:5]
    assert list(lower[:2]) == [-1, -1] and list(upper[:2]) == [-1, -1] and (channels, pixels) == (64, 256)
    assert list(steps[:4]) == [1, 1, 1, 1]
