#!/usr/bin/env python3
"""Every CUDA kernel of the engine (gpu/*.cu, gpu/*.cuh) is launched with programmatic dependent launch
and starts with pdl_prologue() (gpu/launch.cuh).

A kernel launched with TESSERA_LAUNCH_PDL may start while the previous kernel on the stream still runs:
if it read an input, or wrote a buffer the previous kernel reads, before griddepcontrol.wait, it would
race. The CPU emulation runs launches one after another and cannot see that, so this checks the source:
  * the first statement of every __global__ function's body is `pdl_prologue();`;
  * gpu/ launches only through TESSERA_LAUNCH_PDL (a plain TESSERA_LAUNCH after a PDL kernel is safe,
    but would silently drop the overlap, and every engine kernel has the prologue).
Exits non-zero with each offending place.
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def problems_in(path: pathlib.Path) -> list:
    text = strip_comments(path.read_text())
    found = []
    for m in re.finditer(r"\b__global__\b", text):
        # The body starts at the first '{' after the parameter list's closing parenthesis.
        depth, i = 0, m.end()
        while i < len(text):
            c = text[i]
            if c == "(":
                depth += 1
            elif c == ")":
                depth -= 1
            elif c == ";" and depth == 0:
                break  # a declaration, no body
            elif c == "{" and depth == 0:
                first = text[i + 1 :].lstrip()
                if not first.startswith("pdl_prologue();"):
                    line = text.count("\n", 0, m.start()) + 1
                    found.append(f"{path.relative_to(ROOT)}:{line}: kernel body does not start with pdl_prologue();")
                break
            i += 1
    for m in re.finditer(r"\bTESSERA_LAUNCH\(", text):
        line = text.count("\n", 0, m.start()) + 1
        found.append(f"{path.relative_to(ROOT)}:{line}: plain TESSERA_LAUNCH in gpu/ (use TESSERA_LAUNCH_PDL)")
    return found


def main() -> int:
    files = sorted(list((ROOT / "gpu").glob("*.cu")) + list((ROOT / "gpu").glob("*.cuh")))
    files = [f for f in files if f.name != "launch.cuh"]  # defines the macros
    kernels = sum(len(re.findall(r"\b__global__\b", strip_comments(f.read_text()))) for f in files)
    problems = [p for f in files for p in problems_in(f)]
    for p in problems:
        print(p)
    if kernels == 0:
        print("no __global__ function found under gpu/: the check itself is broken")
        return 1
    print(f"{kernels} kernels in {len(files)} files checked, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
