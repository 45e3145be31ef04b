#!/usr/bin/env python3
"""PCR arithmetic for the node image (standard library only).

predict    writes image.json: the image's inputs, the sha256 of each output, and the PCR
           values the build can compute, for both ways the image boots: the direct kernel
           boot (the kernel's and the initramfs' measurements) and the firmware's boot of
           the disk image (the UKI's Authenticode hash, its sections, the disk's GPT).
reference  reads a reference boot's serial console log: the PCR values and the TCG event
           log the init printed between markers; writes reference-pcrs.json and
           reference-eventlog.bin and compares the PCRs with image.json's prediction; when
           it holds, writes expected-pcrs.json (PCRs 0-9). The event log is parsed and
           replayed against the PCRs by `asterism-provision boot-measurements` (Rust, the
           parser the verifiers use), not here.
"""

import argparse
import base64
import hashlib
import json
import struct
import sys
from pathlib import Path

SHA256_ZERO = bytes(32)

# What OVMF (the Debian 2022.11 build) and the kernel's EFI stub (6.1) measure on a direct
# kernel boot (-kernel/-initrd/-append), checked against the event log of a reference boot:
# PCR 4: the kernel's PE image (Authenticode hash) as QEMU hands it over, the firmware's
#        "calling the boot option" action, then the separator that ends the pre-boot phase.
# PCR 9: the EFI stub's "LOADED_IMAGE::LoadOptions" event, the sha256 of the command line
#        as OVMF passes it (UTF-16LE, " initrd=initrd" appended, NUL-terminated), then its
#        "Linux initrd" event, the sha256 of the initramfs file.
CALLING_EFI_APPLICATION = b"Calling EFI Application from Boot Option"


def sha256(data):
    return hashlib.sha256(data).digest()


def extend(pcr, digest):
    return sha256(pcr + digest)


def authenticode_sha256(image):
    """The PE image hash that UEFI firmware measures: the file without its checksum, its
    certificate-table entry and the certificates themselves."""
    (pe_offset,) = struct.unpack_from("<I", image, 0x3C)
    if image[pe_offset:pe_offset + 4] != b"PE\0\0":
        raise ValueError("not a PE image")
    coff = pe_offset + 4
    sections, = struct.unpack_from("<H", image, coff + 2)
    opt_size, = struct.unpack_from("<H", image, coff + 16)
    opt = coff + 20
    magic, = struct.unpack_from("<H", image, opt)
    dirs = {0x10B: opt + 96, 0x20B: opt + 112}[magic]
    checksum = opt + 64
    cert_entry = dirs + 4 * 8
    size_of_headers, = struct.unpack_from("<I", image, opt + 60)
    cert_offset, cert_size = struct.unpack_from("<II", image, cert_entry)
    h = hashlib.sha256()
    h.update(image[:checksum])
    h.update(image[checksum + 4:cert_entry])
    h.update(image[cert_entry + 8:size_of_headers])
    hashed = size_of_headers
    table = opt + opt_size
    raw = []
    for i in range(sections):
        size, ptr = struct.unpack_from("<II", image, table + 40 * i + 16)
        if size:
            raw.append((ptr, size))
    for ptr, size in sorted(raw):
        h.update(image[ptr:ptr + size])
        hashed += size
    if len(image) > hashed:
        h.update(image[hashed:len(image) - cert_size])
    return h.digest()


# QEMU (7.2, x86_load_linux) fills in fields of the kernel's setup header before the
# firmware sees it, and they are inside what the firmware hashes: the loader type, the heap
# end, the command line's address, and the initrd's address and size. The initrd's
# address depends on the VM's memory below 4 GiB (q35: all of it under 2.75 GiB, else
# 2 GiB), less the space QEMU keeps for ACPI tables.
QEMU_REAL_ADDR = 0x10000
QEMU_CMDLINE_ADDR = 0x20000
QEMU_ACPI_DATA_SIZE = 0x28000
Q35_LOWMEM_SPLIT = 0xB0000000
Q35_LOWMEM = 0x80000000


