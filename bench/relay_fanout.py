"""Relays against direct fan-out: R replicas updating from the trainer, each over its own
rate-limited NIC, directly or through a tree of relays (docs/relays.md), in the same run.

    sudo .venv/bin/python bench/relay_fanout.py [--replicas 8,16] [--mib 128] [--rate 1gbit]
        [--fanout 2] [--steps 2] [--json out.json]

One network namespace per host, the trainer's and R replicas', each joined by a veth to a bridge
in a namespace of its own; every host's end is shaped with `tc tbf` to --rate (the recipe of
../shared/PLATFORM.md), so each host's NIC sends at most --rate and the trainer's link carries
direct fan-out R times. The trainer process holds a bf16 model of --mib MiB in tensors of 8 MiB
(random bytes) and publishes on tcp with a token and delta='off'; each step after the first
draws every element anew (~all change), so every transfer is of the whole model. One replica
process per replica namespace:

  direct  every replica is a Subscriber of the trainer;
  tree    every replica is a relay (serve_endpoint on its own address); replica i's parent is the
          trainer for i < F, else replica (i - F) // F (a breadth-first tree of fan-out F).

Per step, every replica is already waiting in update(step) when the trainer publishes; each
reports time.time() when its update returned (a relay's after it serves the step: served_step ==
step). Time until all hold the step: the last of those minus the end of publish() (the version
visible). Trainer egress: the tx_bytes of the trainer's veth around the step (headers included).
Step 1 connects everyone and is not counted; rows are the median over steps 2..--steps+1. Every
replica's bytes are checked against the trainer's digest every step. One replica alone (direct)
is measured first: the issue's bound for the tree, 1.5 x one replica's transfer + depth x one
bucket's (8 MiB), is computed from it. The predictions are `./build/weightsync fanout-sim`'s,
where that binary exists: with --store-and-forward (what these relays do) for the rows, and the
cut-through model (the next increment's) beside the tree row.

Needs root and `ip netns` / `tc` (iproute2); the processes and namespaces are removed at the end,
whatever happens (finally and atexit), each step bounded by --step-timeout.
"""

import argparse
import atexit
import json
import os
import pathlib
import queue
import re
import shlex
import signal
import statistics
import subprocess
import sys
import threading
import time

import numpy as np

from netns_roles import TENSOR_MIB, digest, model_shapes, send

