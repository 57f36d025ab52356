"""Ctrl-C during a blocked update(): KeyboardInterrupt within ~200 ms, old weights intact (staged),
and the subscriber keeps working. See docs/python.md, "Interrupting update()"."""

import os
import signal
import threading
import time

import numpy as np
import pytest

import weightsync

pytestmark = pytest.mark.skipif(
    signal.getsignal(signal.SIGINT) is not signal.default_int_handler,
    reason="needs Python's default SIGINT handler")


def interrupt_after(seconds):
    sent = {}

    def fire():
        sent["at"] = time.monotonic()
        os.kill(os.getpid(), signal.SIGINT)

    timer = threading.Timer(seconds, fire)
    timer.start()
    return timer, sent


def setup_pair(endpoint, timeout, mode="staged"):
    pub = weightsync.Publisher(endpoint)
    sub = weightsync.Subscriber(endpoint, timeout=timeout, mode=mode)
    src = np.arange(1000, dtype=np.float32)
    dst = np.zeros_like(src)
    pub.register({"w": src})
    sub.register({"w": dst})
    pub.publish(1)
    sub.update(1)
    return pub, sub, src, dst


@pytest.mark.parametrize("mode", ["staged", "in_place"])
def test_interrupt_then_the_same_update_completes(endpoint, mode):
    pub, sub, src, dst = setup_pair(endpoint, timeout=10, mode=mode)
    with pub, sub:
        timer, sent = interrupt_after(0.33)
        with pytest.raises(KeyboardInterrupt):
            sub.update(2)  # never published while we wait
        latency = time.monotonic() - sent["at"]
        timer.join()
        assert latency < 0.2, f"KeyboardInterrupt {latency * 1000:.0f} ms after SIGINT"
        # Consistent: nothing of step 2 exists, the old weights are whole.
        assert sub.committed_step == 1 and sub.weights_valid
        assert (dst == src).all()
        src += 1
        pub.publish(2)
        stats = sub.update(2)  # the interrupted call finishes it; its stats are returned
        assert stats.step == 2 and sub.committed_step == 2
        assert (dst == src).all()
        src += 1
        pub.publish(3)
        assert sub.update().step == 3
        assert (dst == src).all()


def test_interrupted_update_that_times_out_leaves_a_working_subscriber(endpoint):
    pub, sub, src, dst = setup_pair(endpoint, timeout=0.8)
    with pub, sub:
        timer, sent = interrupt_after(0.2)
        with pytest.raises(KeyboardInterrupt):
            sub.update(2)
        timer.join()
        time.sleep(1.0)  # the abandoned call hits its deadline meanwhile
        assert sub.committed_step == 1 and (dst == src).all()
        src += 1
        pub.publish(2)
        stats = sub.update(2)
        assert stats.step == 2 and stats.handle_created  # re-prepared after the timeout
        assert (dst == src).all()


def test_sleep_after_interrupt_waits_for_the_abandoned_call(endpoint):
    pub, sub, src, dst = setup_pair(endpoint, timeout=0.6)
    with pub, sub:
        timer, _ = interrupt_after(0.2)
        with pytest.raises(KeyboardInterrupt):
            sub.update(2)
        timer.join()
        sub.sleep()  # settles the interrupted update first (≤ its timeout), then releases
        src += 1
        pub.publish(2)
        assert sub.update().step == 2 and (dst == src).all()


CHILD = """
import os, signal, sys, threading
import numpy as np
import weightsync
sub = weightsync.Subscriber(sys.argv[1], timeout=20)
sub.register({"w": np.zeros(1000, np.float32)})
sub.update(1)
threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
sub.update(2)  # never published: Ctrl-C, and the interpreter exits with the update abandoned
"""


def test_exit_after_ctrl_c_does_not_wait_for_the_timeout(endpoint):
    import subprocess
    import sys

    pub = weightsync.Publisher(endpoint)
    with pub:
        pub.register({"w": np.arange(1000, dtype=np.float32)})
        pub.publish(1)
        t0 = time.monotonic()
        child = subprocess.run([sys.executable, "-c", CHILD, endpoint], capture_output=True,
                               text=True, timeout=60)
        elapsed = time.monotonic() - t0
    assert "KeyboardInterrupt" in child.stderr, child.stderr
    assert elapsed < 5, f"exit took {elapsed:.1f} s (the update's timeout is 20 s)"



COMMIT_CHILD = """
import os, signal, sys, threading
import numpy as np
import weightsync
src = np.arange(1000, dtype=np.float32)
dst = np.zeros_like(src)
with weightsync.Publisher(sys.argv[1]) as pub, weightsync.Subscriber(sys.argv[1], timeout=20) as sub:
    pub.register({"w": src})
    sub.register({"w": dst})
    pub.publish(1)
    # The fail point (armed through the environment) holds the update for 1.5 s after every byte
    # arrived, right before the commit: the interrupt lands there.
    threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
    try:
        sub.update(1)
        print("no interrupt")
    except KeyboardInterrupt as exc:
        notes = getattr(exc, "__notes__", [])
        print("interrupted", exc.update_stats.step, sub.committed_step, sub.weights_valid,
              bool((dst == src).all()), any("committed step 1" in n for n in notes))
"""


def test_interrupt_during_the_commit_reports_the_committed_step(endpoint):
    """The commit is not interruptible: once the bytes are verified, the update commits. A
    Ctrl-C that lands there still raises KeyboardInterrupt (the user asked to stop), and the
    exception says that step N was committed (a note, and .update_stats). A fail point
    (subscriber.before_commit) holds the update just before its commit, where SIGINT arrives."""
    import subprocess
    import sys

    env = dict(os.environ, WEIGHTSYNC_FAILPOINTS="subscriber.before_commit=sleep:1500*1")
    child = subprocess.run([sys.executable, "-c", COMMIT_CHILD, endpoint], capture_output=True,
                           text=True, timeout=60, env=env)
    assert child.returncode == 0, child.stderr
    assert child.stdout.split() == ["interrupted", "1", "1", "True", "True", "True"], (
        child.stdout, child.stderr)
