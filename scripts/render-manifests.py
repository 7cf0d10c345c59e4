#!/usr/bin/env python3
"""Copies the shipped manifests (deploy/, examples/) to OUT with every serving-picker image
pinned: `registry.example.com/serving-picker-<x>:<tag>` becomes `<prefix>/serving-picker-<x>@sha256:<d>`
(the digest of that image, from images.txt), and a wasm image's `url:` line gets a `sha256:`
sibling with the same digest: Istio's WasmPlugin and Envoy Gateway's EnvoyExtensionPolicy compare
that field with the image's manifest digest (their pkg/wasm, internal/wasm caches).

usage: render-manifests.py IMAGES_TXT PREFIX VERSION OUT DIR...
IMAGES_TXT lines: <name> <tag> <digest>. A reference to a serving-picker image at a tag that
was not released (another version) is an error: one version everywhere.
"""
import os
import re
import shutil
import sys

SOURCE_REGISTRY = "registry.example.com"
REF = re.compile(
    r"(?P<scheme>oci://)?" + re.escape(SOURCE_REGISTRY) + r"/(?P<name>serving-picker(?:-[a-z0-9]+)*):(?P<tag>[A-Za-z0-9._-]+)"
)
URL_LINE = re.compile(r"^(?P<indent>\s*)url:\s")


def main() -> int:
    images_txt, prefix, version, out, *dirs = sys.argv[1:]
    digests = {}
    with open(images_txt) as f:
        for line in f:
            if line.strip():
                name, tag, digest = line.split()
                digests[(name, tag)] = digest
    errors = []
    pinned = 0
    for top in dirs:
        for dirpath, _, files in os.walk(top):
            for file in sorted(files):
                src = os.path.join(dirpath, file)
                dst = os.path.join(out, src)
                os.makedirs(os.path.dirname(dst), exist_ok=True)
                if not file.endswith((".yaml", ".yml")):
                    shutil.copyfile(src, dst)
                    continue
                lines_out = []
                with open(src) as f:
                    for n, line in enumerate(f, 1):
                        m = REF.search(line)
                        if not m or line.lstrip().startswith("#"):
                            lines_out.append(line)
                            continue
                        key = (m["name"], m["tag"])
                        if key not in digests:
                            errors.append(f"{src}:{n}: {m[0]} is not a released image (version {version})")
                            lines_out.append(line)
                            continue
                        digest = digests[key]
                        ref = f"{m['scheme'] or ''}{prefix}/{m['name']}@{digest}"
                        lines_out.append(line[: m.start()] + ref + line[m.end():])
                        pinned += 1
                        url = URL_LINE.match(line)
                        if m["name"] == "serving-picker-wasm" and url:
                            hexdigest = digest.split(":", 1)[1]
                            lines_out.append(f"{url['indent']}sha256: \"{hexdigest}\"   # the image's manifest digest (quoted: all-digit hex is a YAML number)\n")
                with open(dst, "w") as f:
                    f.writelines(lines_out)
    for e in errors:
        print(f"render-manifests: {e}", file=sys.stderr)
    print(f"render-manifests: {pinned} image references pinned by digest under {out}")
    return 1 if errors or pinned == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
