#!/usr/bin/env python3
"""Runs every C++ compile command of a configured CMake build with -fsyntax-only, in parallel.

    python3 scripts/syntax_check.py BUILD_DIR [JOBS]

The thread-safety stage (scripts/ci_static.sh) needs clang's front end only: -Wthread-safety is
an analysis of the parsed code, so generating objects, linking and listing the test binaries would
only cost time. BUILD_DIR must be configured with CMAKE_EXPORT_COMPILE_COMMANDS=ON. Prints each
failing file with the compiler's own output and exits 1 if any failed.
"""
import json
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

# Options that name an output file: dropped, nothing is written.
OUTPUT_OPTIONS = {"-o", "-MF", "-MT", "-MQ"}
OUTPUT_FLAGS = {"-MD", "-MMD"}


def syntax_only(command: str) -> list[str]:
    args = shlex.split(command)
    kept: list[str] = []
    skip = False
    for a in args:
        if skip:
            skip = False
        elif a in OUTPUT_OPTIONS:
            skip = True
        elif a not in OUTPUT_FLAGS:
            kept.append(a)
    return kept + ["-fsyntax-only"]


def check(entry: dict) -> tuple[str, int, str]:
    done = subprocess.run(syntax_only(entry["command"]), cwd=entry["directory"],
                          capture_output=True, text=True)
    return entry["file"], done.returncode, done.stdout + done.stderr


def main() -> int:
    if len(sys.argv) not in (2, 3):
        print(__doc__, file=sys.stderr)
        return 2
    db = Path(sys.argv[1]) / "compile_commands.json"
    jobs = int(sys.argv[2]) if len(sys.argv) == 3 else 2
    entries = [e for e in json.loads(db.read_text()) if e["file"].endswith((".cc", ".cpp"))]
    if not entries:
        print(f"syntax_check: no C++ compile commands in {db}", file=sys.stderr)
        return 1
    failed = 0
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        for file, rc, out in pool.map(check, entries):
            if rc != 0:
                failed += 1
                print(f"---- {file} (exit {rc})\n{out}", file=sys.stderr)
            elif out.strip():
                print(f"---- {file}: warnings\n{out}")
    print(f"syntax_check: {len(entries)} files, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
