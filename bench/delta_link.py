"""Delta updates over a slow link: whole steps against deltas on the same rate-limited link, in the
same run.

    sudo .venv/bin/python bench/delta_link.py [--mib 256] [--rate 1gbit] [--fractions
        0,0.014,0.087,0.4,1] [--steps 2] [--json out.json]

Two network namespaces joined by a veth pair, the publisher's end shaped with `tc tbf` to
--rate (the recipe of ../shared/PLATFORM.md; --rate none: unshaped). The trainer process, in
one namespace, holds a bf16 model of --mib MiB in tensors of 8 MiB and, per step, nudges
--fractions of its elements by one ulp at random (a model the size of docs/deltas.md's measured
fractions: 1.4% is AdamW at lr 1e-6 published as bf16, 8.7% at 1e-5, 40% at 1e-4). It publishes
on tcp with deltas (PublisherOptions::delta 'auto') and, beside it on loopback, the same tensors
with delta 'off' (what encoding costs a publish). In the other namespace two subscribers of the
same publisher take turns over the link: one asks for deltas, the other (delta=False) takes
every step whole. Each row: the median over --steps steps of each one's update time and received
bytes, and their ratio, and the step time the issue asks about: publish + update, whole (the
publish without deltas, the whole update) against delta (the publish, which returns before its
deltas are encoded, and the delta update, which goes first and so waits for that encode); and
the encode's own time (Publisher.deltas()). Every update is checked bit for bit against the
trainer's digest.

Needs root and `ip netns` / `tc` (iproute2); the namespaces are removed at the end, whatever
happens.
"""

import argparse
import json
import os
import pathlib
import shlex
import statistics
import subprocess
import sys
import time

import numpy as np

from netns_roles import TENSOR_MIB, digest, model_shapes, send

