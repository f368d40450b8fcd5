"""A small C extension that calls cuLaunchKernel (or cuLaunchKernelEx): the launch path's driver call without
cuda-bindings' wrapper.

Measured on the H200 (2026-11-29, tools/launch_floor.py, same function, stream and parameter array): cuLaunchKernel
costs 3.92 us per launch from a C loop and 6.02 us through cuda-bindings (which converts every argument through
Python-level handle types), 7.32 us through ctypes. This module is the thinnest Python entry to that C call.

    launch(fn, gx, gy, gz, bx, by, bz, shared, stream, params, extra) -> (CUresult,)

takes what cuda-bindings' cuLaunchKernel takes, as plain ints (function handle, raw stream handle, address of the
`void *kernelParams[]` array), and returns the same one-tuple. `extra` is instead a flag: 0 or None launches with
cuLaunchKernel, PROGRAMMATIC (1) with cuLaunchKernelEx and the attribute
CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 1 (the kernel may start while the previous one in the
stream runs; it waits with griddepcontrol.wait). It holds the GIL through the driver call (a launch only enqueues),
so a parameter buffer cannot be repacked by another thread meanwhile. The addresses of cuLaunchKernel and
cuLaunchKernelEx are handed in once by `bind(address)` and `bind_ex(address)` (the driver passes libcuda's; the
tests pass ctypes callbacks), so the module itself links against nothing but Python.

Built on first use with the system C compiler (`cc`, or $CC) against this Python's headers, like Triton's launcher,
and kept in `$MINITRITON_CACHE_DIR/c_launch/<hash of the source, Python version and platform>/`; written
atomically. Without a compiler or the headers, or with MINITRITON_C_LAUNCH=0, `load()` answers None and the
driver keeps cuda-bindings' cuLaunchKernel (`why_unavailable()` says why).
"""
from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
from pathlib import Path
from types import ModuleType

from .cache import cache_dir

PROGRAMMATIC = 1  # launch's `extra` flag: cuLaunchKernelEx with programmatic stream serialization

MODULE_NAME = "_minitriton_launch"

