#!/usr/bin/env python3
"""Writes the operator's OCI image (an image layout folder and its archive) from built binaries.

One image per platform (linux/amd64, linux/arm64), gathered by an image index: the layout's
index.json names that index (tag and full reference), the index lists each platform's manifest
with its `platform`. No container daemon and no base image: per platform one layer holding the
static binary of that platform, the CA bundle of
this machine's Debian `ca-certificates` package, and the few files a distroless image has
(/etc/passwd and /etc/group with the `nonroot` user 65532, /etc/nsswitch.conf, /tmp,
/home/nonroot). Every input is named in the image's labels, and the output depends on nothing
else: entries sorted, owners 0 (the home folder 65532), times SOURCE_DATE_EPOCH, gzip without a
name or time. The same inputs give the same digests. Prints the image index's digest (the
digest a registry and a runtime know the image by), then one line `<arch> <manifest digest>`
per platform.

usage: oci-image.py --binary amd64=B --binary arm64=B --ca-bundle F --ref NAME:TAG \
                    --version V --revision R --created EPOCH --label K=V... --out DIR --archive FILE
"""
import argparse
import gzip
import hashlib
import io
import json
import os
import shutil
import tarfile

PASSWD = "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n"
GROUP = "root:x:0:\nnonroot:x:65532:\n"
NSSWITCH = "passwd: files\ngroup: files\nhosts: files dns\n"


def layer(binary: str, ca_bundle: str, mtime: int) -> bytes:
    """The layer's uncompressed tar."""
    entries = []  # (path, mode, uid, data or None for a folder)

    def add_dir(path, mode=0o755, uid=0):
        entries.append((path, mode, uid, None))

    def add_file(path, data, mode=0o644):
        entries.append((path, mode, 0, data))

    with open(binary, "rb") as f:
        add_file("clickhouse-operator", f.read(), 0o555)
    with open(ca_bundle, "rb") as f:
        ca = f.read()
    for d in ["etc", "etc/ssl", "etc/ssl/certs", "home"]:
        add_dir(d)
    add_dir("home/nonroot", 0o700, 65532)
    add_dir("tmp", 0o1777)
    add_file("etc/passwd", PASSWD.encode())
    add_file("etc/group", GROUP.encode())
    add_file("etc/nsswitch.conf", NSSWITCH.encode())
    add_file("etc/ssl/certs/ca-certificates.crt", ca)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path, mode, uid, data in sorted(entries, key=lambda e: e[0]):
            info = tarfile.TarInfo(path)
            info.mode = mode
            info.uid = info.gid = uid
            info.uname = info.gname = ""
            info.mtime = mtime
            if data is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def canonical(obj) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


# OCI `platform.architecture` of each binary, and the ELF machine it must have
ARCHES = {"amd64": 62, "arm64": 183}  # EM_X86_64, EM_AARCH64


def elf_machine(data: bytes) -> int:
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise SystemExit("not a 64-bit little-endian ELF file")
    return int.from_bytes(data[0x12:0x14], "little")


