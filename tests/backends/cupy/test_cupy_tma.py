"""tma.TileMaps without a GPU: the address probe and both ways of making a call's tensor map,
with the driver's encoder replaced by fakes that store the address plainly or not."""

import numpy as np
import pytest
from opruntime_cupy import tma


def _fake_encoder(store):
    """A stand-in for cuTensorMapEncodeTiled: words from the shape and box, the address through
    ``store`` at word 2; counts its calls."""
    calls = []

    def encode(ptr, dtype, cols, rows, stride, box):
        calls.append(ptr)
        words = np.arange(16, dtype=np.uint64) * np.uint64(cols + 7 * rows + stride + box[1])
        words[2] = np.uint64(store(ptr))
        return words.view(tma.MAP)[0]

    return encode, calls


def test_plain_address_word_is_patched(monkeypatch):
    encode, calls = _fake_encoder(lambda p: p)
    monkeypatch.setattr(tma, "tile_map", encode)
    maps = tma.TileMaps("float16", 4096, 1024, 8192, (64, 128))
    assert maps.patched and maps.slot == 2 and len(calls) == 3  # the probe: three encodings
    m = maps(0x7F00_0000_1000)
    ref = encode(0x7F00_0000_1000, "float16", 4096, 1024, 8192, (64, 128))
    assert bytes(m) == bytes(ref)  # the patched map is the one the driver would encode
    assert len(calls) == 4  # ... and making it called nothing
    assert "patched at word 2" in repr(maps)


def test_address_not_stored_plainly_is_encoded_per_buffer(monkeypatch):
    encode, calls = _fake_encoder(lambda p: p >> 4)  # not the address itself: no patching
    monkeypatch.setattr(tma, "tile_map", encode)
    maps = tma.TileMaps("bfloat16", 64, 64, 128, (64, 64), size=2)
    assert not maps.patched
    probes = len(calls)
    a, b, c = 0x1000, 0x2000, 0x3000
    assert bytes(maps(a)) == bytes(encode(a, "bfloat16", 64, 64, 128, (64, 64)))
    calls.clear()
    maps(a)
    assert calls == []  # kept
    maps(b), maps(c)  # the LRU holds two: a is dropped
    maps(a)
    assert calls == [b, c, a] and probes == 3
    assert "2 encoded" in repr(maps)


def test_probe_refused_by_the_driver_leaves_per_call_encoding(monkeypatch):
    def refuse(ptr, *args):
        raise RuntimeError("cuTensorMapEncodeTiled failed (CUresult 1)")

    monkeypatch.setattr(tma, "tile_map", refuse)
    maps = tma.TileMaps("float16", 64, 64, 128, (64, 64))
    assert not maps.patched
    with pytest.raises(RuntimeError, match="CUresult 1"):
        maps(0x1000)

