#!/usr/bin/env python3
"""The include graph of lib/ is layered: each folder includes only folders below it (or itself),
no file include cycle exists, and a format's headers are included only inside its own folder under
formats/ (the registry sees drivers through the rows each format folder defines).

Usage: scripts/check_layers.py [LIB_DIR]     (exit 0: layered; 1: every violation printed)
       scripts/check_layers.py --self-test   (the checker finds each kind of violation in a made-up tree)
"""
import os
import re
import sys

# Lowest first: a folder may include its own files and those of folders before it.
LAYERS = [
    "core", "pt", "h5",
    "safetensors",       # the safetensors container read (Hugging Face's weights, wherever they sit)
    "shuffle",
    "source",            # the neutral index every source driver produces
    "patterns", "plan", "map", "union", "store",
    "layout",            # the target layout, model naming, the reshard plan (UcpInfo)
    "formats/driver.h",  # the source and target driver interfaces
    "formats/deepspeed",  # one folder per format: its source and target drivers
    "formats/hf",        # Hugging Face: safetensors models (a target)
    "formats/dcp",       # PyTorch Distributed Checkpoint (a source)
    "formats/megatron",  # Megatron-LM's legacy --ckpt-format torch (a source)
    "formats",           # the registry of drivers
    "convert", "inspect", "reshard",  # the pipelines the tools run
]
FORMAT_FOLDERS = [f for f in LAYERS if f.startswith("formats/") and not f.endswith(".h")]
# A format folder's headers another format folder may include: the model translations one table
# keeps (the DCP target writes torchtitan's Llama from the Hugging Face target's cut of Megatron's
# tensors and its torchtitan names, formats/hf/names.h).
# Megatron-LM's legacy files are placed as boxes of Megatron-Core's torch_dist tensors, and the distributed
# optimizer's buckets rebuilt by the one layout both forms share (formats/dcp/bucket_layout.h); the
# Megatron-Core target's torch_dist files are DCPs, laid out and written by the DCP target's code, and it
# writes a Llama under other families' names from the Hugging Face target's cut of its tensors.
SHARED_HEADERS = {"formats/dcp": ("formats/hf/model.h", "formats/hf/names.h"),
                  "formats/megatron": ("formats/hf/facts.h", "formats/hf/model.h", "formats/hf/names.h", "formats/dcp/metadata.h", "formats/dcp/bucket_layout.h", "formats/dcp/dcp_files.h",
                                       "formats/dcp/metadata_writer.h", "formats/dcp/target.h")}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def folder_of(rel):
    """The layer a path relative to lib/ belongs to (longest matching folder)."""
    best = None
    for layer in LAYERS:
        if layer.endswith(".h") and rel != layer:
            continue
        if rel == layer or rel.startswith(layer + "/"):
            if best is None or len(layer) > len(best):
                best = layer
    return best


def check(lib):
    """Every violation in the tree at `lib`, and (files, includes) counted."""
    rank = {layer: i for i, layer in enumerate(LAYERS)}
    graph = {}
    errors = []
    for dirpath, _, names in os.walk(lib):
        for name in names:
            if not name.endswith((".h", ".cpp")):
                continue
            rel = os.path.relpath(os.path.join(dirpath, name), lib)
            folder = folder_of(rel)
            if folder is None:
                errors.append(f"lib/{rel}: in no layer (add its folder to LAYERS in {sys.argv[0]})")
                continue
            parts = rel.split(os.sep)
            if parts[0] == "formats" and len(parts) > 2 and "/".join(parts[:2]) not in LAYERS:
                # else it would pass as formats/ itself, and nothing would keep other folders off its headers
                errors.append(f"lib/{rel}: format folder formats/{parts[1]} is in no layer "
                              f"(add it to LAYERS in {sys.argv[0]}, beside the other format folders)")
                continue
            with open(os.path.join(lib, rel), encoding="utf-8") as f:
                includes = INCLUDE.findall(f.read())
            graph[rel] = [i for i in includes if os.path.exists(os.path.join(lib, i))]
            for inc in graph[rel]:
                to = folder_of(inc)
                if to is None:
                    errors.append(f"lib/{rel}: includes {inc}, which is in no layer")
                elif rank[to] > rank[folder]:
                    errors.append(f"lib/{rel} ({folder}) includes {inc} ({to}), a layer above it")
                for fmt in FORMAT_FOLDERS:
                    if to == fmt and folder != fmt and inc not in SHARED_HEADERS.get(folder, ()):
                        errors.append(f"lib/{rel}: includes {inc}, a header of format folder {fmt}; "
                                      "only that folder may (the registry lists its driver rows)")
    # File-level cycles (depth-first search, colours: 1 on the stack, 2 done).
    colour = {}

    def visit(node, stack):
        colour[node] = 1
        stack.append(node)
        for nxt in graph.get(node, []):
            if colour.get(nxt) == 1:
                errors.append("include cycle: " + " -> ".join(stack[stack.index(nxt):] + [nxt]))
            elif colour.get(nxt) is None:
                visit(nxt, stack)
        stack.pop()
        colour[node] = 2

    for node in sorted(graph):
        if node not in colour:
            visit(node, [])
    return errors, len(graph), sum(len(v) for v in graph.values())


def self_test():
    import tempfile
    cases = {
        "a layer above": {"plan/a.h": '#include "store/b.h"', "store/b.h": ""},
        "header of format folder": {"convert/c.cpp": '#include "formats/deepspeed/d.h"', "formats/deepspeed/d.h": ""},
        "include cycle": {"core/x.h": '#include "core/y.h"', "core/y.h": '#include "core/x.h"'},
        "in no layer": {"elsewhere/z.cpp": ""},
        "format folder formats/newfmt is in no layer": {"formats/newfmt/index.h": ""},
    }
    failed = 0
    for expect, files in cases.items():
        with tempfile.TemporaryDirectory() as lib:
            for rel, text in files.items():
                os.makedirs(os.path.dirname(os.path.join(lib, rel)), exist_ok=True)
                with open(os.path.join(lib, rel), "w") as f:
                    f.write(text + "\n")
            errors, _, _ = check(lib)
            ok = any(expect in e for e in errors)
            failed += not ok
            print(f"check_layers self-test: {expect}: {'found' if ok else 'NOT FOUND'} ({errors})")
    with tempfile.TemporaryDirectory() as lib:  # and a clean tree passes
        os.makedirs(os.path.join(lib, "core"))
        open(os.path.join(lib, "core", "ok.h"), "w").close()
        errors, _, _ = check(lib)
        failed += bool(errors)
    return 1 if failed else 0


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    lib = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "lib"))
    errors, files, edges = check(lib)
    if errors:
        for e in errors:
            print("check_layers: " + e)
        print(f"check_layers: {len(errors)} violation(s) in {files} files, {edges} includes")
        return 1
    print(f"check_layers: layered: {files} files, {edges} includes, {len(LAYERS)} layers, no cycle")
    return 0


if __name__ == "__main__":
    sys.exit(main())
