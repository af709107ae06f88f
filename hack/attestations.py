#!/usr/bin/env python3
"""The operator image's SBOM and provenance, written next to the image by hack/image.sh.

  attestations.py sbom --lock Cargo.lock --metadata M.json --resolve R.json --name N \
                       --version V --image-digest D --created EPOCH --out F
      An SPDX 2.3 JSON document: one package per entry of Cargo.lock (name, version, where it
      comes from, the .crate's SHA-256 from the lock file, a `pkg:cargo` purl, the licence
      Cargo's metadata declares, NOASSERTION where it declares none), nothing else but the image
      itself. The relationships say which of them the image holds: CONTAINS for the crates linked
      into the operator binary, BUILD_DEPENDENCY_OF for those only run to build it (build
      scripts, proc-macros), none for the rest (tests, other platforms, the node agent).

  attestations.py provenance --subject NAME=sha256:HEX... --byproduct NAME=PATH... \
                             --param K=V... --dependency NAME=VALUE... --out F
      An in-toto Statement (v1) with a SLSA provenance (v1) predicate: the subjects (image
      index, each platform's manifest, the archive), the inputs (commit, Cargo.lock's digest,
      the toolchain, the CA bundle, the linkers and C libraries) and the binaries as byproducts.
      Not signed: `cosign attest --predicate` at push time signs it for a registry.

Both depend on their inputs only (sorted, no clock), so the same build writes the same files.
"""
import argparse
import hashlib
import json
import re
import tomllib
import uuid
from datetime import datetime, timezone

CRATES_IO = "registry+https://github.com/rust-lang/crates.io-index"


def spdx_id(*parts: str) -> str:
    return "SPDXRef-" + "-".join(re.sub(r"[^A-Za-z0-9.]+", ".", p) for p in parts)


def spdx_licence(expr):
    """Cargo's `license` as an SPDX expression (the old `A/B` form is `A OR B`)."""
    if not expr:
        return "NOASSERTION"
    return " OR ".join(p.strip() for p in expr.split("/")) if "/" in expr else expr.strip()


def binary_closure(metadata: dict, root_name: str):
    """(linked, build_only): package ids linked into root's binary, and those only run at build."""
    nodes = {n["id"]: n for n in metadata["resolve"]["nodes"]}
    pkgs = {p["id"]: p for p in metadata["packages"]}
    root = next(p["id"] for p in metadata["packages"] if p["name"] == root_name and p["source"] is None)

    def is_proc_macro(pid):
        return any("proc-macro" in t["kind"] for t in pkgs[pid]["targets"])

    linked, seen, stack = set(), set(), [root]
    while stack:
        pid = stack.pop()
        if pid in seen:
            continue
        seen.add(pid)
        linked.add(pid)
        for d in nodes[pid]["deps"]:
            kinds = {k["kind"] for k in d["dep_kinds"]}
            if None in kinds and not is_proc_macro(d["pkg"]):
                stack.append(d["pkg"])
    reached, stack = set(), [root]
    while stack:
        pid = stack.pop()
        if pid in reached:
            continue
        reached.add(pid)
        for d in nodes[pid]["deps"]:
            if {k["kind"] for k in d["dep_kinds"]} - {"dev"}:
                stack.append(d["pkg"])
    return linked - {root}, reached - linked - {root}