def qemu_patched_kernel(kernel, initrd_size, memory_bytes):
    image = bytearray(kernel)
    if image[0x202:0x206] != b"HdrS" or struct.unpack_from("<H", image, 0x206)[0] < 0x202:
        raise ValueError("the kernel's boot protocol is older than QEMU's patching assumes")
    image[0x210] = 0xB0
    image[0x211] |= 0x80
    struct.pack_into("<H", image, 0x224, QEMU_CMDLINE_ADDR - QEMU_REAL_ADDR - 0x200)
    struct.pack_into("<I", image, 0x228, QEMU_CMDLINE_ADDR)
    below_4g = memory_bytes if memory_bytes < Q35_LOWMEM_SPLIT else Q35_LOWMEM
    initrd_max = struct.unpack_from("<I", image, 0x22C)[0]
    initrd_max = min(initrd_max, below_4g - QEMU_ACPI_DATA_SIZE - 1)
    struct.pack_into("<I", image, 0x218, (initrd_max - initrd_size) & ~4095)
    struct.pack_into("<I", image, 0x21C, initrd_size)
    return bytes(image)


def load_options(cmdline):
    """The command line as OVMF passes it to the kernel, and so as the EFI stub hashes it."""
    return (cmdline + " initrd=initrd").encode("utf-16-le") + b"\0\0"


# systemd-stub (252) measures each UKI section it finds into PCR 11, in this order: the
# section's name with its NUL, then its contents (systemd-measure computes the same).
UKI_SECTIONS = (".linux", ".osrel", ".cmdline", ".initrd", ".splash", ".dtb", ".pcrsig", ".pcrpkey")


def uki_pcr11_events(sections):
    events = []
    for name in UKI_SECTIONS:
        if name in sections:
            events.append((f"EV_IPL {name} (name)", sha256(name.encode() + b"\0")))
            events.append((f"EV_IPL {name}", sha256(sections[name])))
    return events


def gpt_event_digest(disk):
    """The digest of OVMF's EV_EFI_GPT_EVENT for the boot disk: the GPT header (its
    HeaderSize bytes), the number of partitions in use (UINT64), then their entries."""
    with open(disk, "rb") as f:
        f.seek(512)
        header = f.read(512)
        if header[:8] != b"EFI PART":
            raise ValueError(f"{disk}: no GPT header at LBA 1")
        header_size, = struct.unpack_from("<I", header, 12)
        entries_lba, count, entry_size = struct.unpack_from("<QII", header, 72)
        f.seek(entries_lba * 512)
        table = f.read(count * entry_size)
    used = [table[i:i + entry_size] for i in range(0, len(table), entry_size)
            if table[i:i + 16] != bytes(16)]
    return sha256(header[:header_size] + struct.pack("<Q", len(used)) + b"".join(used))


def certificate_der(pem_path):
    text = Path(pem_path).read_text()
    body = text.split("-----BEGIN CERTIFICATE-----")[1].split("-----END CERTIFICATE-----")[0]
    return base64.b64decode("".join(body.split()))


def replay(events):
    pcr = SHA256_ZERO
    for _, digest in events:
        pcr = extend(pcr, digest)
    return pcr


