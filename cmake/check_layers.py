#!/usr/bin/env python3
"""Fails when a library's files include a header of a library it does not depend on.

Usage: check_layers.py MANIFEST LIBRARY SOURCE_DIR. The manifest (written by cmake/tessera_library.cmake)
lists, per library, the libraries it may include (itself and its declared dependencies, transitively)
and the files it owns. Quoted includes are resolved against the source root, the way the build's
include path resolves them; includes of files no library owns (third-party headers, generated files)
are not checked. Errors are printed compiler-style so that editors jump to the line.
"""
import re
import sys
from pathlib import Path

INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')


def main() -> int:
    manifest, library, root = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    allowed, owner, own_files = {}, {}, []
    for line in Path(manifest).read_text().splitlines():
        kind, lib, *rest = line.split()
        if kind == "library":
            allowed[lib] = set(rest)
        elif kind == "file":
            owner[rest[0]] = lib
            if lib == library:
                own_files.append(rest[0])
    may = allowed[library]
    errors = 0
    for rel in own_files:
        for number, text in enumerate((root / rel).read_text(errors="replace").splitlines(), 1):
            m = INCLUDE.match(text)
            if not m:
                continue
            target = m.group(1)
            lib = owner.get(target)
            if lib is None or lib in may:
                continue
            deps = " ".join(sorted(may - {library})) or "none"
            print(f"{rel}:{number}: error: {library} may not include \"{target}\": it belongs to {lib}, "
                  f"which is not among {library}'s declared dependencies ({deps})", file=sys.stderr)
            errors += 1
    if errors:
        print(f"{library}: {errors} include(s) outside the declared layering; either remove them or declare the "
              f"dependency in the library's tessera_library() call (docs/contributing.md, \"Layers\")", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
