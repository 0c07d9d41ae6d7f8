"""This process's resident memory at its peak: over its whole life, and over a stretch of work
(a build's stage), so that a build can say which stage made its peak.

Linux keeps one high-water mark per process (VmHWM) and lets the process reset it to the
current size (`echo 5 > /proc/self/clear_refs`). A stretch is measured by resetting it at the
stretch's start; the peak before each reset is kept here, so `peak_rss_mb` stays the whole
life's. Elsewhere only the life's peak is known (getrusage), and stretches are not measured.
"""

from __future__ import annotations

import ctypes
import mmap
from pathlib import Path

import numpy as np

_STATUS, _CLEAR_REFS = Path("/proc/self/status"), Path("/proc/self/clear_refs")
_peak_before_resets_kb = 0


def _high_water_kb() -> int | None:
    """VmHWM: the peak since the process began or since the last reset, in kB."""
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def peak_rss_mb() -> float:
    """This process's peak resident memory. Linux's VmHWM is its own address space's: getrusage's
    maxrss also keeps the parent's size at fork across exec, so a build started by a large
    process (a benchmark, a test runner) would report that instead."""
    high = _high_water_kb()
    if high is not None:
        return max(high, _peak_before_resets_kb) / 1024
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def stretch_peak_mb() -> float | None:
    """The peak since the last `restart_stretch` (or the process's start); None off Linux."""
    high = _high_water_kb()
    return None if high is None else high / 1024


def restart_stretch() -> bool:
    """Start a new stretch: the high-water mark is reset to the current size, its value before
    kept for `peak_rss_mb`. False where the system does not allow it."""
    global _peak_before_resets_kb
    high = _high_water_kb()
    if high is None:
        return False
    try:
        _CLEAR_REFS.write_text("5")
    except OSError:
        return False
    _peak_before_resets_kb = max(_peak_before_resets_kb, high)
    return True


def give_back_freed_memory() -> None:
    """Return the heap's free pages to the system (glibc's malloc_trim). An onnxruntime session
    frees its prepacked weights into the heap, where glibc keeps them: on ViT-B/16 one closed
    session left up to 470 MB resident, which malloc_trim gave back (a hand run, 1,893 -> 1,423
    MB), so every later stage started that much higher. A no-op off glibc."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    libc.malloc_trim(0)


_PAGEMAP = Path("/proc/self/pagemap")
_MADV_DONTNEED = 4
# A page's pagemap entry: bit 63 present, bit 61 a file page (the page cache's own, not a copy
# the process wrote to) or shared memory.
_PRESENT_FILE_PAGE = np.uint64((1 << 63) | (1 << 61))


def page_out(spans: list[tuple[int, int]]) -> None:
    """Take the pages of these (address, length) spans that map a file unchanged (a checkpoint
    loaded by mmap, as transformers and safetensors load weights) out of this process's resident
    memory. They stay in the page cache, the system's to keep or drop, and the next touch maps
    them again with the file's contents. Pages the process wrote to, and memory with no file
    behind it, stay as they are: dropping those would lose their contents. A no-op off Linux.

    Not MADV_PAGEOUT, which takes any page out but drops file pages from the page cache too (the
    page-cache check of tests/test_build.py fails under it, run by hand), so that torch's next
    pass and the checkpoint write read them from disk.
    """
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        pagemap = _PAGEMAP.open("rb", buffering=0)
    except OSError:
        return
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    page = mmap.PAGESIZE
    with pagemap:
        for address, length in spans:
            # madvise takes whole pages; one only partly in the span may hold data in use elsewhere
            first, last = -(-address // page), (address + length) // page
            if last <= first:
                continue
            pagemap.seek(first * 8)
            entries = pagemap.read((last - first) * 8)
            flags = np.frombuffer(entries, dtype="<u8", count=len(entries) // 8)
            for start, stop in _runs((flags & _PRESENT_FILE_PAGE) == _PRESENT_FILE_PAGE):
                libc.madvise((first + start) * page, (stop - start) * page, _MADV_DONTNEED)


def _runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """(start, stop) of each run of True in `mask`."""
    edges = np.flatnonzero(np.diff(np.concatenate(([0], mask.astype(np.int8), [0]))))
    return list(zip(edges[::2].tolist(), edges[1::2].tolist()))