def image(binary: str, arch: str, ca_bundle: str, a, labels: dict, created: str):
    """The blobs of one platform's image and its manifest's descriptor."""
    with open(binary, "rb") as f:
        machine = elf_machine(f.read(64))
    if machine != ARCHES[arch]:
        raise SystemExit(f"{binary}: ELF machine {machine}, not the one of {arch} ({ARCHES[arch]})")
    raw = layer(binary, ca_bundle, a.created)
    gz = io.BytesIO()
    with gzip.GzipFile(fileobj=gz, mode="wb", compresslevel=9, mtime=0, filename="") as z:
        z.write(raw)
    compressed = gz.getvalue()
    config = {
        "architecture": arch,
        "os": "linux",
        "created": created,
        "config": {
            "User": "65532:65532",
            "Entrypoint": ["/clickhouse-operator"],
            "Cmd": ["run"],
            "Env": ["SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt"],
            "ExposedPorts": {"8080/tcp": {}},
            "WorkingDir": "/",
            "Labels": labels,
        },
        "rootfs": {"type": "layers", "diff_ids": [sha256(raw)]},
        "history": [{"created": created, "created_by": "hack/oci-image.py"}],
    }
    config_bytes = canonical(config)
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": sha256(config_bytes),
            "size": len(config_bytes),
        },
        "layers": [
            {
                "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                "digest": sha256(compressed),
                "size": len(compressed),
            }
        ],
        "annotations": {"org.opencontainers.image.created": created},
    }
    manifest_bytes = canonical(manifest)
    descriptor = {
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "digest": sha256(manifest_bytes),
        "size": len(manifest_bytes),
        "platform": {"architecture": arch, "os": "linux"},
    }
    return [compressed, config_bytes, manifest_bytes], descriptor


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--binary", action="append", required=True, help="ARCH=PATH (amd64, arm64)")
    p.add_argument("--ca-bundle", required=True)
    p.add_argument("--ref", required=True, help="repository:tag the image is known by")
    p.add_argument("--version", required=True)
    p.add_argument("--revision", required=True)
    p.add_argument("--created", type=int, required=True, help="seconds since the epoch")
    p.add_argument("--label", action="append", default=[], help="KEY=VALUE")
    p.add_argument("--out", required=True, help="the OCI image layout folder to write")
    p.add_argument("--archive", required=True, help="the same layout as one tar file")
    a = p.parse_args()

    from datetime import datetime, timezone

    created = datetime.fromtimestamp(a.created, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    labels = {
        "org.opencontainers.image.title": "clickhouse-operator",
        "org.opencontainers.image.description": "A Kubernetes operator for ClickHouse",
        "org.opencontainers.image.licenses": "Apache-2.0",
        "org.opencontainers.image.version": a.version,
        "org.opencontainers.image.revision": a.revision,
        "org.opencontainers.image.created": created,
    }
    for kv in a.label:
        k, _, v = kv.partition("=")
        labels[k] = v
    binaries = {}
    for b in a.binary:
        arch, _, path = b.partition("=")
        if arch not in ARCHES or not path:
            raise SystemExit(f"--binary {b}: ARCH=PATH with ARCH one of {sorted(ARCHES)}")
        binaries[arch] = path
    blobs, descriptors = [], []
    # platforms in a fixed order: amd64 first, the order of ARCHES
    for arch in [x for x in ARCHES if x in binaries]:
        b, d = image(binaries[arch], arch, a.ca_bundle, a, labels, created)
        blobs += b
        descriptors.append(d)
    image_index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": descriptors,
        "annotations": {"org.opencontainers.image.created": created},
    }
    index_bytes = canonical(image_index)
    blobs.append(index_bytes)
    layout_index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [
            {
                "mediaType": "application/vnd.oci.image.index.v1+json",
                "digest": sha256(index_bytes),
                "size": len(index_bytes),
                "annotations": {
                    # the full reference (containerd, skopeo) and the tag (OCI layout)
                    "io.containerd.image.name": a.ref,
                    "org.opencontainers.image.ref.name": a.ref.rsplit(":", 1)[1],
                },
            }
        ],
    }
    files = {"oci-layout": canonical({"imageLayoutVersion": "1.0.0"}), "index.json": canonical(layout_index)}
    for blob in blobs:
        files["blobs/sha256/" + sha256(blob)[7:]] = blob

    shutil.rmtree(a.out, ignore_errors=True)
    for path, data in files.items():
        full = os.path.join(a.out, path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "wb") as f:
            f.write(data)
    with tarfile.open(a.archive + ".tmp", mode="w", format=tarfile.PAX_FORMAT) as tar:
        for d in ["blobs", "blobs/sha256"]:
            info = tarfile.TarInfo(d)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, a.created
            tar.addfile(info)
        for path in sorted(files):
            info = tarfile.TarInfo(path)
            info.size, info.mode, info.mtime = len(files[path]), 0o644, a.created
            tar.addfile(info, io.BytesIO(files[path]))
    os.replace(a.archive + ".tmp", a.archive)
    print(sha256(index_bytes))
    for d in descriptors:
        print(d["platform"]["architecture"], d["digest"])


if __name__ == "__main__":
    main()
