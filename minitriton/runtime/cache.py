"""The on-disk kernel cache: compiled kernels keyed by a sha256 of everything that determines them.

Layout: `$MINITRITON_CACHE_DIR/<key[:2]>/<key>/` holding `kernel.ptx`, `kernel.cubin` (when ptxas ran) and
`meta.json` (the CompiledKernel metadata plus the sha256 of the PTX and cubin files). The default root is
`~/.cache/minitriton` (under `$XDG_CACHE_HOME` when that is set).

Writes are atomic: an entry is written into a fresh temporary folder beside it and moved into place with one
os.replace, so a reader sees a whole entry or none. A reader checks the checksums; an entry that is partial,
unreadable or does not match (a crash, a disk error, a hand edit) is never trusted: it is removed and rebuilt.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import sys
import uuid
from pathlib import Path
from typing import Any, Iterable

FORMAT = 1  # bump when the entry layout changes


def cache_dir() -> Path:
    """The cache root, read from the environment on each call (tests point it at a temporary folder)."""
    configured = os.environ.get("MINITRITON_CACHE_DIR")
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "minitriton"


def digest(parts: Iterable[str]) -> str:
    """sha256 over the parts (each length-prefixed, so no two different lists hash alike)."""
    hasher = hashlib.sha256()
    for part in parts:
        data = part.encode()
        hasher.update(len(data).to_bytes(8, "little"))
        hasher.update(data)
    return hasher.hexdigest()


@functools.lru_cache(maxsize=None)
def compiler_version() -> str:
    """compiler.compiler_version(), memoized under the cache root by the sources' names, sizes and mtimes.

    Hashing the sources' contents costs milliseconds (it grows with the compiler); statting them costs a tenth of
    that. An edit changes a file's mtime, so a stale memo is never found; at worst a touched but unchanged file
    costs one rehash.
    """
    from minitriton import compiler

    stamp = hashlib.sha256()
    for _, path in compiler.compiler_sources():
        st = os.stat(path)
        stamp.update(f"{path}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    memo = cache_dir() / "versions" / stamp.hexdigest()[:32]
    try:
        version = memo.read_text().strip()
        if len(version) == 32:
            return version
    except OSError:
        pass
    version = compiler.compiler_version()
    try:
        memo.parent.mkdir(parents=True, exist_ok=True)
        tmp = memo.parent / f".tmp-{uuid.uuid4().hex}"
        tmp.write_text(version)
        os.replace(tmp, memo)
    except OSError:
        pass  # a read-only cache still works, just slower
    return version


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class DiskCache:
    """Compiled kernels on disk under `root` (see the module docstring for the layout and guarantees)."""

    def __init__(self, root: Path | str | None = None):
        self.root = Path(root) if root is not None else cache_dir()

    def entry_dir(self, key: str) -> Path:
        return self.root / key[:2] / key

    def load(self, key: str) -> Any:
        """The CompiledKernel stored under `key`, or None (missing, or corrupt: then the entry is removed)."""
        from minitriton.compiler import CompiledKernel

        entry = self.entry_dir(key)
        meta_path = entry / "meta.json"
        if not meta_path.exists():
            return None
        try:
            record = json.loads(meta_path.read_text())
            if record.get("format") != FORMAT or record.get("key") != key:
                raise ValueError("entry written for another key or format")
            ptx = (entry / "kernel.ptx").read_bytes()
            if _sha(ptx) != record["ptx_sha256"]:
                raise ValueError("PTX checksum mismatch")
            cubin = None
            if record["cubin_sha256"] is not None:
                cubin = (entry / "kernel.cubin").read_bytes()
                if _sha(cubin) != record["cubin_sha256"]:
                    raise ValueError("cubin checksum mismatch")
            meta = record["metadata"]
            return CompiledKernel(meta["name"], ptx.decode(), cubin, meta)
        except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
            sys.stderr.write(f"minitriton: cache entry {entry} is corrupt ({e}); rebuilding it\n")
            self._remove(entry)
            return None

    def store(self, key: str, compiled: Any) -> Path:
        """Write `compiled` under `key` atomically; returns the entry folder."""
        entry = self.entry_dir(key)
        entry.parent.mkdir(parents=True, exist_ok=True)
        tmp = entry.parent / f".tmp-{key[:16]}-{uuid.uuid4().hex}"
        tmp.mkdir()
        try:
            ptx = (compiled.ptx or "").encode()
            (tmp / "kernel.ptx").write_bytes(ptx)
            if compiled.cubin is not None:
                (tmp / "kernel.cubin").write_bytes(compiled.cubin)
            record = {
                "format": FORMAT, "key": key, "ptx_sha256": _sha(ptx),
                "cubin_sha256": _sha(compiled.cubin) if compiled.cubin is not None else None,
                "metadata": compiled.metadata,
            }
            (tmp / "meta.json").write_text(json.dumps(record, indent=1, sort_keys=True))
            self._install(tmp, entry)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
        return entry

    def _install(self, tmp: Path, entry: Path) -> None:
        try:
            os.replace(tmp, entry)
        except OSError:
            # The entry exists: another process stored the same kernel first (keep theirs), or it is corrupt.
            if self.load(entry.name) is None:
                self._remove(entry)
                try:
                    os.replace(tmp, entry)
                except OSError:
                    pass  # a third writer got there in between; its entry is as good as ours

    @staticmethod
    def _remove(entry: Path) -> None:
        """Move aside, then delete: readers never see a half-deleted entry under the real name."""
        trash = entry.parent / f".trash-{entry.name[:16]}-{uuid.uuid4().hex}"
        try:
            os.replace(entry, trash)
        except OSError:
            return
        shutil.rmtree(trash, ignore_errors=True)
