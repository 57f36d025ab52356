"""Smoke test of an installed weightsync wheel (scripts/ci_wheel.sh runs it with the Debian
libraries the wheel was built against hidden): imports from the venv, not the source tree; says
whether it carries the GPU data plane; moves a tensor over shared memory and over TCP with a
token, verified, so the statically linked xxHash (digests) and libcrypto (HMAC handshake) run.

    python scripts/wheel_smoke.py [--want-cuda]
"""

import os
import sys
import tempfile

os.environ["WEIGHTSYNC_TOKEN"] = "wheel-smoke-token-0123456789abcdef"
os.environ.setdefault("WEIGHTSYNC_SOCKET_DIR", tempfile.mkdtemp(prefix="ws-wheel-"))

import numpy as np  # noqa: E402

import weightsync  # noqa: E402

assert weightsync.__file__.startswith(sys.prefix), f"not the installed wheel: {weightsync.__file__}"
status = weightsync.cuda_status()
if "--want-cuda" in sys.argv:
    assert status.built_with_cuda, f"the wheel has no GPU data plane: {status}"
src = {"w": np.arange(4096, dtype=np.float32), "b": np.arange(7, dtype=np.int64)}
for endpoint in (f"local://wheel-smoke-{os.getpid()}", "tcp://127.0.0.1:0"):
    with weightsync.Publisher(endpoint) as pub:
        pub.register(src)
        pub.publish(1)
        dst = {k: np.zeros_like(v) for k, v in src.items()}
        with weightsync.Subscriber(pub.endpoint, verify=True) as sub:
            sub.register(dst)
            stats = sub.update()
        assert stats.verified and all((dst[k] == src[k]).all() for k in src), endpoint
print(f"wheel_smoke: Python {sys.version.split()[0]}, {weightsync.__file__}, {status}: ok")