SOURCE = r"""
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

typedef int (*launch_fn)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *,
                         void **, void **);
/* cuda.h's CUlaunchAttribute (id, 4 bytes of padding, a 64-byte value union) and CUlaunchConfig */
typedef struct { int id; int pad; union { char raw[64]; int value; } v; } launch_attribute;
typedef struct {
    unsigned grid[3], block[3], shared;
    void *stream;
    launch_attribute *attrs;
    unsigned num_attrs;
} launch_config;
typedef int (*launch_ex_fn)(const launch_config *, void *, void **, void **);
#define PROGRAMMATIC_STREAM_SERIALIZATION 6  /* CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION */
static launch_fn cu_launch = NULL;
static launch_ex_fn cu_launch_ex = NULL;
static PyObject *success = NULL;  /* the (0,) every successful launch returns */

static PyObject *bind(PyObject *self, PyObject *address) {
    void *p = PyLong_AsVoidPtr(address);
    if (p == NULL && PyErr_Occurred()) return NULL;
    cu_launch = (launch_fn)p;
    Py_RETURN_NONE;
}

static PyObject *bind_ex(PyObject *self, PyObject *address) {
    void *p = PyLong_AsVoidPtr(address);
    if (p == NULL && PyErr_Occurred()) return NULL;
    cu_launch_ex = (launch_ex_fn)p;
    Py_RETURN_NONE;
}

static PyObject *launch(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 11) {
        PyErr_Format(PyExc_TypeError, "launch takes 11 arguments (%zd given)", nargs);
        return NULL;
    }
    if (cu_launch == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "launch: bind(address of cuLaunchKernel) was not called");
        return NULL;
    }
    long flags = args[10] == Py_None ? 0 : PyLong_AsLong(args[10]);
    if (flags == -1 && PyErr_Occurred()) return NULL;
    if (flags != 0 && flags != 1) {
        PyErr_SetString(PyExc_ValueError, "launch: `extra` is a flag here: 0 (cuLaunchKernel) or 1 (programmatic)");
        return NULL;
    }
    if (flags == 1 && cu_launch_ex == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "launch: bind_ex(address of cuLaunchKernelEx) was not called");
        return NULL;
    }
    void *fn = PyLong_AsVoidPtr(args[0]);
    unsigned dims[7];
    for (int i = 0; i < 7; ++i) dims[i] = (unsigned)PyLong_AsUnsignedLong(args[1 + i]);
    void *stream = PyLong_AsVoidPtr(args[8]);
    void **params = (void **)PyLong_AsVoidPtr(args[9]);
    if (PyErr_Occurred()) return NULL;
    int err;
    if (flags == 0) {
        err = cu_launch(fn, dims[0], dims[1], dims[2], dims[3], dims[4], dims[5], dims[6], stream, params, NULL);
    } else {
        launch_attribute attr;
        memset(&attr, 0, sizeof attr);
        attr.id = PROGRAMMATIC_STREAM_SERIALIZATION;
        attr.v.value = 1;
        launch_config config = {{dims[0], dims[1], dims[2]}, {dims[3], dims[4], dims[5]}, dims[6], stream, &attr, 1};
        err = cu_launch_ex(&config, fn, params, NULL);
    }
    if (err == 0) {
        Py_INCREF(success);
        return success;
    }
    return Py_BuildValue("(i)", err);
}

static PyMethodDef methods[] = {
    {"bind", (PyCFunction)bind, METH_O, "bind(address): the cuLaunchKernel to call"},
    {"bind_ex", (PyCFunction)bind_ex, METH_O, "bind_ex(address): the cuLaunchKernelEx to call for flag 1"},
    {"launch", (PyCFunction)(void (*)(void))launch, METH_FASTCALL,
     "launch(fn, gx, gy, gz, bx, by, bz, shared, stream, params, extra) -> (CUresult,)"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_minitriton_launch", NULL, -1, methods};

PyMODINIT_FUNC PyInit__minitriton_launch(void) {
    success = Py_BuildValue("(i)", 0);
    if (success == NULL) return NULL;
    return PyModule_Create(&module);
}
"""

_lock = threading.Lock()
_loaded: ModuleType | None = None
_why: str | None = None


def why_unavailable() -> str | None:
    """Why `load()` answered None (None when it did not, or was not called)."""
    return _why


def load() -> ModuleType | None:
    """The compiled extension (built and cached on first use), or None when it cannot be built here."""
    global _loaded, _why
    with _lock:
        if _loaded is not None:
            return _loaded
        if os.environ.get("MINITRITON_C_LAUNCH", "1").strip().lower() in ("0", "false", "no", "off"):
            _why = "MINITRITON_C_LAUNCH=0"
            return None
        try:
            _loaded = _import(_build())
            _why = None
        except (OSError, subprocess.SubprocessError, ImportError, RuntimeError) as e:
            _why = f"{type(e).__name__}: {e}"
        return _loaded


def _library_path() -> Path:
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    key = hashlib.sha256("\0".join([SOURCE, sys.version, sys.platform, suffix]).encode()).hexdigest()[:32]
    return cache_dir() / "c_launch" / key / f"{MODULE_NAME}{suffix}"


def _build() -> Path:
    target = _library_path()
    if target.exists():
        return target
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        raise RuntimeError("no C compiler (cc, gcc or clang) on PATH")
    include = sysconfig.get_paths()["include"]
    if not (Path(include) / "Python.h").exists():
        raise RuntimeError(f"no Python.h in {include} (install the Python development headers)")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        src, out = Path(tmp) / "launch.c", Path(tmp) / target.name
        src.write_text(SOURCE)
        result = subprocess.run([cc, "-O2", "-shared", "-fPIC", f"-I{include}", str(src), "-o", str(out)],
                                capture_output=True, text=True, timeout=120)
        if result.returncode != 0:
            raise RuntimeError(f"{cc} failed: {result.stderr.strip()[:500]}")
        os.replace(out, target)  # atomic: a concurrent builder writes the same bytes
    return target


def _import(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(MODULE_NAME, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
