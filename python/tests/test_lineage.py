"""Version identity from Python: a restarted trainer publishing the same step number with other
bytes is applied (lineage_changed), never reported up to date; lineage_policy='strict' refuses
another lineage until update(accept_new_lineage=True)."""

import numpy as np
import pytest

import weightsync


def serve(endpoint, value, step, **options):
    pub = weightsync.Publisher(endpoint, **options)
    pub.register({"w": np.full(8, value, np.float32)})
    pub.publish(step)
    return pub


def test_restarted_trainer_same_step_is_applied(endpoint):
    dst = np.zeros(8, np.float32)
    with weightsync.Subscriber(endpoint) as sub:  # lineage_policy='follow'
        sub.register({"w": dst})
        with serve(endpoint, 1.0, 5, lineage="run-a") as pub:
            first = sub.update()
            assert (first.step, first.lineage, first.lineage_changed) == (5, "run-a", False)
            assert sub.committed_lineage == "run-a" and pub.lineage == "run-a"
        # The trainer restarts from its checkpoint and publishes step 5 again, other bytes.
        with serve(endpoint, 2.0, 5, lineage="run-a", resume_from_step=4):
            stats = sub.update()
            assert stats.step == 5 and stats.lineage_changed and not stats.up_to_date
            assert (dst == 2.0).all()
            again = sub.update()
            assert again.up_to_date and not again.lineage_changed
        # A new lineage (no name: a random one per start) is followed as well.
        with serve(endpoint, 3.0, 1) as pub:
            stats = sub.update()
            assert stats.step == 1 and stats.lineage_changed and stats.lineage == pub.lineage
            assert sub.committed_lineage == pub.lineage != "run-a"
            assert (dst == 3.0).all()


def test_strict_policy_refuses_another_lineage_until_accepted(endpoint):
    dst = np.zeros(8, np.float32)
    with weightsync.Subscriber(endpoint, lineage_policy="strict") as sub:
        sub.register({"w": dst})
        with serve(endpoint, 1.0, 7, lineage="run-a"):
            assert sub.update().step == 7
        with serve(endpoint, 2.0, 9, lineage="run-b"):
            with pytest.raises(weightsync.FailedPrecondition, match="run-b"):
                sub.update()
            assert sub.committed_step == 7 and sub.committed_lineage == "run-a"
            assert (dst == 1.0).all()  # nothing moved
            stats = sub.update(accept_new_lineage=True)
            assert (stats.step, stats.lineage, stats.lineage_changed) == (9, "run-b", True)
            assert sub.committed_lineage == "run-b" and (dst == 2.0).all()


def test_strict_policy_waits_for_a_restart_of_its_lineage_to_pass_its_step(endpoint):
    dst = np.zeros(8, np.float32)
    with weightsync.Subscriber(endpoint, lineage_policy="strict", timeout=0.5) as sub:
        sub.register({"w": dst})
        with serve(endpoint, 1.0, 7, lineage="run-a"):
            sub.update()
        with serve(endpoint, 2.0, 6, lineage="run-a", resume_from_step=5) as pub:
            with pytest.raises(weightsync.FailedPrecondition, match="has step 7 .* latest is 6"):
                sub.update()
            assert (dst == 1.0).all() and sub.committed_step == 7
            pub.publish(8)
            stats = sub.update()
            assert stats.step == 8 and stats.lineage_changed and (dst == 2.0).all()


def test_lineage_policy_argument_is_checked(endpoint):
    with pytest.raises(ValueError, match="'follow' or 'strict'"):
        weightsync.Subscriber(endpoint, lineage_policy="sometimes")
