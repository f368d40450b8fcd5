"""runtime/c_launch.py: the C extension that calls cuLaunchKernel, built here with the system compiler and bound to a
ctypes stand-in for cuLaunchKernel that records what it receives (no GPU needed)."""
from __future__ import annotations

import ctypes

import pytest

from minitriton.runtime import c_launch

LAUNCH_TYPE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, *([ctypes.c_uint] * 7), ctypes.c_void_p,
                               ctypes.c_void_p, ctypes.c_void_p)


@pytest.fixture(scope="module")
def fast(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    mp = pytest.MonkeyPatch()
    mp.setenv("MINITRITON_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
    module = c_launch.load()
    mp.undo()
    if module is None:
        pytest.skip(f"the C launcher cannot be built here: {c_launch.why_unavailable()}")
    return module


def test_launch_passes_every_argument_through(fast) -> None:  # type: ignore[no-untyped-def]
    seen: list[tuple] = []

    def fake(fn, gx, gy, gz, bx, by, bz, shared, stream, params, extra):  # type: ignore[no-untyped-def]
        seen.append((fn, gx, gy, gz, bx, by, bz, shared, stream, params, extra))
        return 0 if gx < 1000 else 701  # 701: CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES

    callback = LAUNCH_TYPE(fake)
    fast.bind(ctypes.cast(callback, ctypes.c_void_p).value)
    handle, stream, params = 0x7F00DEADBEEF, 0x5555AAAA0000, 0x7FFF12345678
    assert fast.launch(handle, 7, 2, 1, 256, 1, 1, 4096, stream, params, 0) == (0,)
    assert seen[-1] == (handle, 7, 2, 1, 256, 1, 1, 4096, stream, params, None)
    assert fast.launch(handle, 1000, 1, 1, 32, 1, 1, 0, 0, params, None) == (701,)  # errors come back as ints
    assert seen[-1][8] is None  # stream 0 (the legacy default stream) is a null pointer


class LaunchAttribute(ctypes.Structure):  # cuda.h's CUlaunchAttribute
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_int), ("value", ctypes.c_int), ("rest", ctypes.c_char * 60)]


class LaunchConfig(ctypes.Structure):  # cuda.h's CUlaunchConfig
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3), ("shared", ctypes.c_uint),
                ("stream", ctypes.c_void_p), ("attrs", ctypes.POINTER(LaunchAttribute)), ("num_attrs", ctypes.c_uint)]


LAUNCH_EX_TYPE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(LaunchConfig), ctypes.c_void_p, ctypes.c_void_p,
                                  ctypes.c_void_p)


def test_programmatic_flag_launches_through_cuLaunchKernelEx(fast) -> None:  # type: ignore[no-untyped-def]
    """extra = 1: cuLaunchKernelEx with CUlaunchConfig as cuda.h lays it out (56 bytes; the attribute 72) and one
    attribute, CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION (6) = 1."""
    assert ctypes.sizeof(LaunchConfig) == 56 and ctypes.sizeof(LaunchAttribute) == 72
    seen: list[tuple] = []

    def fake_ex(config, fn, params, extra):  # type: ignore[no-untyped-def]
        c = config.contents
        attrs = [(c.attrs[i].id, c.attrs[i].value) for i in range(c.num_attrs)]
        seen.append((tuple(c.grid), tuple(c.block), c.shared, c.stream, attrs, fn, params, extra))
        return 0

    callback = LAUNCH_EX_TYPE(fake_ex)
    handle, stream, params = 0x7F00DEADBEEF, 0x5555AAAA0000, 0x7FFF12345678
    fast.bind_ex(ctypes.cast(callback, ctypes.c_void_p).value)
    assert fast.launch(handle, 7, 2, 3, 256, 1, 1, 4096, stream, params, c_launch.PROGRAMMATIC) == (0,)
    assert seen[-1] == ((7, 2, 3), (256, 1, 1), 4096, stream, [(6, 1)], handle, params, None)


def test_bad_calls_raise_instead_of_launching(fast) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(TypeError, match="11 arguments"):
        fast.launch(1, 1, 1, 1)
    with pytest.raises(ValueError, match="extra"):
        fast.launch(1, 1, 1, 1, 32, 1, 1, 0, 0, 0, 5)
    with pytest.raises(TypeError):
        fast.launch("fn", 1, 1, 1, 32, 1, 1, 0, 0, 0, 0)


def test_disabled_by_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(c_launch, "_loaded", None)
    monkeypatch.setenv("MINITRITON_C_LAUNCH", "0")
    assert c_launch.load() is None and c_launch.why_unavailable() == "MINITRITON_C_LAUNCH=0"
