"""Relays against direct fan-out: R replicas updating from the trainer, each over its own
rate-limited NIC, directly, through a tree of relays (docs/relays.md), or through the tree the
trainer itself builds (max_direct), in the same run.

    sudo .venv/bin/python bench/relay_fanout.py [--replicas 8,16] [--mib 128] [--rate 1gbit]
        [--fanout 2] [--steps 2] [--modes direct,tree,placed] [--kill [--kill-after S]]
        [--json out.json]

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
  placed  the trainer bounds its direct subscribers (Publisher(max_direct=F)); every replica is a
          relay on its own address bounding its own children (serve_max_direct=F) and dials the
          TRAINER's endpoint. At step 1 (published first) the replicas join one at a time in
          index order (each update(1) returns before the next starts), so the trainer redirects
          each newcomer past its bound to a relay with room (docs/relays.md, "Topology"). The
          tree is then read back: the trainer's members() and every relay's served_members(),
          joined by MemberInfo.serves (the relay's announced serve endpoint, cross-checked with
          the member's peer address), give each replica's parent, the depth and the most
          children of a node; the run fails, printing the lists, when a node has more than F
          children, a replica has no parent or sits in two lists. Levels are the derived depths.

--modes picks a subset (default all three, in that order, for each --replicas count).

Per step, every replica is already waiting in update(step) when the trainer publishes; each
reports time.time() when its update returned (a relay's after it serves the step: served_step ==
step). Time until all hold the step: the last of those minus the end of publish() (the version
visible). Trainer egress: the tx_bytes of the trainer's veth around the step (headers included).
Step 1 connects everyone and is not counted; rows are the median over steps 2..--steps+1. Every
replica's bytes are checked against the trainer's digest every step. One replica alone (direct)
is measured first: the issue's bound for the tree, 1.5 x one replica's transfer + depth x one
bucket's (8 MiB), is computed from it. The predictions are `./build/weightsync fanout-sim`'s,
where that binary exists: its cut-through model (what relays do for whole steps over tcp, which
every step here is) for the tree and placed rows, and its store-and-forward model (relays before
cut-through) beside them.

--kill (placed mode): after the measured steps, one more step in which the level-1 relay (a child
of the trainer) with the most replicas below it is SIGKILLed (its process, alone in its
namespace) --kill-after seconds after the end of publish() (default: half of one replica-alone
transfer). A replica reports a failed update as {"error", "step", "failed_at"} and lives on; the
orchestrator tells each one whose update failed (an orphan: the killed relay's children) 'update
STEP' again at once, and it re-attaches through the trainer's endpoint (placed on another relay,
or directly). Reported: the replicas outside the killed relay's subtree, until all hold the step
from the end of publish() and its ratio to the measured steps' median (target <= 1.10x); the
orphans, from the kill until all hold the step, against one subscriber deadline (120 s) + one
replica-alone transfer, and in transfers of one replica alone; the whole subtree likewise; every
survivor's digest; the tree after re-attachment (members()/served_members() again).

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
MODES = ("direct", "tree", "placed")
SUBSCRIBER_TIMEOUT = 120  # seconds: every replica's Subscriber(timeout=), the trainer's too


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--replicas", default="8,16")
    p.add_argument("--mib", type=int, default=128)
    p.add_argument("--rate", default="1gbit", help="tc tbf rate of every host's NIC, or 'none'")
    p.add_argument("--fanout", type=int, default=2)
    p.add_argument("--steps", type=int, default=2, help="measured steps after the first")
    p.add_argument("--step-timeout", type=float, default=180, help="seconds a step may take")
    p.add_argument("--modes", default="direct,tree,placed",
                   help="which of direct, tree, placed to run (comma-separated)")
    p.add_argument("--kill", action="store_true",
                   help="placed mode: one more step in which a level-1 relay with children is "
                        "SIGKILLed --kill-after seconds after the publish")
    p.add_argument("--kill-after", type=float, default=None,
                   help="seconds after the end of publish() (default: half of one replica-alone "
                        "transfer, measured at the start of the run)")
    p.add_argument("--json")
    p.add_argument("--role", choices=["trainer", "replica"], help=argparse.SUPPRESS)
    p.add_argument("--endpoint", help=argparse.SUPPRESS)
    p.add_argument("--serve", default="", help=argparse.SUPPRESS)
    p.add_argument("--max-direct", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--serve-max-direct", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.role is None:
        args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
        bad = [m for m in args.modes if m not in MODES]
        if bad or not args.modes:
            p.error(f"--modes: {bad or 'none'}; choose among {', '.join(MODES)}")
        if args.kill and "placed" not in args.modes:
            p.error("--kill needs placed in --modes")
    return args


def member_dict(m):
    return {"peer": m.peer, "held_step": m.held_step, "sent_step": m.sent_step,
            "receiving_step": m.receiving_step, "serves": m.serves, "below": m.below,
            "depth": m.depth, "via": m.via}


def tree_settled(pub, step, n, seconds):
    """Polls the trainer's own Publisher.tree() every millisecond until it lists n replicas all
    holding step (or seconds pass): when the trainer knew that every replica held the step."""
    until = time.time() + seconds
    while True:
        tree = pub.tree()
        now = time.time()
        if len(tree) == n and all(m.held_step >= step for m in tree):
            return {"settled": True, "settled_at": now,
                    "tree": [member_dict(m) for m in tree]}
        if now > until:
            return {"settled": False, "at": now, "tree": [member_dict(m) for m in tree]}
        time.sleep(0.001)


def trainer(args):
    """Serves the model on args.endpoint (at most args.max_direct subscribers directly when > 0);
    'publish STEP' draws new bytes (after step 1) and publishes, 'digest' answers the model's
    digest, 'members' the subscribers connected now (Publisher.members()), 'tree_settled STEP N
    SECONDS' when its Publisher.tree() listed N replicas all holding STEP."""
    import weightsync

    rng = np.random.default_rng(43)
    model = {n: rng.integers(0, 1 << 16, size=e, dtype=np.uint16)
             for n, e in model_shapes(args.mib).items()}
    with weightsync.Publisher(args.endpoint, token=TOKEN, timeout=SUBSCRIBER_TIMEOUT,
                              delta="off", max_direct=args.max_direct) as pub:
        pub.register(model, dtypes={n: "bfloat16" for n in model})
        send({"ready": True})
        for line in sys.stdin:
            cmd, *rest = line.split()
            if cmd == "digest":
                send({"digest": digest(model)})
                continue
            if cmd == "members":
                send({"members": [member_dict(m) for m in pub.members()], "at": time.time()})
                continue
            if cmd == "tree_settled":
                send(tree_settled(pub, int(rest[0]), int(rest[1]), float(rest[2])))
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
    """A Subscriber of args.endpoint (a relay serving on args.serve when given, with at most
    args.serve_max_direct children when > 0): 'update STEP' updates and reports when it returned
    (a failed update is reported as {"error", "step", "failed_at"} and the process lives on),
    'digest' answers the weights' digest, 'served' the relay's children connected now
    (Subscriber.served_members())."""
    import weightsync

    shapes = model_shapes(args.mib)
    dst = {n: np.zeros(e, dtype=np.uint16) for n, e in shapes.items()}
    sub = weightsync.Subscriber(args.endpoint, token=TOKEN, timeout=SUBSCRIBER_TIMEOUT,
                                serve_endpoint=args.serve, serve_max_direct=args.serve_max_direct)
    sub.register(dst, dtypes={n: "bfloat16" for n in shapes})
    # `ip netns exec` execs the interpreter: this pid is the one the orchestrator SIGKILLs (--kill).
    send({"ready": True, "serve_endpoint": sub.serve_endpoint, "pid": os.getpid()})
    for line in sys.stdin:
        cmd, *rest = line.split()
        if cmd == "digest":
            send({"digest": digest(dst)})
            continue
        if cmd == "served":
            send({"members": [member_dict(m) for m in sub.served_members()], "at": time.time()})
            continue
        step = int(rest[0])
        t0 = time.time()
        try:
            st = sub.update(step)
        except Exception as e:  # reported whole; the orchestrator decides (stops, or retries)
            send({"error": f"{type(e).__name__}: {e}", "step": step, "failed_at": time.time(),
                  "update_started_at": t0, "committed_step": sub.committed_step})
            continue
        send({"step": step, "committed_at": time.time(), "seconds": st.seconds,
              "wait_seconds": st.wait_seconds, "bytes": st.bytes,
              "received_bytes": st.received_bytes, "delta_base_step": st.delta_base_step,
              "delta_segments": st.delta_segments,
              "served_step": st.served_step, "serve_seconds": st.serve_seconds,
              "handle_created": st.handle_created, "prepare_count": st.prepare_count,
              "prepare_seconds": st.prepare_seconds, "update_started_at": t0,
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

    def __init__(self, ns, role, args, endpoint, serve="", max_direct=0, serve_max_direct=0):
        cmd = ["ip", "netns", "exec", ns, sys.executable, __file__, "--role", role,
               "--endpoint", endpoint, "--mib", str(args.mib)]
        if serve:
            cmd += ["--serve", serve]
        if max_direct:
            cmd += ["--max-direct", str(max_direct)]
        if serve_max_direct:
            cmd += ["--serve-max-direct", str(serve_max_direct)]
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
        return self._parse(line)

    def poll(self):
        """The next reply if one came, else None; an update's error is returned, not raised."""
        try:
            line = self.lines.get_nowait()
        except queue.Empty:
            return None
        return self._parse(line, allow_error=True)

    def _parse(self, line, allow_error=False):
        if line is None:
            raise RuntimeError(f"{self.name} exited ({self.p.wait()})")
        got = json.loads(line)
        if "error" in got and not allow_error:
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


TRAINER = -1  # the trainer, as a parent


def name(node):
    return "trainer" if node == TRAINER else f"r{node}"


def parent(i, fanout):
    """Replica i's parent in the breadth-first tree: None for the trainer."""
    return None if i < fanout else (i - fanout) // fanout


def depth(i, fanout):
    return 1 if parent(i, fanout) is None else 1 + depth(parent(i, fanout), fanout)


def bfs_parents(n, fanout):
    return [TRAINER if parent(i, fanout) is None else parent(i, fanout) for i in range(n)]


def depths_of(parents):
    """Each replica's depth (1: a child of the trainer) from its parent (TRAINER, a replica, or
    None: none, then its depth and its subtree's are None); raises on a cycle."""
    out = [None] * len(parents)
    for i in range(len(parents)):
        chain, j = [], i
        while j is not None and j != TRAINER and out[j] is None:
            if j in chain:
                raise RuntimeError(f"the member lists make a cycle through replica {j}")
            chain.append(j)
            j = parents[j]
        base = 0 if j == TRAINER else (None if j is None else out[j])
        for k in reversed(chain):
            base = None if base is None else base + 1
            out[k] = base
    return out


def store_and_forward_seconds(parents, one):
    """What store-and-forward predicts from one replica's transfer `one`: a level starts once its
    parents committed, and a parent sends its children's copies through its one NIC, so each
    level takes (the most children of a parent on the level above) x one."""
    d = depths_of(parents)
    kids = {}
    for p in parents:
        kids[p] = kids.get(p, 0) + 1
    total = 0.0
    for level in range(1, max(x for x in d if x is not None) + 1):
        above = [TRAINER] if level == 1 else [j for j in range(len(parents)) if d[j] == level - 1]
        total += max(kids.get(j, 0) for j in above) * one
    return total


def derive_tree(pub, subs, serve_eps, addrs, alive, fanout, deadline):
    """The tree as the trainer's members() and each live relay's served_members() list it, joined
    by MemberInfo.serves (the endpoint a relay announced: its serve_endpoint) and cross-checked
    with the member's peer address. `problems` names whatever breaks a tree of fan-out <= fanout
    over the live replicas (no parent, listed twice, a dead one listed, too many children)."""
    n = len(serve_eps)
    by_serve = {ep: i for i, ep in enumerate(serve_eps)}
    by_addr = {a: i for i, a in enumerate(addrs)}
    listed = {TRAINER: pub.ask("members", deadline)["members"]}
    for i in alive:
        listed[i] = subs[i].ask("served", deadline)["members"]
    problems, children, parents, listed_below = [], {}, [None] * n, [None] * n
    for node, members in listed.items():
        kids = []
        for m in members:
            i = by_serve.get(m["serves"])
            j = by_addr.get(m["peer"].rsplit(":", 1)[0])
            if i is None:
                problems.append(f"{name(node)} lists a member announcing no replica's serve "
                                f"endpoint: {m}")
                i = j
            elif j != i:
                problems.append(f"{name(node)} lists a member serving {m['serves']} (r{i}) that "
                                f"connects from {m['peer']} (r{j})")
            if i is None:
                continue
            kids.append(i)
            listed_below[i] = m["below"]
            if parents[i] is not None:
                problems.append(f"r{i} is listed under {name(parents[i])} and {name(node)}")
            parents[i] = node
        children[node] = kids
    for i in range(n):
        if i in alive and parents[i] is None:
            problems.append(f"r{i} has no parent (in no member list)")
        if i not in alive and parents[i] is not None:
            problems.append(f"r{i} (killed) is still listed under {name(parents[i])}")
    for node, kids in children.items():
        if len(kids) > fanout:
            problems.append(f"{name(node)} has {len(kids)} children, more than the fan-out "
                            f"{fanout}: {' '.join(name(k) for k in kids)}")
    try:
        d = depths_of(parents)
    except RuntimeError as e:
        problems.append(str(e))
        d = [None] * n
    return {"parents": parents, "depth_of": d, "below_as_listed": listed_below,
            "depth": max((x for x in d if x is not None), default=0),
            "children": {name(k): v for k, v in children.items()},
            "max_children": max(len(v) for v in children.values()),
            "members": {name(k): v for k, v in listed.items()}, "problems": problems}


def check_trainers_tree(settled, step, parents, serve_eps, mode):
    """The trainer's Publisher.tree() lists every replica holding `step`, each under the parent
    the replicas' own lists gave it (relays by their serve endpoint; direct: all at depth 1)."""
    if not settled["settled"]:
        raise RuntimeError(f"step {step}: the trainer's tree never listed every replica holding "
                           f"it: {json.dumps(settled['tree'])}")
    if mode == "direct":
        if any(m["depth"] != 1 for m in settled["tree"]):
            raise RuntimeError(f"direct: the trainer's tree has depths: {settled['tree']}")
        return
    by_serve = {ep: i for i, ep in enumerate(serve_eps)}
    for m in settled["tree"]:
        i = by_serve.get(m["serves"])
        want = parents[i] if i is not None else None
        got = TRAINER if m["via"] == "" else by_serve.get(m["via"])
        if i is None or got != want:
            raise RuntimeError(f"step {step}: the trainer's tree puts {m} under {name(got)}, the "
                               f"relays' lists under {name(want) if i is not None else '?'}")


def children_of(tree):
    return {TRAINER if k == "trainer" else int(k[1:]): v for k, v in tree["children"].items()}


def below(children, node):
    out, stack = [], list(children.get(node, []))
    while stack:
        j = stack.pop()
        out.append(j)
        stack += children.get(j, [])
    return sorted(out)


def tree_lines(tree):
    """The tree drawn one node a line, children indented under their parent, with each relay's
    `below` as its parent listed it."""
    children = children_of(tree)
    lines = []

    def walk(node, indent):
        kids = children.get(node, [])
        extra = "" if node == TRAINER else f"  (below={tree['below_as_listed'][node]})"
        lines.append(f"{'  ' * indent}{name(node)}{extra}")
        for k in kids:
            walk(k, indent + 1)

    walk(TRAINER, 0)
    return lines


def check_step(got, step, relays):
    for i, g in got.items():
        if g["step"] != step:
            raise RuntimeError(f"replica {i}: committed step {g['step']}, asked {step}")
        if relays and g["served_step"] != step:
            raise RuntimeError(f"replica {i} (relay): served_step {g['served_step']} after "
                               f"update({step}): {g['stats']}")


def check_digests(pub, subs, indices, step, deadline):
    want = pub.ask("digest", deadline)["digest"]
    for i in indices:
        have = subs[i].ask("digest", deadline)["digest"]
        if have != want:
            raise RuntimeError(f"replica {i}: step {step} digest {have}, trainer's {want}")


def step_record(step, published, got, tx0, tx1, depth_of):
    """One step's row from the trainer's publish and each replica's reply (got: index -> reply)."""
    at = published["published_at"]
    levels = {}
    for i, g in got.items():
        d = depth_of[i]
        levels[d] = max(levels.get(d, 0.0), g["committed_at"] - at)
    last = max(g["committed_at"] for g in got.values())
    return {
        "step": step, "publish_seconds": published["publish_seconds"],
        "all_hold_seconds": last - at,
        "all_hold_from_publish_start_seconds": last - published["publish_start"],
        "first_holds_seconds": min(g["committed_at"] for g in got.values()) - at,
        "level_seconds": [levels[d] for d in sorted(levels)],
        "trainer_egress_bytes": tx1 - tx0, "model_bytes": published["bytes"],
        "received_bytes": [g["received_bytes"] for g in got.values()],
        "delta_base_steps": [g["delta_base_step"] for g in got.values()],
        "delta_segments": [g["delta_segments"] for g in got.values()],
        "update_seconds": [g["seconds"] for g in got.values()],
        "serve_seconds": [g["serve_seconds"] for g in got.values()],
    }


def measure(net, args, n, mode, one=None, kill_after=None):
    """n replicas, direct, through the breadth-first relay tree, or placed by the trainer
    (max_direct); per step, when each held it. Returns (steps, extra): extra has the tree
    (parents, depth) and, placed with --kill, the kill step."""
    fanout = args.fanout
    trainer_ep = f"tcp://{TRAINER_ADDR}:{PORT}"
    deadline = time.monotonic() + args.step_timeout
    procs = []
    ok = False
    try:
        pub = Proc(net.trainer, "trainer", args, trainer_ep,
                   max_direct=fanout if mode == "placed" else 0)
        procs.append(pub)
        assert pub.reply(deadline).get("ready")
        subs = []
        addrs = [net.replica_addr(i) for i in range(n)]
        serve_eps = ["" if mode == "direct" else f"tcp://{addrs[i]}:{PORT}" for i in range(n)]
        for i in range(n):
            endpoint = trainer_ep
            if mode == "tree" and parent(i, fanout) is not None:
                endpoint = f"tcp://{addrs[parent(i, fanout)]}:{PORT}"
            subs.append(Proc(net.replicas[i], "replica", args, endpoint, serve_eps[i],
                             serve_max_direct=fanout if mode == "placed" else 0))
        procs += subs
        ready = [s.reply(deadline) for s in subs]
        assert all(r.get("ready") for r in ready)
        pids = [r["pid"] for r in ready]
        for i, r in enumerate(ready):
            if mode != "direct" and r["serve_endpoint"] != serve_eps[i]:
                raise RuntimeError(f"replica {i} serves on {r['serve_endpoint']}, "
                                   f"not {serve_eps[i]}")
        extra = {}
        if mode == "direct":
            parents = [TRAINER] * n
        elif mode == "tree":
            parents = bfs_parents(n, fanout)
        depth_of = None if mode == "placed" else depths_of(parents)
        steps = []
        for step in range(1, args.steps + 2):
            deadline = time.monotonic() + args.step_timeout
            tx0 = net.trainer_tx_bytes()
            if mode == "placed" and step == 1:
                # Joining one at a time, in index order: each Hello reaches the trainer once the
                # replicas before it are members (relays announced), so the trainer places it.
                published = pub.ask(f"publish {step}", deadline)
                got = {i: s.ask(f"update {step}", deadline) for i, s in enumerate(subs)}
                tree = derive_tree(pub, subs, serve_eps, addrs, range(n), fanout, deadline)
                tree["join_seconds"] = [got[i]["seconds"] for i in range(n)]
                extra["tree"] = tree
                print(f"placed, {n} replicas, after joining one at a time at step 1 (parent by "
                      f"the trainer's members() and each relay's served_members(), joined by "
                      f"MemberInfo.serves):", flush=True)
                for line in tree_lines(tree):
                    print(f"            {line}", flush=True)
                if tree["problems"]:
                    for p in tree["problems"]:
                        print(f"  PLACEMENT PROBLEM: {p}", flush=True)
                    print(json.dumps(tree["members"], indent=1), flush=True)
                    raise RuntimeError(f"placed, {n} replicas: the trainer did not build a tree "
                                       f"of fan-out <= {fanout}: {'; '.join(tree['problems'])}")
                parents = tree["parents"]
                depth_of = tree["depth_of"]
            else:
                for s in subs:
                    s.tell(f"update {step}")
                time.sleep(0.3)  # every replica waiting in update(step) before the publish
                published = pub.ask(f"publish {step}", deadline)
                got = {i: s.reply(deadline) for i, s in enumerate(subs)}
            tx1 = net.trainer_tx_bytes()
            check_step(got, step, relays=mode != "direct")
            settled = pub.ask(f"tree_settled {step} {n} 10", deadline)
            check_trainers_tree(settled, step, parents, serve_eps, mode)
            check_digests(pub, subs, range(n), step, deadline)
            steps.append(step_record(step, published, got, tx0, tx1, depth_of))
            last = max(g["committed_at"] for g in got.values())
            steps[-1]["tree_settled_after_all_hold_seconds"] = settled["settled_at"] - last
        extra["parents"] = parents
        extra["depth"] = max(depth_of)
        if mode == "placed" and args.kill:
            median = statistics.median(s["all_hold_seconds"] for s in steps[1:])
            extra["kill"] = kill_step(net, args, pub, subs, pids, serve_eps, addrs, extra["tree"],
                                      args.steps + 2, one, kill_after, median)
        ok = True
        return steps, extra
    finally:
        for proc in reversed(procs):
            proc.stop(timeout=30 if ok else 0)  # after a failure: killed at once


def kill_step(net, args, pub, subs, pids, serve_eps, addrs, tree, step, one, kill_after, median):
    """One more step: every replica waits in update(step), the trainer publishes, and
    kill_after seconds after the end of publish() the level-1 relay with the most replicas below
    it is SIGKILLed. A replica whose update fails (an orphan) is told 'update STEP' again at once:
    it dials the trainer's endpoint again and is placed anew."""
    n = len(subs)
    fanout = args.fanout
    children = children_of(tree)
    level1 = [i for i in children[TRAINER] if children.get(i)]
    if not level1:
        raise RuntimeError(f"--kill: no level-1 relay has children: {tree['children']}")
    victim = max(level1, key=lambda i: (len(below(children, i)), -i))
    subtree = below(children, victim)
    alive = [i for i in range(n) if i != victim]
    others = [i for i in alive if i not in subtree]
    deadline = time.monotonic() + args.step_timeout
    tx0 = net.trainer_tx_bytes()
    for s in subs:
        s.tell(f"update {step}")
    time.sleep(0.3)
    published = pub.ask(f"publish {step}", deadline)
    at = published["published_at"]
    time.sleep(max(0.0, at + kill_after - 0.05 - time.time()))
    before = pub.ask("members", deadline)  # what the trainer sends whom just before the kill
    time.sleep(max(0.0, at + kill_after - time.time()))
    if subs[victim].p.pid != pids[victim]:
        raise RuntimeError(f"r{victim}: `ip netns exec` pid {subs[victim].p.pid} is not the "
                           f"replica's {pids[victim]}")
    t_kill = time.time()
    os.kill(pids[victim], signal.SIGKILL)
    subs[victim].p.wait(timeout=10)
    print(f"  kill step {step}: SIGKILLed r{victim} (pid {pids[victim]}) {t_kill - at:.3f} s "
          f"after the publish; waiting for the {len(alive)} others", flush=True)
    pending, done, errors, retold = set(alive), {}, {}, {}
    while pending:
        for i in sorted(pending):
            g = subs[i].poll()
            if g is None:
                continue
            if "error" in g:
                errors.setdefault(i, []).append(g)
                print(f"  kill step {step}: r{i} update failed {g['failed_at'] - t_kill:.3f} s "
                      f"after the kill: {g['error']}; told 'update {step}' again", flush=True)
                if len(errors[i]) > 5:
                    raise RuntimeError(f"r{i}: update({step}) failed {len(errors[i])} times: "
                                       f"{errors[i]}")
                subs[i].tell(f"update {step}")
                retold.setdefault(i, []).append(time.time())
            else:
                done[i] = g
                pending.discard(i)
        if pending and time.monotonic() > deadline:
            raise TimeoutError(
                f"kill step {step}: {' '.join(name(i) for i in sorted(pending))} hold no step "
                f"{step} {time.time() - t_kill:.1f} s after the kill of r{victim}; held: "
                f"{ {name(i): round(g['committed_at'] - t_kill, 3) for i, g in done.items()} }; "
                f"failures: {errors}")
        time.sleep(0.002)
    tx1 = net.trainer_tx_bytes()
    check_step(done, step, relays=True)
    check_digests(pub, subs, alive, step, deadline)
    after = derive_tree(pub, subs, serve_eps, addrs, alive, fanout, deadline)
    # Orphans: the killed relay's children. Each either saw its update fail (then was told again)
    # or re-attached within the same update (the subscriber prepares again once when its source
    # went away before the step began: UpdateStats.handle_created, prepare_count).
    orphans = sorted(children.get(victim, []))
    failed = sorted(i for i in errors if i in subtree)
    unexpected = sorted(i for i in errors if i not in subtree)
    last = lambda idx: max(done[i]["committed_at"] for i in idx) if idx else None
    timeout = SUBSCRIBER_TIMEOUT
    out = {
        "step": step, "victim": victim, "victim_pid": pids[victim],
        "victim_subtree": subtree, "others": others,
        "kill_after_seconds": kill_after, "killed_after_publish_seconds": t_kill - at,
        "members_just_before_kill": before["members"],
        "measured_median_all_hold_seconds": median,
        "others_all_hold_seconds": last(others) - at if others else None,
        "orphans": orphans, "failed_in_subtree": failed, "unexpected_failures": unexpected,
        "orphan_update_failed": {name(i): i in errors for i in orphans},
        "reprepared_in_update": {name(i): done[i]["handle_created"] for i in alive},
        "prepare_count": {name(i): done[i]["prepare_count"] for i in alive},
        "told_again_after_kill_seconds": {name(i): [t - t_kill for t in ts]
                                          for i, ts in retold.items()},
        "errors": {name(i): e for i, e in errors.items()},
        "orphan_failed_after_kill_seconds": {name(i): errors[i][0]["failed_at"] - t_kill
                                             for i in orphans if i in errors},
        "orphans_all_hold_after_kill_seconds": last(orphans) - t_kill if orphans else None,
        "subtree_all_hold_after_kill_seconds": last(subtree) - t_kill if subtree else None,
        "subscriber_timeout_seconds": timeout, "one_transfer_seconds": one,
        "orphan_bound_seconds": timeout + one,
        "all_hold_seconds": last(alive) - at,
        "trainer_egress_bytes": tx1 - tx0, "model_bytes": published["bytes"],
        "committed_after_kill_seconds": {name(i): done[i]["committed_at"] - t_kill for i in alive},
        "update_seconds": {name(i): done[i]["seconds"] for i in alive},
        "received_bytes": {name(i): done[i]["received_bytes"] for i in alive},
        "survivors_digest_match": True,  # check_digests raised otherwise
        "tree_after": after,
    }
    out["others_over_median"] = (out["others_all_hold_seconds"] / median
                                 if others else None)
    out["others_target_met"] = others and out["others_over_median"] <= 1.10
    if orphans:
        out["orphans_all_hold_transfers"] = out["orphans_all_hold_after_kill_seconds"] / one
        out["orphan_bound_met"] = out["orphans_all_hold_after_kill_seconds"] <= timeout + one
    if subtree:
        out["subtree_all_hold_transfers"] = out["subtree_all_hold_after_kill_seconds"] / one
    return out


def summarize(n, mode, fanout, steps, d):
    measured = steps[1:]
    med = lambda key: statistics.median(s[key] for s in measured)
    model = measured[0]["model_bytes"]
    return {
        "replicas": n, "mode": mode, "fanout": n if mode == "direct" else fanout,
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
        # When the trainer's Publisher.tree() listed every replica holding the step, after the
        # last replica's update returned (reports climb the tree between updates).
        "tree_settled_after_all_hold_seconds": med("tree_settled_after_all_hold_seconds"),
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
        steps, _ = measure(net, args, 1, "direct")
        alone = summarize(1, "direct", None, steps, 1)
        one = alone["all_hold_seconds"]
        bucket = one * (TENSOR_MIB << 20) / alone["model_bytes"]
        kill_after = args.kill_after if args.kill_after is not None else one / 2
        print(f"one replica alone: {one:.3f} s for {alone['model_bytes'] >> 20} MiB "
              f"(one 8 MiB bucket: {bucket:.3f} s)"
              + (f"; --kill after {kill_after:.3f} s" if args.kill else ""), flush=True)
        for n in counts:
            got = {}
            for mode in args.modes:
                steps, extra = measure(net, args, n, mode, one=one, kill_after=kill_after)
                got[mode] = summarize(n, mode, args.fanout, steps, extra["depth"])
                if mode != "direct":
                    got[mode]["parents"] = extra["parents"]
                for key in ("tree", "kill"):
                    if key in extra:
                        got[mode][key] = extra[key]
            model = next(iter(got.values()))["model_bytes"]
            sim = fanout_sim(n, model, args.rate, store_and_forward=True)
            cut = fanout_sim(n, model, args.rate, store_and_forward=False)
            direct = got.get("direct")
            # A tree of fan-out 1 is fanout-sim's chain.
            relayed = ("chain", 1) if args.fanout == 1 else ("tree", args.fanout)
            for r in got.values():
                r["predicted_seconds"] = (sim.get(("direct", n)) if r["mode"] == "direct"
                                          else cut.get(relayed))
                if r["mode"] == "direct":
                    continue
                r["store_and_forward_predicted_seconds"] = sim.get(relayed)
                r["direct_over_tree"] = (direct["all_hold_seconds"] / r["all_hold_seconds"]
                                         if direct else None)
                r["egress_target_models"] = args.fanout
                # On the wire a model's copy is the direct run's egress / n (payload + TCP/IP
                # headers); without a direct run, the model's bytes.
                wire = direct["trainer_egress_bytes"] / n if direct else r["model_bytes"]
                r["trainer_egress_wire_copies"] = r["trainer_egress_bytes"] / wire
                r["egress_target_met"] = r["trainer_egress_wire_copies"] <= args.fanout + 0.01
                r["time_bound_seconds"] = 1.5 * one + r["depth"] * bucket
                r["time_bound_met"] = r["all_hold_seconds"] <= r["time_bound_seconds"]
                r["store_and_forward_estimate_seconds"] = store_and_forward_seconds(
                    r["parents"], one)
                r["fanout_sim"] = sim.get("text")
            rows += list(got.values())
            print_rows(list(got.values()), args)
    return alone, rows


def print_rows(rows, args):
    def label(r):
        return "direct" if r["mode"] == "direct" else \
            f"{r['mode']} fanout {r['fanout']} depth {r['depth']}"

    def line(r):
        ratio = "" if r.get("direct_over_tree") is None else f"{r['direct_over_tree']:.2f}x"
        pred = f"{r['predicted_seconds']:8.3f} s" if r["predicted_seconds"] is not None else "       -  "
        each = "/".join(f"{x:.2f}" for x in r["all_hold_seconds_each"])
        print(f"{r['replicas']:8d}  {label(r):24s} {r['all_hold_seconds']:8.3f} s ({each})  "
              f"{r['trainer_egress_bytes'] / 2**20:9.1f} MiB {r['trainer_egress_models']:6.2f}x  "
              f"{ratio:>7s}  {pred}  {'whole' if r['whole_transfers'] else 'DELTAS'}", flush=True)

    print(f"{'replicas':>8s}  {'mode':24s} {'until all hold the step':31s}  "
          f"{'trainer egress':>21s}  {'direct/':>7s}  {'fanout-sim':>10s}  transfers", flush=True)
    for r in rows:
        line(r)
    for r in rows:
        print(f"          {label(r)}: the trainer's Publisher.tree() listed all {r['replicas']} "
              f"holding the step {r['tree_settled_after_all_hold_seconds'] * 1e3:.1f} ms (median) "
              f"after the last replica's update returned, each under the parent the relays' own "
              f"lists give it", flush=True)
    for r in rows:
        if r["mode"] == "direct":
            continue
        m = r["mode"]
        levels = ", ".join(f"{x:.2f}" for x in r["level_seconds"])
        print(f"          {m}: level 1..{r['depth']} all hold the step at {levels} s; store and "
              f"forward predicts {r['store_and_forward_estimate_seconds']:.2f} s (per level, a "
              f"parent's children x one transfer: it sends their copies through its one NIC after "
              f"it committed); relay serve_seconds median {r['serve_seconds_median']:.3f} s; "
              f"fanout-sim's store-and-forward model (relays before cut-through) "
              f"{r['store_and_forward_predicted_seconds'] or float('nan'):.3f} s",
              flush=True)
        copies = ("" if r.get("direct_over_tree") is None else
                  f", {r['trainer_egress_wire_copies']:.3f} copies as the direct run's wire bytes "
                  f"per copy count headers")
        print(f"          {m} targets: trainer egress <= {args.fanout} x model: "
              f"{'met' if r['egress_target_met'] else 'NOT met'} "
              f"({r['trainer_egress_models']:.3f}x the model's bytes{copies}); until all <= 1.5 x "
              f"one transfer + depth x one bucket = {r['time_bound_seconds']:.2f} s: "
              f"{'met' if r['time_bound_met'] else 'NOT met'} ({r['all_hold_seconds']:.2f} s)",
              flush=True)
        if m == "placed":
            t = r["tree"]
            parents = " ".join(f"r{i}<{name(p)}" for i, p in enumerate(t["parents"]))
            joins = " ".join(f"{x:.2f}" for x in t["join_seconds"])
            print(f"          placed tree (parent of each, from members()/served_members()): "
                  f"{parents}; depth {t['depth']}, at most {t['max_children']} children a node "
                  f"(trainer {len(t['children']['trainer'])}); joins at step 1 took {joins} s",
                  flush=True)
        if "kill" in r:
            print_kill(r["kill"], args)


def print_kill(k, args):
    subtree = " ".join(name(i) for i in k["victim_subtree"]) or "none"
    print(f"          kill (step {k['step']}): r{k['victim']} (a level-1 relay; below it: "
          f"{subtree}) SIGKILLed {k['killed_after_publish_seconds']:.3f} s after the publish "
          f"(--kill-after {k['kill_after_seconds']:.3f} s); all "
          f"{len(k['committed_after_kill_seconds'])} survivors hold the step "
          f"{k['all_hold_seconds']:.2f} s after the publish, their bytes match the trainer's "
          f"digest; trainer egress {k['trainer_egress_bytes'] / 2**20:.1f} MiB "
          f"({k['trainer_egress_bytes'] / k['model_bytes']:.2f}x)", flush=True)
    if k["others"]:
        print(f"          kill: outside its subtree ({' '.join(name(i) for i in k['others'])}): "
              f"all hold the step {k['others_all_hold_seconds']:.2f} s after the publish = "
              f"{k['others_over_median']:.3f}x the measured steps' median "
              f"{k['measured_median_all_hold_seconds']:.2f} s (target <= 1.10x: "
              f"{'met' if k['others_target_met'] else 'NOT met'})", flush=True)
    if k["orphans"]:
        how = ", ".join(
            f"{o}: " + (f"update failed {k['orphan_failed_after_kill_seconds'][o]:.3f} s after the "
                        f"kill, told 'update {k['step']}' again at once"
                        if k["orphan_update_failed"][o] else
                        "no error: re-attached within the same update (prepared again: "
                        f"handle_created={k['reprepared_in_update'][o]}, "
                        f"prepare_count={k['prepare_count'][o]})")
            for o in (name(i) for i in k["orphans"]))
        print(f"          kill: orphans (its children): {how}", flush=True)
        print(f"          kill: orphans hold the step "
              f"{k['orphans_all_hold_after_kill_seconds']:.2f} s after the kill = "
              f"{k['orphans_all_hold_transfers']:.2f} transfers of one replica alone "
              f"({k['one_transfer_seconds']:.3f} s); bound one deadline "
              f"({k['subscriber_timeout_seconds']} s) + one transfer = "
              f"{k['orphan_bound_seconds']:.2f} s: "
              f"{'met' if k['orphan_bound_met'] else 'NOT met'}; the whole subtree holds it "
              f"{k['subtree_all_hold_after_kill_seconds']:.2f} s after the kill = "
              f"{k['subtree_all_hold_transfers']:.2f} transfers", flush=True)
    else:
        print("          kill: the killed relay had no children", flush=True)
    if k["unexpected_failures"]:
        print(f"          kill: UNEXPECTED failures outside the subtree: "
              f"{' '.join(name(i) for i in k['unexpected_failures'])}: {k['errors']}", flush=True)
    errs = sorted({e["error"] for es in k["errors"].values() for e in es})
    print(f"          kill: update errors reported: {errs or 'none'}", flush=True)
    after = k["tree_after"]
    parents = " ".join(f"r{i}<{name(p)}" for i, p in enumerate(after["parents"])
                       if i != k["victim"])
    print(f"          kill: tree after re-attachment: {parents}; depth {after['depth']}, at most "
          f"{after['max_children']} children a node", flush=True)
    for line in tree_lines(after):
        print(f"            {line}", flush=True)
    for p in after["problems"]:
        print(f"          kill: TREE PROBLEM after re-attachment: {p}", flush=True)


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
          f"{args.replicas}, modes {','.join(args.modes)}, fan-out {args.fanout}, steps "
          f"2..{args.steps + 1} (median){', then the kill step' if args.kill else ''}, "
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