def predict(args):
    kernel = Path(args.kernel).read_bytes()
    initrd = Path(args.initrd).read_bytes()
    cmdline_file = Path(args.cmdline).read_bytes()
    cmdline = cmdline_file.decode("ascii").strip()
    memory = int(args.memory_mib) * 1024 * 1024
    kernel_hash = authenticode_sha256(qemu_patched_kernel(kernel, len(initrd), memory))
    pcr4_events = [
        ("EV_EFI_BOOT_SERVICES_APPLICATION", kernel_hash),
        ("EV_EFI_ACTION", sha256(CALLING_EFI_APPLICATION)),
        ("EV_SEPARATOR", sha256(bytes(4))),
    ]
    pcr9_events = [
        ("EV_EVENT_TAG LOADED_IMAGE::LoadOptions", sha256(load_options(cmdline))),
        ("EV_EVENT_TAG Linux initrd", sha256(initrd)),
    ]
    pcr4 = SHA256_ZERO
    for _, digest in pcr4_events:
        pcr4 = extend(pcr4, digest)
    pcr9 = SHA256_ZERO
    for _, digest in pcr9_events:
        pcr9 = extend(pcr9, digest)
    image = {
        "format": 1,
        "source_date_epoch": int(args.source_date_epoch),
        "kernel_release": args.kernel_release,
        "packages": json.loads(args.packages),
        "modules": json.loads(args.modules),
        "kubernetes_modules": json.loads(args.kubernetes_modules),
        "missing_optional_modules": args.missing_optional_modules.split(),
        "files": {
            "vmlinuz": hashlib.sha256(kernel).hexdigest(),
            "initramfs.cpio.zst": hashlib.sha256(initrd).hexdigest(),
            "cmdline": hashlib.sha256(cmdline_file).hexdigest(),
        },
        "bootstrapper_sha256": args.bootstrapper_sha256,
        "vm": {"machine": "q35", "memory_mib": int(args.memory_mib), "firmware": "OVMF_CODE_4M.fd"},
        "expected_pcrs": {"sha256": {"4": pcr4.hex(), "9": pcr9.hex()}},
        "expected_events": {
            "4": [{"type": t, "digest": d.hex()} for t, d in pcr4_events],
            "9": [{"type": t, "digest": d.hex()} for t, d in pcr9_events],
        },
    }
    image["uefi"] = predict_uefi(args, kernel, initrd, secure_boot=False)
    image["secure_boot"] = predict_uefi(args, kernel, initrd, secure_boot=True)
    image["files"].update(image["uefi"].pop("files"))
    image["secure_boot"].pop("files")
    json.dump(image, sys.stdout, indent=2, sort_keys=True)
    sys.stdout.write("\n")


def predict_uefi(args, kernel, initrd, secure_boot):
    """The firmware's boot of the disk image: OVMF measures the GPT of the disk it boots
    from (PCR 5) and the UKI it starts (PCR 4, its Authenticode hash: the signature is not
    part of it); systemd-stub measures the UKI's sections (PCR 11); the kernel the initrd
    the stub hands it (PCR 9). The command line is the UKI's own and is in PCR 11. PCR 7
    (the Secure Boot variables and the db entry that verified the UKI) depends on the
    firmware's variables, and comes from the reference boot."""
    uki = Path(args.uki).read_bytes()
    sections = {".linux": kernel, ".osrel": Path(args.osrel).read_bytes(),
                ".cmdline": Path(args.uki_cmdline).read_bytes(), ".initrd": initrd}
    # Checked against the event logs of boots: OVMF ends the pre-boot phase before it calls
    # the boot option, then measures the UKI. Without Secure Boot, systemd-stub starts the
    # kernel from its .linux section with LoadImage, which the firmware measures too (the
    # file as it is: no setup header fields patched, unlike QEMU's direct boot); with Secure
    # Boot it starts the kernel itself (the kernel is not signed apart from the UKI, so the
    # firmware would refuse it), and PCR 4 has no such event.
    pcr4_events = [
        ("EV_EFI_ACTION", sha256(CALLING_EFI_APPLICATION)),
        ("EV_SEPARATOR", sha256(bytes(4))),
        ("EV_EFI_BOOT_SERVICES_APPLICATION", authenticode_sha256(uki)),
    ]
    if not secure_boot:
        pcr4_events.append(("EV_EFI_BOOT_SERVICES_APPLICATION", authenticode_sha256(kernel)))
    # The disk's partition table, and the firmware's ExitBootServices.
    pcr5_events = [
        ("EV_SEPARATOR", sha256(bytes(4))),
        ("EV_EFI_GPT_EVENT", gpt_event_digest(args.disk)),
        ("EV_EFI_ACTION", sha256(b"Exit Boot Services Invocation")),
        ("EV_EFI_ACTION", sha256(b"Exit Boot Services Returned with Success")),
    ]
    # The kernel's EFI stub: the command line systemd-stub passes it (the .cmdline section
    # as UTF-16LE, NUL-terminated; no initrd= here), then the initrd.
    uki_cmdline = sections[".cmdline"].decode("ascii")
    pcr9_events = [
        ("EV_EVENT_TAG LOADED_IMAGE::LoadOptions",
         sha256(uki_cmdline.encode("utf-16-le") + b"\0\0")),
        ("EV_EVENT_TAG Linux initrd", sha256(initrd)),
    ]
    pcr11_events = uki_pcr11_events(sections)
    cert = certificate_der(args.signing_cert)
    disk = Path(args.disk)
    events = {"4": pcr4_events, "5": pcr5_events, "9": pcr9_events, "11": pcr11_events}
    return {
        "disk": {
            "size_bytes": disk.stat().st_size,
            "state_partition_label": args.state_label,
            "gpt_event_sha256": gpt_event_digest(disk).hex(),
        },
        "uki_authenticode_sha256": authenticode_sha256(uki).hex(),
        "signing_certificate_sha256": hashlib.sha256(cert).hexdigest(),
        "files": {name: hashlib.sha256(Path(path).read_bytes()).hexdigest()
                  for name, path in (("uki.efi", args.uki), ("disk.raw", args.disk))},
        "expected_pcrs": {"sha256": {k: replay(v).hex() for k, v in events.items()}},
        "expected_events": {k: [{"type": t, "digest": d.hex()} for t, d in v]
                            for k, v in events.items()},
    }