def sbom(a):
    with open(a.lock, "rb") as f:
        lock = tomllib.load(f)
    with open(a.metadata) as f:
        metadata = json.load(f)
    with open(a.resolve) as f:
        resolved = json.load(f)
    meta = {(p["name"], p["version"]): p for p in metadata["packages"]}
    linked, build = binary_closure(resolved, a.name)
    nv = {p["id"]: (p["name"], p["version"]) for p in resolved["packages"]}
    linked_nv = {nv[i] for i in linked}
    build_nv = {nv[i] for i in build}
    created = datetime.fromtimestamp(a.created, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    image_id = "SPDXRef-image"
    hexd = a.image_digest.removeprefix("sha256:")
    packages = [
        {
            "SPDXID": image_id,
            "name": f"{a.name} image",
            "versionInfo": a.version,
            "primaryPackagePurpose": "CONTAINER",
            "downloadLocation": "NOASSERTION",
            "filesAnalyzed": False,
            "checksums": [{"algorithm": "SHA256", "checksumValue": hexd}],
            "licenseConcluded": "NOASSERTION",
            "licenseDeclared": "Apache-2.0",
            "copyrightText": "NOASSERTION",
            "comment": "the OCI image index of linux/amd64 and linux/arm64 (its digest)",
        }
    ]
    relationships = [
        {"spdxElementId": "SPDXRef-DOCUMENT", "relationshipType": "DESCRIBES", "relatedSpdxElement": image_id}
    ]
    for p in sorted(lock["package"], key=lambda p: (p["name"], p["version"])):
        name, version, source = p["name"], p["version"], p.get("source")
        m = meta.get((name, version), {})
        pid = spdx_id("crate", name, version)
        pkg = {
            "SPDXID": pid,
            "name": name,
            "versionInfo": version,
            "primaryPackagePurpose": "LIBRARY",
            "filesAnalyzed": False,
            "licenseConcluded": "NOASSERTION",
            "licenseDeclared": spdx_licence(m.get("license")),
            "copyrightText": "NOASSERTION",
            "externalRefs": [
                {
                    "referenceCategory": "PACKAGE-MANAGER",
                    "referenceType": "purl",
                    "referenceLocator": f"pkg:cargo/{name}@{version}",
                }
            ],
        }
        if source == CRATES_IO:
            pkg["downloadLocation"] = f"https://crates.io/api/v1/crates/{name}/{version}/download"
            pkg["sourceInfo"] = f"Cargo.lock source {source}"
        elif source is None:
            pkg["downloadLocation"] = "NOASSERTION"
            pkg["sourceInfo"] = "a member of this workspace (no source in Cargo.lock)"
        else:
            pkg["downloadLocation"] = "NOASSERTION"
            pkg["sourceInfo"] = f"Cargo.lock source {source}"
        if "checksum" in p:
            pkg["checksums"] = [{"algorithm": "SHA256", "checksumValue": p["checksum"]}]
        packages.append(pkg)
        if (name, version) in linked_nv:
            relationships.append(
                {"spdxElementId": image_id, "relationshipType": "CONTAINS", "relatedSpdxElement": pid}
            )
        elif (name, version) in build_nv:
            relationships.append(
                {"spdxElementId": pid, "relationshipType": "BUILD_DEPENDENCY_OF", "relatedSpdxElement": image_id}
            )
    doc = {
        "spdxVersion": "SPDX-2.3",
        "dataLicense": "CC0-1.0",
        "SPDXID": "SPDXRef-DOCUMENT",
        "name": f"{a.name}-{a.version}",
        "documentNamespace": "https://spdx.org/spdxdocs/"
        + f"{a.name}-{a.version}-{uuid.uuid5(uuid.NAMESPACE_URL, a.image_digest)}",
        "creationInfo": {"created": created, "creators": ["Tool: hack/attestations.py"]},
        "packages": packages,
        "relationships": relationships,
    }
    write(a.out, doc)


def kv(items):
    out = []
    for item in items:
        k, sep, v = item.partition("=")
        if not sep:
            raise SystemExit(f"{item}: KEY=VALUE")
        out.append((k, v))
    return out


def file_sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def provenance(a):
    subjects = [{"name": n, "digest": {"sha256": d.removeprefix("sha256:")}} for n, d in kv(a.subject)]
    deps = []
    for n, v in kv(a.dependency):
        if v.startswith("sha256:"):
            deps.append({"name": n, "digest": {"sha256": v.removeprefix("sha256:")}})
        elif v.startswith("git:"):
            commit = v.removeprefix("git:")
            dep = {"name": n, "digest": {"gitCommit": commit.removesuffix("-dirty")}}
            if commit.endswith("-dirty"):
                # built from a work tree with changes not committed: the commit alone is not it
                dep["annotations"] = {"uncommittedChanges": True}
            deps.append(dep)
        else:
            deps.append({"name": n, "annotations": {"version": v}})
    statement = {
        "_type": "https://in-toto.io/Statement/v1",
        "subject": subjects,
        "predicateType": "https://slsa.dev/provenance/v1",
        "predicate": {
            "buildDefinition": {
                "buildType": "urn:clickhouse-operator:hack-image-sh:v1",
                "externalParameters": dict(kv(a.param)),
                "internalParameters": dict(kv(a.internal)),
                "resolvedDependencies": deps,
            },
            "runDetails": {
                "builder": {"id": "urn:clickhouse-operator:builder:hack-image-sh"},
                "byproducts": [
                    {"name": n, "digest": {"sha256": file_sha256(p)}} for n, p in kv(a.byproduct)
                ],
            },
        },
    }
    write(a.out, statement)


def write(path, doc):
    with open(path + ".tmp", "w") as f:
        json.dump(doc, f, indent=2, sort_keys=True)
        f.write("\n")
    import os

    os.replace(path + ".tmp", path)


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sbom")
    s.add_argument("--lock", required=True)
    s.add_argument("--metadata", required=True, help="`cargo metadata --format-version 1`: licences")
    s.add_argument(
        "--resolve",
        required=True,
        help="the same with --filter-platform for the image's targets: what the binary links",
    )
    s.add_argument("--name", required=True)
    s.add_argument("--version", required=True)
    s.add_argument("--image-digest", required=True)
    s.add_argument("--created", type=int, required=True)
    s.add_argument("--out", required=True)
    v = sub.add_parser("provenance")
    v.add_argument("--subject", action="append", default=[])
    v.add_argument("--byproduct", action="append", default=[])
    v.add_argument("--param", action="append", default=[])
    v.add_argument("--internal", action="append", default=[])
    v.add_argument("--dependency", action="append", default=[])
    v.add_argument("--out", required=True)
    a = p.parse_args()
    {"sbom": sbom, "provenance": provenance}[a.cmd](a)


if __name__ == "__main__":
    main()
