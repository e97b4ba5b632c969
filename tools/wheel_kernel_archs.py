"""List the GPU architectures an engine wheel's own CUDA kernels are compiled for.

    python tools/wheel_kernel_archs.py vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl

Reads every shared object in the wheel (a zip) whose name starts with a prefix below, finds
the CUDA fat binaries embedded in it (the fatbin header's magic 0xBA55ED50), and counts their
entries by kind and architecture: ELF (SASS, runs on its major version at or above its minor)
and PTX (JIT-compiled for any later GPU). Nothing is imported or run. The planner's
`VllmRelease.kernel_archs` (planner/engines.py) records the ELF architectures this prints.
No cuobjdump is needed; the layout read is the fatbin container's public header: a 16-byte
header (magic, version, header size, payload size), then entries each starting with kind
(1 PTX, 2 ELF), header size, payload size and, at byte 28, the architecture (e.g. 90)."""

from __future__ import annotations

import argparse
import collections
import struct
import zipfile

MAGIC = struct.pack("<I", 0xBA55ED50)
PREFIXES = ("vllm/_C", "vllm/_moe_C")
KINDS = {1: "PTX", 2: "ELF"}


def fatbin_entries(data: bytes) -> collections.Counter:
    found: collections.Counter = collections.Counter()
    at = 0
    while (start := data.find(MAGIC, at)) >= 0:
        _version, header_size, payload = struct.unpack_from("<HHQ", data, start + 4)
        if header_size != 16 or payload > len(data):
            at = start + 4
            continue
        entry, end = start + header_size, start + header_size + payload
        while entry < end:
            kind, _flags, entry_header, size = struct.unpack_from("<HHIQ", data, entry)
            if not 32 <= entry_header <= 1024:
                break
            arch = struct.unpack_from("<I", data, entry + 28)[0]
            found[(KINDS.get(kind, str(kind)), arch)] += 1
            entry += entry_header + size
        at = end
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("wheel")
    args = parser.parse_args()
    with zipfile.ZipFile(args.wheel) as wheel:
        for name in sorted(wheel.namelist()):
            if name.startswith(PREFIXES) and name.endswith(".so"):
                entries = fatbin_entries(wheel.read(name))
                listed = ", ".join(f"{kind} sm_{arch} x{count}" for (kind, arch), count in sorted(entries.items()))
                print(f"{name}: {listed or 'no fat binaries'}")


if __name__ == "__main__":
    main()