ROOT = pathlib.Path(__file__).resolve().parent.parent
TOKEN = "relay-fanout-bench-token-0123456789abcdef"
PORT = 29611
TRAINER_ADDR = "10.77.0.1"


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--replicas", default="8,16")
    p.add_argument("--mib", type=int, default=128)
    p.add_argument("--rate", default="1gbit", help="tc tbf rate of every host's NIC, or 'none'")
    p.add_argument("--fanout", type=int, default=2)
    p.add_argument("--steps", type=int, default=2, help="measured steps after the first")
    p.add_argument("--step-timeout", type=float, default=180, help="seconds a step may take")
    p.add_argument("--json")
    p.add_argument("--role", choices=["trainer", "replica"], help=argparse.SUPPRESS)
    p.add_argument("--endpoint", help=argparse.SUPPRESS)
    p.add_argument("--serve", default="", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def trainer(args):
    """Serves the model on args.endpoint; 'publish STEP' draws new bytes (after step 1) and
    publishes, 'digest' answers the model's digest."""
    import weightsync

    rng = np.random.default_rng(43)
    model = {n: rng.integers(0, 1 << 16, size=e, dtype=np.uint16)
             for n, e in model_shapes(args.mib).items()}
    with weightsync.Publisher(args.endpoint, token=TOKEN, timeout=120, delta="off") as pub:
        pub.register(model, dtypes={n: "bfloat16" for n in model})
        send({"ready": True})
        for line in sys.stdin:
            cmd, *rest = line.split()
            if cmd == "digest":
                send({"digest": digest(model)})
                continue
            step = int(rest[0])
            if step > 1:
                for v in model.values():
                    v[:] = rng.integers(0, 1 << 16, size=v.size, dtype=np.uint16)
            t0 = time.time()
            s = pub.publish(step)
            send({"step": step, "publish_start": t0, "published_at": time.time(),
                  "publish_seconds": s.seconds, "bytes": sum(v.nbytes for v in model.values())})


def replica(args):
    """A Subscriber of args.endpoint (a relay serving on args.serve when given): 'update STEP'
    updates and reports when it returned, 'digest' answers the weights' digest."""
    import weightsync

    shapes = model_shapes(args.mib)
    dst = {n: np.zeros(e, dtype=np.uint16) for n, e in shapes.items()}
    sub = weightsync.Subscriber(args.endpoint, token=TOKEN, timeout=120,
                                serve_endpoint=args.serve)
    sub.register(dst, dtypes={n: "bfloat16" for n in shapes})
    send({"ready": True, "serve_endpoint": sub.serve_endpoint})
    for line in sys.stdin:
        cmd, *rest = line.split()
        if cmd == "digest":
            send({"digest": digest(dst)})
            continue
        step = int(rest[0])
        try:
            st = sub.update(step)
        except Exception as e:  # reported whole: the orchestrator stops and prints it
            send({"error": f"{type(e).__name__}: {e}", "step": step})
            raise
        send({"step": step, "committed_at": time.time(), "seconds": st.seconds,
              "wait_seconds": st.wait_seconds, "bytes": st.bytes,
              "received_bytes": st.received_bytes, "delta_base_step": st.delta_base_step,
              "delta_segments": st.delta_segments,
              "served_step": st.served_step, "serve_seconds": st.serve_seconds,
              "stats": repr(st)})
    sub.close()


def sh(cmd, check=True, timeout=30):
    r = subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise RuntimeError(f"{cmd}: {r.stderr.strip()}")
    return r


class Net:
    """A bridge namespace and one namespace per host (trainer, replicas 0..n-1), each host's veth
    (eth0) shaped to `rate` on its egress; removed on exit, and at interpreter exit if need be."""

    def __init__(self, replicas, rate):
        tag = str(os.getpid() % 100000)
        self.bridge = f"wsrf-br-{tag}"
        self.trainer = f"wsrf-t-{tag}"
        self.replicas = [f"wsrf-r{i}-{tag}" for i in range(replicas)]
        self.rate = rate
        self.made = []

    @staticmethod
    def replica_addr(i):
        return f"10.77.{1 + i // 250}.{1 + i % 250}"

    def _host(self, ns, port, addr):
        sh(f"ip netns add {ns}")
        self.made.append(ns)
        sh(f"ip -n {self.bridge} link add {port} type veth peer name eth0 netns {ns}")
        sh(f"ip -n {self.bridge} link set {port} master br0 up")
        sh(f"ip -n {ns} addr add {addr}/16 dev eth0")
        sh(f"ip -n {ns} link set eth0 up")
        sh(f"ip -n {ns} link set lo up")
        if self.rate != "none":
            sh(f"ip netns exec {ns} tc qdisc add dev eth0 root tbf rate {self.rate} "
               "burst 256kb latency 50ms")

    def __enter__(self):
        atexit.register(self.__exit__, None, None, None)
        try:
            sh(f"ip netns add {self.bridge}")
            self.made.append(self.bridge)
            sh(f"ip -n {self.bridge} link add br0 type bridge")
            sh(f"ip -n {self.bridge} link set br0 up")
            self._host(self.trainer, "pt", TRAINER_ADDR)
            for i, ns in enumerate(self.replicas):
                self._host(ns, f"p{i}", self.replica_addr(i))
        except Exception:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc):
        Proc.kill_all()  # a namespace lives on while a process is in it
        while self.made:
            sh(f"ip netns del {self.made.pop()}", check=False)

    def trainer_tx_bytes(self):
        return int(sh(f"ip netns exec {self.trainer} cat /sys/class/net/eth0/statistics/tx_bytes")
                   .stdout)


