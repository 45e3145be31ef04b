#!/usr/bin/env python3
"""Writes a raw disk as a fixed VHD: the disk's bytes, then the 512-byte footer Azure reads
(standard library only). qemu-img writes the same format (`-O vpc -o
subformat=fixed,force_size=on`), but with the time of the conversion and a random UUID in the
footer; here both are fixed, so that the same disk gives the same bytes. The disk's size
must be a whole number of MiB, which Azure requires of a VHD's virtual size.
"""

import argparse
import struct
import sys
import uuid

# Seconds from the Unix epoch to the VHD epoch (2000-01-01T00:00:00Z).
VHD_EPOCH = 946684800
# "qem2", as qemu-img writes with force_size=on: QEMU then takes the size from the footer's
# size field (as Azure does), not from the geometry, which cannot express every size.
CREATOR = b"qem2"
# The footer's UUID: any fixed value; Azure does not read it.
FOOTER_UUID = uuid.UUID("41535445-5249-534d-8000-766864000001")


def chs(sectors):
    """The disk geometry the VHD format prescribes for a size (its appendix's algorithm)."""
    sectors = min(sectors, 65535 * 16 * 255)
    if sectors >= 65535 * 16 * 63:
        spt, heads = 255, 16
        cyl_heads = sectors // spt
    else:
        spt = 17
        cyl_heads = sectors // spt
        heads = max((cyl_heads + 1023) // 1024, 4)
        if cyl_heads >= heads * 1024 or heads > 16:
            spt, heads = 31, 16
            cyl_heads = sectors // spt
        if cyl_heads >= heads * 1024:
            spt, heads = 63, 16
            cyl_heads = sectors // spt
    return cyl_heads // heads, heads, spt


def footer(size, timestamp):
    cylinders, heads, spt = chs(size // 512)
    f = bytearray(512)
    struct.pack_into(">8sIIQI4sI4sQQHBBI", f, 0,
                     b"conectix", 2, 0x00010000, 0xFFFFFFFFFFFFFFFF,
                     (timestamp - VHD_EPOCH) & 0xFFFFFFFF, CREATOR, 0x00050003, b"Wi2k",
                     size, size, cylinders, heads, spt, 2)
    f[68:84] = FOOTER_UUID.bytes
    checksum = ~sum(f) & 0xFFFFFFFF
    struct.pack_into(">I", f, 64, checksum)
    return bytes(f)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("raw")
    parser.add_argument("vhd")
    parser.add_argument("--timestamp", type=int, required=True)
    args = parser.parse_args()
    with open(args.raw, "rb") as src:
        size = src.seek(0, 2)
    if size % (1 << 20):
        sys.exit(f"{args.raw}: {size} bytes, not a whole number of MiB")
    # Sparse where the disk is zero (most of it: the state partition is empty).
    with open(args.raw, "rb") as src, open(args.vhd, "wb") as dst:
        while chunk := src.read(1 << 20):
            if chunk.count(0) == len(chunk):
                dst.seek(len(chunk), 1)
            else:
                dst.write(chunk)
        dst.write(footer(size, args.timestamp))
    return 0


if __name__ == "__main__":
    sys.exit(main())