def reference(args):
    out = Path(args.out_dir)
    pcrs, b64, in_log = {}, [], False
    facts = []
    for raw in Path(args.console).read_bytes().splitlines():
        line = raw.decode("utf-8", "replace").strip("\r\n ")
        if line == "ASTERISM-EVENTLOG-BEGIN":
            in_log = True
        elif line == "ASTERISM-EVENTLOG-END":
            in_log = False
        elif in_log:
            b64.append(line)
        elif line.startswith("ASTERISM-PCR "):
            _, bank, index, value = line.split()
            pcrs.setdefault(bank, {})[index] = value.lower()
        elif line.startswith("asterism-init: "):
            facts.append(line[len("asterism-init: "):])
    if not pcrs:
        sys.exit("the console log holds no PCR values (did the init run with asterism.reference=1?)")
    log = base64.b64decode("".join(b64)) if b64 else b""
    ordered = {bank: dict(sorted(values.items(), key=lambda kv: int(kv[0])))
               for bank, values in sorted(pcrs.items())}
    (out / "reference-pcrs.json").write_text(json.dumps(ordered, indent=2) + "\n")
    (out / "reference-eventlog.bin").write_bytes(log)
    result = {"pcrs_read": len(pcrs.get("sha256", {})), "eventlog_bytes": len(log)}
    ok = True
    if args.image:
        image = json.loads(Path(args.image).read_text())
        # Direct kernel boots measure the kernel and initramfs QEMU hands over; firmware
        # boots (with Secure Boot or without) the UKI the disk holds.
        predicted = {"direct-kernel": image, "uefi": image["uefi"],
                     "secure-boot": image["secure_boot"]}[args.mode]
        expected = predicted["expected_pcrs"]["sha256"]
        for index, value in sorted(expected.items(), key=lambda kv: int(kv[0])):
            got = pcrs.get("sha256", {}).get(index)
            match = got == value
            print(f"PCR {index}: predicted {value} {'==' if match else '!='} booted {got}")
            ok = ok and match
        result["prediction_matches"] = ok
        if ok:
            # What a verifier expects of a node booted from this image in this VM: PCRs 0-9,
            # those the build predicts checked against the boot, the rest from the boot.
            booted = pcrs.get("sha256", {})
            expected_all = {str(i): booted[str(i)] for i in range(10) if str(i) in booted}
            (out / "expected-pcrs.json").write_text(
                json.dumps({"sha256": expected_all}, indent=2) + "\n")
    json.dump(result, sys.stdout, sort_keys=True)
    sys.stdout.write("\n")
    return 0 if ok else 1


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("predict")
    for name in ("kernel", "initrd", "cmdline", "kernel-release", "source-date-epoch",
                 "packages", "modules", "kubernetes-modules", "missing-optional-modules", "bootstrapper-sha256",
                 "memory-mib", "uki", "osrel", "uki-cmdline", "signing-cert", "disk", "state-label"):
        p.add_argument("--" + name, required=True)
    r = sub.add_parser("reference")
    r.add_argument("--console", required=True)
    r.add_argument("--out-dir", required=True)
    r.add_argument("--image")
    r.add_argument("--mode", choices=("direct-kernel", "uefi", "secure-boot"), default="direct-kernel")
    args = parser.parse_args()
    if args.command == "predict":
        predict(args)
        return 0
    return reference(args)


if __name__ == "__main__":
    sys.exit(main())