class Proc:
    """A role in a namespace; its stdout lines go to a queue read under a deadline."""

    live = []

    def __init__(self, ns, role, args, endpoint, serve=""):
        cmd = ["ip", "netns", "exec", ns, sys.executable, __file__, "--role", role,
               "--endpoint", endpoint, "--mib", str(args.mib)]
        if serve:
            cmd += ["--serve", serve]
        env = dict(os.environ,
                   WEIGHTSYNC_LOG_LEVEL=os.environ.get("WEIGHTSYNC_LOG_LEVEL", "warn"))
        self.name = f"{role}@{ns}"
        self.p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                  env=env)
        Proc.live.append(self)
        self.lines = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.p.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def tell(self, line):
        self.p.stdin.write(line + "\n")
        self.p.stdin.flush()

    def reply(self, deadline):
        try:
            line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise TimeoutError(f"{self.name}: no reply within the step's deadline") from None
        if line is None:
            raise RuntimeError(f"{self.name} exited ({self.p.wait()})")
        got = json.loads(line)
        if "error" in got:
            raise RuntimeError(f"{self.name}: update({got['step']}) raised {got['error']}")
        return got

    def ask(self, line, deadline):
        self.tell(line)
        return self.reply(deadline)

    def stop(self, timeout=30):
        try:
            self.p.stdin.close()
        except OSError:
            pass
        try:
            self.p.wait(timeout=timeout or 0.001)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait(timeout=10)
        if self in Proc.live:
            Proc.live.remove(self)

    @staticmethod
    def kill_all():
        for proc in list(Proc.live):
            if proc.p.poll() is None:
                proc.p.kill()
            try:
                proc.p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            Proc.live.remove(proc)


def parent(i, fanout):
    """Replica i's parent in the breadth-first tree: None for the trainer."""
    return None if i < fanout else (i - fanout) // fanout


def depth(i, fanout):
    return 1 if parent(i, fanout) is None else 1 + depth(parent(i, fanout), fanout)


def store_and_forward_seconds(n, fanout, one):
    """What store-and-forward predicts from one replica's transfer `one`: a level starts once its
    parents committed, and a parent sends its children's copies through its one NIC, so each
    level takes (the most children of a parent on the level above) x one."""
    kids = {}
    for i in range(n):
        kids[parent(i, fanout)] = kids.get(parent(i, fanout), 0) + 1
    total = 0.0
    for d in range(1, max(depth(i, fanout) for i in range(n)) + 1):
        above = [None] if d == 1 else [j for j in range(n) if depth(j, fanout) == d - 1]
        total += max(kids.get(j, 0) for j in above) * one
    return total


def measure(net, args, n, fanout):
    """n replicas, direct (fanout None) or through a relay tree; per step, when each held it."""
    trainer_ep = f"tcp://{TRAINER_ADDR}:{PORT}"
    deadline = time.monotonic() + args.step_timeout
    procs = []
    ok = False
    try:
        pub = Proc(net.trainer, "trainer", args, trainer_ep)
        procs.append(pub)
        assert pub.reply(deadline).get("ready")
        subs = []
        for i in range(n):
            up = None if fanout is None else parent(i, fanout)
            endpoint = trainer_ep if up is None else f"tcp://{net.replica_addr(up)}:{PORT}"
            serve = "" if fanout is None else f"tcp://{net.replica_addr(i)}:{PORT}"
            subs.append(Proc(net.replicas[i], "replica", args, endpoint, serve))
        procs += subs
        for s in subs:
            assert s.reply(deadline).get("ready")
        steps = []
        for step in range(1, args.steps + 2):
            deadline = time.monotonic() + args.step_timeout
            tx0 = net.trainer_tx_bytes()
            for s in subs:
                s.tell(f"update {step}")
            time.sleep(0.3)  # every replica waiting in update(step) before the publish
            published = pub.ask(f"publish {step}", deadline)
            got = [s.reply(deadline) for s in subs]
            tx1 = net.trainer_tx_bytes()
            for i, g in enumerate(got):
                if g["step"] != step:
                    raise RuntimeError(f"replica {i}: committed step {g['step']}, asked {step}")
                if fanout is not None and g["served_step"] != step:
                    raise RuntimeError(f"replica {i} (relay): served_step {g['served_step']} after "
                                       f"update({step}): {g['stats']}")
            want = pub.ask("digest", deadline)["digest"]
            for i, s in enumerate(subs):
                have = s.ask("digest", deadline)["digest"]
                if have != want:
                    raise RuntimeError(f"replica {i}: step {step} digest {have}, trainer's {want}")
            at = published["published_at"]
            levels = {}
            for i, g in enumerate(got):
                d = 1 if fanout is None else depth(i, fanout)
                levels[d] = max(levels.get(d, 0.0), g["committed_at"] - at)
            steps.append({
                "step": step, "publish_seconds": published["publish_seconds"],
                "all_hold_seconds": max(g["committed_at"] for g in got) - at,
                "all_hold_from_publish_start_seconds":
                    max(g["committed_at"] for g in got) - published["publish_start"],
                "first_holds_seconds": min(g["committed_at"] for g in got) - at,
                "level_seconds": [levels[d] for d in sorted(levels)],
                "trainer_egress_bytes": tx1 - tx0, "model_bytes": published["bytes"],
                "received_bytes": [g["received_bytes"] for g in got],
                "delta_base_steps": [g["delta_base_step"] for g in got],
                "delta_segments": [g["delta_segments"] for g in got],
                "update_seconds": [g["seconds"] for g in got],
                "serve_seconds": [g["serve_seconds"] for g in got],
            })
        ok = True
        return steps
    finally:
        for proc in reversed(procs):
            proc.stop(timeout=30 if ok else 0)  # after a failure: killed at once