ROOT = pathlib.Path(__file__).resolve().parent.parent
TOKEN = "delta-link-bench-token-0123456789abcdef"


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mib", type=int, default=256)
    p.add_argument("--rate", default="1gbit", help="tc tbf rate, or 'none'")
    p.add_argument("--fractions", default="0,0.014,0.087,0.4,1")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--json")
    p.add_argument("--role", choices=["trainer", "engines"], help=argparse.SUPPRESS)
    p.add_argument("--endpoint", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def trainer(args):
    """Serves the model on args.endpoint; each stdin line 'STEP FRACTION' publishes a step."""
    import weightsync

    rng = np.random.default_rng(41)
    model = {n: rng.integers(0, 1 << 16, size=e, dtype=np.uint16)
             for n, e in model_shapes(args.mib).items()}
    dtypes = {n: "bfloat16" for n in model}
    with weightsync.Publisher(args.endpoint, token=TOKEN, timeout=120) as pub, \
            weightsync.Publisher("tcp://127.0.0.1:0", delta="off", timeout=120) as off:
        pub.register(model, dtypes=dtypes)
        off.register(model, dtypes=dtypes)
        send({"ready": True})
        for line in sys.stdin:
            if line.strip() == "deltas":  # asked after the engines updated: waits for nothing
                d = pub.deltas()
                send({"step": d.step, "delta_base_step": d.base_step, "delta_bytes": d.delta_bytes,
                      "delta_segments": d.delta_segments, "whole_segments": d.whole_segments,
                      "changed_bytes": d.changed_bytes, "encode_seconds": d.encode_seconds})
                continue
            step, fraction = line.split()
            step, fraction = int(step), float(fraction)
            if step > 1 and fraction > 0:
                for v in model.values():
                    # Geometric gaps: each element changes with probability `fraction`.
                    gaps = rng.geometric(fraction, size=int(v.size * fraction * 1.2) + 16)
                    at = np.cumsum(gaps) - 1
                    v[at[at < v.size]] ^= 1  # one ulp
            # The publish without deltas first: the other's encode, which runs on after its
            # publish() returns, would otherwise share the cores with it.
            o = off.publish(step)
            s = pub.publish(step)
            send({"step": step, "publish_seconds": s.seconds, "publish_off_seconds": o.seconds,
                  "delta_pending": s.delta_pending, "digest": digest(model)})


def engines(args):
    """Two subscribers of args.endpoint; each stdin line 'STEP' updates both, one after the other."""
    import weightsync

    shapes = model_shapes(args.mib)
    subs = {}
    dst = {}
    for kind in ("delta", "whole"):
        dst[kind] = {n: np.zeros(e, dtype=np.uint16) for n, e in shapes.items()}
        subs[kind] = weightsync.Subscriber(args.endpoint, token=TOKEN, timeout=300,
                                           delta=kind == "delta")
        subs[kind].register(dst[kind], dtypes={n: "bfloat16" for n in shapes})
    send({"ready": True})
    for line in sys.stdin:
        step = int(line)
        out = {"step": step}
        # The delta subscriber first: its update includes any wait for the encode that runs on
        # after publish() returned.
        for kind in ("delta", "whole"):
            t0 = time.perf_counter()
            st = subs[kind].update(step)
            out[kind] = {"seconds": time.perf_counter() - t0, "bytes": st.bytes,
                         "received_bytes": st.received_bytes,
                         "delta_base_step": st.delta_base_step,
                         "delta_segments": st.delta_segments, "digest": digest(dst[kind])}
        send(out)
    for s in subs.values():
        s.close()


def sh(cmd, check=True):
    r = subprocess.run(cmd, shell=True, capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError(f"{cmd}: {r.stderr.strip()}")
    return r.returncode


class Link:
    """Two namespaces and a veth, the publisher's end shaped to `rate`; removed on exit."""

    def __init__(self, rate):
        tag = str(os.getpid() % 100000)
        self.pub, self.sub = "wsdp" + tag, "wsds" + tag
        self.rate, self.tag = rate, tag

    def __enter__(self):
        sh(f"ip netns add {self.pub}")
        try:
            sh(f"ip netns add {self.sub}")
            a, b = "wdla" + self.tag, "wdlb" + self.tag
            sh(f"ip link add {a} netns {self.pub} type veth peer name {b} netns {self.sub}")
            sh(f"ip -n {self.pub} addr add 10.78.0.1/24 dev {a}")
            sh(f"ip -n {self.sub} addr add 10.78.0.2/24 dev {b}")
            for ns, dev in ((self.pub, a), (self.sub, b)):
                sh(f"ip -n {ns} link set {dev} up")
                sh(f"ip -n {ns} link set lo up")
            if self.rate != "none":
                sh(f"ip netns exec {self.pub} tc qdisc add dev {a} root tbf rate {self.rate} "
                   "burst 256kb latency 50ms")
        except Exception:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc):
        sh(f"ip netns del {self.pub}", check=False)
        sh(f"ip netns del {self.sub}", check=False)


def spawn(ns, role, args, endpoint):
    cmd = (f"ip netns exec {ns} {shlex.quote(sys.executable)} {shlex.quote(__file__)} "
           f"--role {role} --endpoint {endpoint} --mib {args.mib}")
    env = dict(os.environ, WEIGHTSYNC_LOG_LEVEL=os.environ.get("WEIGHTSYNC_LOG_LEVEL", "warn"))
    p = subprocess.Popen(cmd, shell=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                         env=env)
    return p


def ask(p, line):
    p.stdin.write(line + "\n")
    p.stdin.flush()
    reply = p.stdout.readline()
    if not reply:
        raise RuntimeError(f"{p.args} exited ({p.wait()})")
    return json.loads(reply)


def run(args):
    fractions = [float(f) for f in args.fractions.split(",")]
    rows = []
    with Link(args.rate) as link:
        endpoint = "tcp://10.78.0.1:29517"
        pub = spawn(link.pub, "trainer", args, endpoint)
        try:
            assert json.loads(pub.stdout.readline()).get("ready")
            first = ask(pub, "1 0")
            sub = spawn(link.sub, "engines", args, endpoint)
            try:
                assert json.loads(sub.stdout.readline()).get("ready")
                got = ask(sub, "1")
                for kind in ("whole", "delta"):
                    assert got[kind]["digest"] == first["digest"], kind
                step = 1
                for fraction in fractions:
                    samples = []
                    for _ in range(args.steps):
                        step += 1
                        published = ask(pub, f"{step} {fraction}")
                        got = ask(sub, str(step))
                        published.update(ask(pub, "deltas"))
                        for kind in ("whole", "delta"):
                            assert got[kind]["digest"] == published["digest"], (kind, step)
                        samples.append((published, got))
                    rows.append(row(fraction, samples))
                    print_row(rows[-1], args)
            finally:
                sub.stdin.close()
                sub.wait(timeout=60)
        finally:
            pub.stdin.close()
            pub.wait(timeout=60)
    return rows


def row(fraction, samples):
    med = lambda xs: statistics.median(xs)
    whole = med([g["whole"]["seconds"] for _, g in samples])
    delta = med([g["delta"]["seconds"] for _, g in samples])
    model = samples[0][1]["whole"]["bytes"]
    return {
        "fraction": fraction,
        "model_bytes": model,
        "whole_seconds": whole,
        "delta_seconds": delta,
        "delta_over_whole": delta / whole,
        "delta_received_fraction": med([g["delta"]["received_bytes"] for _, g in samples]) / model,
        "delta_steps_as_deltas": sum(g["delta"]["delta_base_step"] >= 0 for _, g in samples),
        "steps": len(samples),
        "publish_seconds": med([p["publish_seconds"] for p, _ in samples]),
        "publish_off_seconds": med([p["publish_off_seconds"] for p, _ in samples]),
        "publish_over_off": med([p["publish_seconds"] / p["publish_off_seconds"]
                                 for p, _ in samples]),
        "encode_seconds": med([p["encode_seconds"] for p, _ in samples]),
        "publishes_returned_before_encoded": sum(p["delta_pending"] for p, _ in samples),
        "step_whole_seconds": med([p["publish_off_seconds"] + g["whole"]["seconds"]
                                   for p, g in samples]),
        "step_delta_seconds": med([p["publish_seconds"] + g["delta"]["seconds"]
                                   for p, g in samples]),
        "whole_segments": med([p["whole_segments"] for p, _ in samples]),
        "delta_segments": med([p["delta_segments"] for p, _ in samples]),
    }


def print_row(r, args):
    print(f"changed {r['fraction'] * 100:5.1f}%  whole {r['whole_seconds']:.3f} s  "
          f"delta {r['delta_seconds']:.3f} s  ({r['delta_over_whole']:.3f}x, received "
          f"{r['delta_received_fraction'] * 100:.2f}% of {r['model_bytes'] >> 20} MiB, "
          f"{r['delta_steps_as_deltas']}/{r['steps']} steps as deltas, segments "
          f"{r['delta_segments']:.0f} delta / {r['whole_segments']:.0f} whole)  publish "
          f"{r['publish_seconds']:.3f} s = {r['publish_over_off']:.2f}x of delta='off' "
          f"(encode {r['encode_seconds']:.3f} s after it, {r['publishes_returned_before_encoded']}/"
          f"{r['steps']} returned first); "
          f"step (publish + update) whole {r['step_whole_seconds']:.3f} s, delta "
          f"{r['step_delta_seconds']:.3f} s: {r['step_whole_seconds'] / r['step_delta_seconds']:.2f}x "
          "faster", flush=True)


def main():
    args = parse()
    if args.role == "trainer":
        return trainer(args)
    if args.role == "engines":
        return engines(args)
    if os.geteuid() != 0 or sh("ip netns list", check=False) != 0:
        sys.exit("delta_link.py: needs root and `ip netns` (iproute2)")
    print(f"delta_link: {args.mib} MiB bf16 model, link {args.rate}, fractions {args.fractions}, "
          f"{args.steps} steps each (median), commit {os.popen('git rev-parse --short HEAD').read().strip()}",
          flush=True)
    rows = run(args)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
