"""A chain of GPU engines fed by relays of CUDA destinations (docs/relays.md, "Relays of CUDA
destinations") on one GPU, against one engine fed by the trainer, in the same run.

    python3 bench/relay_gpu_chain.py --build build-gpu [--engines 4] [--tensors 24]
        [--elements 4194304] [--steps 6] [--json out.json] [--host]

Drives the test helpers (tests/helpers): ws_gpu_publisher is the trainer (CUDA tensors on cuda:0,
a GPU store, digests computed on its GPU); ws_subscriber with WS_TEST_DEVICE=0 is an engine (CUDA
destinations on cuda:0, staged, verify on). The model is the tests' synthetic one (--tensors
tensors of --elements elements, dtypes cycling).

  one    one engine subscribed to the trainer: the baseline.
  chain  --engines engines, each but the last a relay on local://, each subscribed to the one
         before it.

Per step the trainer publishes, then every engine is told `update S` at once (a child waits for
its parent to serve S); each engine's reply time, from the end of the publish, says when it held
S (after its copy from its parent, the GPU digest check, the commit, and for a relay the
device-to-device copy into its store); the last is the time until all hold S. Rows are medians over
steps 2..; step 1 prepares every handle and is not counted. Every engine holds every step
bit-exact (checked at the last step by downloading its tensors). The trainer's members at the end
say what it serves: 1 in both modes, so its cost is one subscriber's whatever the chain's length.

--host runs the same with host memory everywhere (ws_publisher, engines without a device: relays
over shm), e.g. to try the script on a machine without a GPU.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time


class Helper:
    """A helper process driven over its command loop (tests/testing/command_loop.h)."""

    def __init__(self, argv, env=None):
        full_env = dict(os.environ)
        full_env.update(env or {})
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, env=full_env, bufsize=1)

    def send(self, line):
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def read(self):
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("helper %s ended" % self.proc.args[0])
        return line.strip()

    def command(self, line):
        self.send(line)
        return self.read()

    def quit(self):
        try:
            self.command("quit")
        except (RuntimeError, BrokenPipeError):
            pass
        self.proc.wait(timeout=30)


def endpoint(name):
    return "local://ws-bench-%s-%d" % (name, os.getpid())


def run(args, engines):
    tests = os.path.join(args.build, "tests")
    model = [str(args.tensors), str(args.elements)]
    if args.host:
        trainer = Helper([os.path.join(tests, "ws_publisher"), endpoint("trainer")] + model)
    else:
        trainer = Helper([os.path.join(tests, "ws_gpu_publisher"), endpoint("trainer")] + model +
                         ["0"])
    ready = trainer.read()
    if not ready.startswith("ready "):
        raise RuntimeError("trainer: " + ready)
    upstream = ready.split(" ", 1)[1]
    chain = []
    try:
        for i in range(engines):
            env = {} if args.host else {"WS_TEST_DEVICE": "0"}
            serve = endpoint("relay%d-of-%d" % (i, engines)) if i + 1 < engines else ""
            if serve:
                env["WS_TEST_SERVE"] = serve
            chain.append(Helper([os.path.join(tests, "ws_subscriber"), upstream] + model +
                                ["30000"], env))
            ready = chain[-1].read()
            if ready != ("ready " + serve).strip():
                raise RuntimeError("engine %d: %s" % (i, ready))
            upstream = serve
        until_all, held_at = [], [[] for _ in chain]
        for step in range(1, args.steps + 1):
            reply = trainer.command("publish %d" % step)
            if reply != "ok %d" % step:
                raise RuntimeError("publish: " + reply)
            published = time.perf_counter()
            for e in chain:
                e.send("update %d" % step)
            for i, e in enumerate(chain):  # in chain order: each holds S after its parent
                reply = e.read()
                if not reply.startswith("ok %d " % step):
                    raise RuntimeError("engine %d, step %d: %s" % (i, step, reply))
                if step > 1:
                    held_at[i].append((time.perf_counter() - published) * 1e3)
            if step > 1:
                until_all.append(held_at[-1][-1])
        for i, e in enumerate(chain):
            held = e.command("holds %d" % args.steps)
            if held != "yes":
                raise RuntimeError("engine %d does not hold step %d: %s" % (i, args.steps, held))
        members = int(trainer.command("members"))
        return {
            "engines": engines,
            "until_all_ms": statistics.median(until_all),
            "held_at_ms": [statistics.median(h) for h in held_at],
            "trainer_members": members,
        }
    finally:
        for e in chain:
            e.quit()
        trainer.quit()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build", default="build-gpu")
    p.add_argument("--engines", type=int, default=4)
    p.add_argument("--tensors", type=int, default=24)
    p.add_argument("--elements", type=int, default=4 << 20)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--json")
    p.add_argument("--host", action="store_true", help="host memory everywhere (no GPU)")
    args = p.parse_args()
    if args.steps < 2 or args.engines < 2:
        p.error("--steps and --engines must be at least 2")
    one = run(args, 1)
    chain = run(args, args.engines)
    rows = [("one engine", one), ("chain of %d" % args.engines, chain)]
    print("%-14s %14s %s" % ("", "until all (ms)", "each engine holds it at (ms)"))
    for name, r in rows:
        print("%-14s %14.2f %s" % (name, r["until_all_ms"],
                                   " ".join("%.2f" % m for m in r["held_at_ms"])))
    ratio = chain["until_all_ms"] / one["until_all_ms"]
    print("chain / one engine: %.2fx for %d engines (store and forward: about one update per hop)"
          % (ratio, args.engines))
    print("trainer members: one engine %d, chain %d (its cost: one subscriber's)"
          % (one["trainer_members"], chain["trainer_members"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"one": one, "chain": chain, "ratio": ratio, "args": vars(args)}, f, indent=1)
    if one["trainer_members"] != 1 or chain["trainer_members"] != 1:
        sys.exit("the trainer serves more than one subscriber")


if __name__ == "__main__":
    main()