def summarize(n, fanout, steps):
    measured = steps[1:]
    med = lambda key: statistics.median(s[key] for s in measured)
    model = measured[0]["model_bytes"]
    d = 1 if fanout is None else max(depth(i, fanout) for i in range(n))
    return {
        "replicas": n, "mode": "direct" if fanout is None else "tree", "fanout": fanout or n,
        "depth": d, "model_bytes": model, "steps": [s["step"] for s in measured],
        "all_hold_seconds": med("all_hold_seconds"),
        "all_hold_seconds_each": [s["all_hold_seconds"] for s in measured],
        "all_hold_from_publish_start_seconds": med("all_hold_from_publish_start_seconds"),
        "first_holds_seconds": med("first_holds_seconds"),
        "level_seconds": [statistics.median(s["level_seconds"][k] for s in measured)
                          for k in range(d)],
        "publish_seconds": med("publish_seconds"),
        "trainer_egress_bytes": med("trainer_egress_bytes"),
        "trainer_egress_models": med("trainer_egress_bytes") / model,
        # Every replica received every byte whole (a relay's child may report a delta_base_step
        # with no delta segment: its session was a delta session, every segment came whole).
        "whole_transfers": all(b == model and d == 0 for s in measured
                               for b, d in zip(s["received_bytes"], s["delta_segments"])),
        "serve_seconds_median": statistics.median(x for s in measured for x in s["serve_seconds"]),
        "per_step": steps,
    }


def gbps(rate):
    m = re.fullmatch(r"([0-9.]+)([kmgt]?)(bit|bps)", rate.lower())
    if not m:
        return None
    scale = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}[m.group(2)]
    return float(m.group(1)) * scale * (8 if m.group(3) == "bps" else 1) / 1e9


