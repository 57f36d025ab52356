"""The README's Python quick start runs as written, and the README stays a short landing page."""

import os
import pathlib
import re
import subprocess
import sys

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"
MAX_LINES = 160

# Canary for the quick-start test: a Subscriber that flips one byte of its first destination after
# every update. The quick start must then fail, which proves its own check compares the weights
# the update wrote (a snippet that only printed would pass the quick-start test as well).
CORRUPTING_SUBSCRIBER = '''
import numpy as _np
import weightsync as _ws

_Subscriber = _ws.Subscriber

class _CorruptingSubscriber:
    def __init__(self, *args, **kwargs):
        self._sub = _Subscriber(*args, **kwargs)
        self._first = None

    def register(self, tensors, *args, **kwargs):
        pairs = tensors.items() if hasattr(tensors, "items") else tensors
        self._first = next(iter(pairs))[1]
        return self._sub.register(tensors, *args, **kwargs)

    def update(self, *args, **kwargs):
        stats = self._sub.update(*args, **kwargs)
        _np.asarray(self._first).reshape(-1).view(_np.uint8)[0] ^= 1
        return stats

    def __getattr__(self, name):
        return getattr(self._sub, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._sub.close()

_ws.Subscriber = _CorruptingSubscriber
'''


def fenced_blocks(text):
    """(language, body, offset) of every ``` block, in order."""
    return [(m.group(1), m.group(2), m.start())
            for m in re.finditer(r"(?ms)^```(\w*)\n(.*?)^```[ \t]*$", text)]


def quick_start():
    """The first ```python block after the first heading that names a quick start."""
    text = README.read_text()
    heading = re.search(r"(?mi)^#+ .*quick start.*$", text)
    assert heading, "README.md has no quick-start heading"
    for lang, body, offset in fenced_blocks(text):
        if offset > heading.end() and lang == "python":
            return body
    raise AssertionError("README.md has no ```python block after its quick-start heading")


def run_python(code, tmp_path):
    """Runs `code` as a user would paste it: a fresh interpreter in an empty directory (so the
    source folder python/weightsync cannot shadow the installed package), with a socket directory
    of its own (0700, as the library requires) so that its endpoint names collide with nothing."""
    sockets = tmp_path / "sockets"
    sockets.mkdir()
    sockets.chmod(0o700)
    env = dict(os.environ, WEIGHTSYNC_SOCKET_DIR=str(sockets))
    return subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=120)


def test_python_quick_start_runs_as_written(tmp_path):
    out = run_python(quick_start(), tmp_path)
    assert out.returncode == 0, out.stdout
    steps = [int(s) for s in re.findall(r"UpdateStats\(step=(\d+),", out.stdout)]
    assert steps, f"the quick start printed no UpdateStats:\n{out.stdout}"
    assert steps[0] == 1 and steps == sorted(set(steps)), out.stdout


def test_quick_start_fails_when_the_update_leaves_a_wrong_byte(tmp_path):
    out = run_python(CORRUPTING_SUBSCRIBER + quick_start(), tmp_path)
    assert out.returncode != 0, out.stdout
    assert "AssertionError" in out.stdout, out.stdout


def test_readme_is_short_and_shows_the_two_commands():
    text = README.read_text()
    lines = text.count("\n")
    assert lines <= MAX_LINES, f"README.md has {lines} lines; move detail into docs/ (at most " \
                               f"{MAX_LINES})"
    commands = {line.split("#", 1)[0].strip()
                for lang, body, _ in fenced_blocks(text) if lang == "sh"
                for line in body.splitlines()}
    # CI runs the README's test command (.ci/run, docs/ci.md): it must stay `make test`.
    assert {"make demo", "make test"} <= commands, commands
