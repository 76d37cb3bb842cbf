#!/usr/bin/env python3
"""Write a single-layer OCI image archive from a rootfs directory (stdlib only).

The archive is what `ctr -n k8s.io images import` loads: an OCI image layout
(oci-layout, index.json, blobs/sha256/...) in a tar, with the image name in the
`io.containerd.image.name` annotation so containerd imports it under that name.
No registry and no Docker engine are involved.

The output is reproducible (sorted entries, owner 0:0, mtime 0), so the same
inputs give the same digests, which keeps containerd's content store tidy.

Usage:
  oci.py --rootfs DIR --name autonomic.test/busybox:1 --out image.tar \
         [--entrypoint '["/bin/sh"]'] [--cmd '["sh"]'] [--env K=V ...] [--workdir /]
"""

import argparse
import hashlib
import io
import json
import os
import sys
import tarfile

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _normalize(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    info.mtime = 0
    return info


def layer_tar(rootfs: str) -> bytes:
    """Uncompressed layer tar of rootfs, entries relative to / and sorted."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for dirpath, dirnames, filenames in os.walk(rootfs):
            dirnames.sort()
            rel_dir = os.path.relpath(dirpath, rootfs)
            entries = sorted(filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))])
            if rel_dir != ".":
                tar.add(dirpath, arcname=rel_dir, recursive=False, filter=_normalize)
            for name in entries:
                full = os.path.join(dirpath, name)
                arc = name if rel_dir == "." else os.path.join(rel_dir, name)
                tar.add(full, arcname=arc, recursive=False, filter=_normalize)
            # os.walk does not descend into symlinked dirs; they were added above.
            dirnames[:] = [d for d in dirnames if not os.path.islink(os.path.join(dirpath, d))]
    return buf.getvalue()


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def canonical(obj) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def build(args: argparse.Namespace) -> None:
    layer = layer_tar(args.rootfs)
    layer_digest = sha256(layer)

    env = args.env or []
    if not any(e.startswith("PATH=") for e in env):
        env = ["PATH=" + DEFAULT_PATH] + env
    cfg = {"Env": env, "WorkingDir": args.workdir}
    if args.entrypoint:
        cfg["Entrypoint"] = json.loads(args.entrypoint)
    if args.cmd:
        cfg["Cmd"] = json.loads(args.cmd)
    if args.stop_signal:
        cfg["StopSignal"] = args.stop_signal
    config = canonical({
        "created": "1970-01-01T00:00:00Z",
        "architecture": args.arch,
        "os": "linux",
        "config": cfg,
        "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
        "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "autonomic testbed oci.py"}],
    })
    manifest = canonical({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": sha256(config),
            "size": len(config),
        },
        "layers": [{
            "mediaType": "application/vnd.oci.image.layer.v1.tar",
            "digest": layer_digest,
            "size": len(layer),
        }],
    })
    index = canonical({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": sha256(manifest),
            "size": len(manifest),
            "platform": {"architecture": args.arch, "os": "linux"},
            "annotations": {
                "io.containerd.image.name": args.name,
                "org.opencontainers.image.ref.name": args.name.rsplit(":", 1)[-1],
            },
        }],
    })

    files = [
        ("oci-layout", canonical({"imageLayoutVersion": "1.0.0"})),
        ("index.json", index),
    ]
    for blob in (layer, config, manifest):
        files.append(("blobs/sha256/" + hashlib.sha256(blob).hexdigest(), blob))

    tmp = args.out + ".tmp"
    with tarfile.open(tmp, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for d in ("blobs", "blobs/sha256"):
            ti = _normalize(tarfile.TarInfo(d))
            ti.type = tarfile.DIRTYPE
            ti.mode = 0o755
            tar.addfile(ti)
        for name, data in files:
            ti = _normalize(tarfile.TarInfo(name))
            ti.size = len(data)
            ti.mode = 0o644
            tar.addfile(ti, io.BytesIO(data))
    os.replace(tmp, args.out)
    print(f"{args.out}: {args.name} manifest {sha256(manifest)} layer {len(layer)} bytes", file=sys.stderr)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rootfs", required=True)
    p.add_argument("--name", required=True, help="full image name, e.g. autonomic.test/pause:1")
    p.add_argument("--out", required=True)
    p.add_argument("--entrypoint", help="JSON list")
    p.add_argument("--cmd", help="JSON list")
    p.add_argument("--env", action="append", help="K=V, repeatable")
    p.add_argument("--workdir", default="/")
    p.add_argument("--stop-signal")
    p.add_argument("--arch", default="amd64")
    build(p.parse_args())


if __name__ == "__main__":
    main()