def fanout_sim(n, model_bytes, rate, store_and_forward):
    """fanout-sim's 'all hold it' seconds by (topology, fan-out); {} without the binary."""
    binary = ROOT / "build" / "weightsync"
    g = gbps(rate)
    if not binary.exists() or g is None:
        return {}
    r = subprocess.run([str(binary), "fanout-sim", "--replicas", str(n), "--model-bytes",
                        str(model_bytes), "--trainer-gbps", str(g), "--replica-gbps", str(g),
                        "--bucket-bytes", str(TENSOR_MIB << 20)]
                       + (["--store-and-forward"] if store_and_forward else []),
                       capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        print(f"fanout-sim failed ({r.returncode}): {r.stderr.strip()}", flush=True)
        return {}
    out = {"command": shlex.join(r.args[1:]), "text": r.stdout}
    for line in r.stdout.splitlines():
        f = line.split()
        if len(f) >= 8 and f[0] in ("direct", "tree", "chain") and f[-1] == "s":
            out[(f[0], int(f[1]))] = float(f[-2])
    return out


def run(args):
    counts = [int(r) for r in args.replicas.split(",")]
    rows = []
    with Net(max(counts), args.rate) as net:
        alone = summarize(1, None, measure(net, args, 1, None))
        one = alone["all_hold_seconds"]
        bucket = one * (TENSOR_MIB << 20) / alone["model_bytes"]
        print(f"one replica alone: {one:.3f} s for {alone['model_bytes'] >> 20} MiB "
              f"(one 8 MiB bucket: {bucket:.3f} s)", flush=True)
        for n in counts:
            direct = summarize(n, None, measure(net, args, n, None))
            tree = summarize(n, args.fanout, measure(net, args, n, args.fanout))
            sim = fanout_sim(n, direct["model_bytes"], args.rate, store_and_forward=True)
            cut = fanout_sim(n, direct["model_bytes"], args.rate, store_and_forward=False)
            tree["cut_through_predicted_seconds"] = cut.get(("tree", args.fanout))
            for r in (direct, tree):
                r["predicted_seconds"] = sim.get(("direct", n) if r["mode"] == "direct"
                                                 else ("tree", args.fanout))
            tree["direct_over_tree"] = direct["all_hold_seconds"] / tree["all_hold_seconds"]
            tree["egress_target_models"] = args.fanout
            # On the wire a model's copy is the direct run's egress / n (payload + TCP/IP headers).
            wire = direct["trainer_egress_bytes"] / n
            tree["trainer_egress_wire_copies"] = tree["trainer_egress_bytes"] / wire
            tree["egress_target_met"] = tree["trainer_egress_wire_copies"] <= args.fanout + 0.01
            tree["time_bound_seconds"] = 1.5 * one + tree["depth"] * bucket
            tree["time_bound_met"] = tree["all_hold_seconds"] <= tree["time_bound_seconds"]
            tree["store_and_forward_estimate_seconds"] = store_and_forward_seconds(
                n, args.fanout, one)
            tree["fanout_sim"] = sim.get("text")
            rows += [direct, tree]
            print_rows(direct, tree, args)
    return alone, rows


def print_rows(direct, tree, args):
    def line(r, ratio):
        mode = "direct" if r["mode"] == "direct" else f"tree fanout {r['fanout']} depth {r['depth']}"
        pred = f"{r['predicted_seconds']:8.3f} s" if r["predicted_seconds"] is not None else "       -  "
        each = "/".join(f"{x:.2f}" for x in r["all_hold_seconds_each"])
        print(f"{r['replicas']:8d}  {mode:22s} {r['all_hold_seconds']:8.3f} s ({each})  "
              f"{r['trainer_egress_bytes'] / 2**20:9.1f} MiB {r['trainer_egress_models']:6.2f}x  "
              f"{ratio:>7s}  {pred}  {'whole' if r['whole_transfers'] else 'DELTAS'}", flush=True)

    print(f"{'replicas':>8s}  {'mode':22s} {'until all hold the step':31s}  "
          f"{'trainer egress':>21s}  {'direct/':>7s}  {'fanout-sim':>10s}  transfers", flush=True)
    line(direct, "")
    line(tree, f"{tree['direct_over_tree']:.2f}x")
    levels = ", ".join(f"{x:.2f}" for x in tree["level_seconds"])
    print(f"          tree: level 1..{tree['depth']} all hold the step at {levels} s; store and "
          f"forward predicts {tree['store_and_forward_estimate_seconds']:.2f} s (per level, a "
          f"parent's children x one transfer: it sends their copies through its one NIC after "
          f"it committed); relay serve_seconds median {tree['serve_seconds_median']:.3f} s; "
          f"fanout-sim's cut-through model (the next increment) "
          f"{tree['cut_through_predicted_seconds'] or float('nan'):.3f} s",
          flush=True)
    print(f"          targets: trainer egress <= {args.fanout} x model: "
          f"{'met' if tree['egress_target_met'] else 'NOT met'} "
          f"({tree['trainer_egress_models']:.3f}x the model's bytes, "
          f"{tree['trainer_egress_wire_copies']:.3f} copies as the direct run's wire bytes per "
          f"copy count headers); until all <= 1.5 x one transfer + depth x one "
          f"bucket = {tree['time_bound_seconds']:.2f} s: "
          f"{'met' if tree['time_bound_met'] else 'NOT met'} ({tree['all_hold_seconds']:.2f} s)",
          flush=True)


def main():
    args = parse()
    if args.role == "trainer":
        return trainer(args)
    if args.role == "replica":
        return replica(args)
    if os.geteuid() != 0 or sh("ip netns list", check=False).returncode != 0:
        sys.exit("relay_fanout.py: needs root and `ip netns` (iproute2)")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    commit = os.popen(f"git -C {ROOT} rev-parse --short HEAD").read().strip()
    print(f"relay_fanout: {args.mib} MiB bf16 model, every NIC {args.rate}, replicas "
          f"{args.replicas}, tree fan-out {args.fanout}, steps 2..{args.steps + 1} (median), "
          f"commit {commit}", flush=True)
    t0 = time.monotonic()
    try:
        alone, rows = run(args)
    finally:
        Proc.kill_all()
    print(f"wall {time.monotonic() - t0:.0f} s", flush=True)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(
            {"args": vars(args), "commit": commit, "one_replica_alone": alone, "rows": rows},
            indent=1))


if __name__ == "__main__":
    main()
