#!/usr/bin/env python3
"""Three strata-server replicas on loopback behind the shipped deploy/haproxy.cfg (Debian's haproxy):
(d) every replica's /metrics passes `promtool check metrics`; (a) 20 conversations taking turns in
alternation each come back to the replica that holds them, and cache_n covers their history on every
returning turn; (b) one replica drained (POST /admin/drain) while it streams: no request fails, the
drained replica exits 0, and every answer equals a fresh greedy evaluation on another replica; (c) one
replica killed with SIGKILL: requests not yet started are retried elsewhere, streams in flight end
without [DONE], nothing hangs. And the Kubernetes manifests (deploy/k8s), offline: `kubectl
kustomize` renders them, their fields are checked against the server's flags, and the ConfigMap's
HAProxy configuration passes `haproxy -c`. (`kubectl apply --dry-run=client` needs an API server for
discovery, even with --validate=false, so it cannot run here.) Prints the figures docs/DEPLOY.md quotes.

Exit 77 (ctest: skipped) when haproxy, promtool, kubectl or python3-yaml is missing."""
import argparse
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

ADMIN_KEY = "deploy-admin-key"
CONVERSATIONS = 20
ARGS = None


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Replica:
    """strata-server on a free port; its log is kept for failure messages."""

    def __init__(self, name, model, log_dir):
        self.name = name
        self.log_path = os.path.join(log_dir, name + ".log")
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [ARGS.server, "-m", model, "--port", "0", "--ctx", "8192", "--numa-pool", "off", "--pool-workers", "1",
             "--cache-ram", "256", "--temp", "0", "--admin-key", ADMIN_KEY, "--drain-timeout", "30", "--no-webui",
             # One slot, so that the kill test (c) has requests waiting, not started, behind a running one.
             "--parallel", "1"],
            stdout=self.log, stderr=subprocess.STDOUT)
        self.port = None

    def text(self):
        with open(self.log_path) as f:
            return f.read()

    def wait_ready(self, timeout=60):
        until = time.time() + timeout
        while time.time() < until:
            m = re.search(r"Listening on http://127\.0\.0\.1:(\d+)", self.text())
            if m:
                self.port = int(m.group(1))
                status, _, _ = request("127.0.0.1", self.port, "GET", "/health/ready")
                if status == 200:
                    return
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(f"{self.name} not ready in {timeout} s:\n{self.text()}")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def request(host, port, method, path, body=None, headers=None, timeout=60):
    """(status, headers dict lower-cased, body text); status 0 when no answer came."""
    c = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        c.request(method, path, body=json.dumps(body) if body is not None else None,
                  headers={"Content-Type": "application/json", **(headers or {})})
        r = c.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read().decode()
    except (OSError, http.client.HTTPException):
        return 0, {}, ""
    finally:
        c.close()


def stream(host, port, body, headers=None, on_first=None, timeout=60):
    """A streamed chat completion: (status, replica, payloads, error). payloads: the data: lines in
    order; error: why the stream broke off (None when it ended with [DONE])."""
    c = http.client.HTTPConnection(host, port, timeout=timeout)
    payloads = []
    try:
        c.request("POST", "/v1/chat/completions", body=json.dumps({**body, "stream": True}),
                  headers={"Content-Type": "application/json", **(headers or {})})
        r = c.getresponse()
        replica = r.getheader("X-Strata-Replica")
        if r.status != 200:
            return r.status, replica, [r.read().decode()], "status"
        while True:
            line = r.readline()
            if not line:
                break
            line = line.decode().strip()
            if line.startswith("data: "):
                payloads.append(line[6:])
                if len(payloads) == 2 and on_first:
                    on_first()
                if payloads[-1] == "[DONE]":
                    return 200, replica, payloads, None
        return 200, replica, payloads, "cut"
    except (OSError, http.client.HTTPException) as e:
        return 200 if payloads else 0, None, payloads, type(e).__name__
    finally:
        c.close()


def stream_text(payloads):
    out = ""
    for p in payloads:
        if p == "[DONE]":
            continue
        for ch in json.loads(p).get("choices", []):
            out += ch.get("delta", {}).get("content") or ""
    return out


class Conversation:
    """A chat that identifies itself by header or by body (prompt_cache_key), alternating."""

    def __init__(self, i):
        self.key = f"conversation-{i:02d}"
        self.by_header = i % 2 == 0
        self.messages = [{"role": "system", "content": f"You are assistant number {i}. " + "Answer briefly. " * 12}]
        self.replicas = []
        self.history_tokens = 0  # the last prompt's tokens
        self.turns = []  # (messages sent, max_tokens, answer)

    def body(self, text, max_tokens=8):
        msgs = self.messages + [{"role": "user", "content": text}]
        b = {"messages": msgs, "max_tokens": max_tokens, "temperature": 0}
        if not self.by_header:
            b["prompt_cache_key"] = self.key
        return b

    def headers(self):
        return {"X-Conversation-Id": self.key} if self.by_header else {}

    def record(self, body, answer, replica):
        self.turns.append((body["messages"], body["max_tokens"], answer))
        self.messages = body["messages"] + [{"role": "assistant", "content": answer}]
        self.replicas.append(replica)


class Deployment:
    def __init__(self, tmp):
        self.tmp = tmp
        self.model = os.path.join(tmp, "tiny.gguf")
        subprocess.run([ARGS.make_model, "--preset", "tiny", "-o", self.model], check=True, stdout=subprocess.DEVNULL)
        self.replicas = [Replica(f"replica{i}", self.model, tmp) for i in (1, 2, 3)]
        for r in self.replicas:
            r.wait_ready()
        self.lb_port = free_port()
        env = dict(os.environ, STRATA_LB_BIND=f"127.0.0.1:{self.lb_port}")
        for i, r in enumerate(self.replicas, 1):
            env[f"STRATA_REPLICA{i}"] = f"127.0.0.1:{r.port}"
        self.haproxy_log = open(os.path.join(tmp, "haproxy.log"), "w")
        self.haproxy = subprocess.Popen(["haproxy", "-db", "-f", ARGS.config], env=env, stdout=self.haproxy_log,
                                        stderr=subprocess.STDOUT)
        until = time.time() + 20
        while request("127.0.0.1", self.lb_port, "GET", "/health/ready")[0] != 200:
            assert time.time() < until and self.haproxy.poll() is None, "haproxy did not come up"
            time.sleep(0.05)

    def by_name(self, name):
        return next(r for r in self.replicas if r.name == name)

    def chat(self, conv, sent):
        status, headers, body = request("127.0.0.1", self.lb_port, "POST", "/v1/chat/completions", sent,
                                        conv.headers())
        return status, headers.get("x-strata-replica"), (json.loads(body) if status == 200 else body)

    def close(self):
        self.haproxy.terminate()
        self.haproxy.wait(10)
        self.haproxy_log.close()
        for r in self.replicas:
            r.stop()


def check(cond, message):
    if not cond:
        raise AssertionError(message)


def test_metrics(d):
    for r in d.replicas:
        status, _, text = request("127.0.0.1", r.port, "GET", "/metrics")
        check(status == 200, f"{r.name} /metrics answered {status}")
        for family in ("strata_queue_waiting", "strata_queue_running", "strata_ready", "strata_draining",
                       "strata_prompt_cache_hit_ratio", "strata_decode_tokens_per_second", "strata_requests_in_flight"):
            check(f"\n{family} " in text, f"{r.name} /metrics has no {family}")
        p = subprocess.run(["promtool", "check", "metrics"], input=text, text=True, capture_output=True)
        check(p.returncode == 0, f"promtool check metrics on {r.name}: {p.stdout}{p.stderr}")
    print(f"deploy: (d) promtool check metrics passed on {len(d.replicas)} replicas")


def test_affinity(d, convs):
    returning = hits = 0
    for turn in range(3):
        for c in convs:
            text = f"Turn {turn}: tell me about the number {turn * 7 + len(c.key)}."
            sent = c.body(text)
            status, replica, body = d.chat(c, sent)
            check(status == 200, f"{c.key} turn {turn}: {status} {body}")
            if c.replicas:
                returning += 1
                prompt = body["usage"]["prompt_tokens"]
                cached = body["timings"]["cache_n"]
                history = c.history_tokens
                if replica == c.replicas[0] and cached >= history:
                    hits += 1
                else:
                    print(f"deploy: {c.key} turn {turn}: replica {replica} (first {c.replicas[0]}), cache_n {cached} "
                          f"of a history of {history} ({prompt} prompt tokens)")
            c.history_tokens = body["usage"]["prompt_tokens"]
            c.record(sent, body["choices"][0]["message"]["content"], replica)
    spread = {r: sum(1 for c in convs if c.replicas[0] == r) for r in sorted({c.replicas[0] for c in convs})}
    print(f"deploy: (a) affinity: {hits} of {returning} returning turns came back to their replica with cache_n "
          f"covering their history ({100.0 * hits / returning:.1f} %); conversations per replica: {spread}")
    check(len(spread) == 3, f"the 20 conversations used only {spread}")
    check(hits == returning, f"{returning - hits} returning turns missed their replica or its cache")


def test_drain(d, convs):
    victim = d.by_name(convs[0].replicas[0])
    on_victim = [c for c in convs if c.replicas[0] == victim.name]
    results, lock = [], threading.Lock()
    streams_started = threading.Event()
    started = [0]

    def first_token():
        with lock:
            started[0] += 1
            if started[0] >= 2:
                streams_started.set()

    def run(c, turn, streamed):
        text = f"Drain turn {turn}: and the number {turn + len(c.key)}?"
        sent = c.body(text, 160 if streamed else 16)
        if streamed:
            status, replica, payloads, error = stream("127.0.0.1", d.lb_port, sent, c.headers(), on_first=first_token)
            answer = stream_text(payloads) if error is None else None
        else:
            status, replica, body = d.chat(c, sent)
            error = None if status == 200 else body
            answer = body["choices"][0]["message"]["content"] if status == 200 else None
        with lock:
            results.append((c, text, status, replica, error, answer))
        if status == 200 and error is None:
            c.record(sent, answer, replica)

    # Streams on the victim, then the drain while they run, then more turns of every conversation.
    threads = [threading.Thread(target=run, args=(c, 0, True)) for c in on_victim[:3]]
    for t in threads:
        t.start()
    check(streams_started.wait(30), "the streams on the replica to drain did not start")
    t0 = time.time()
    status, _, body = request("127.0.0.1", victim.port, "POST", "/admin/drain",
                              headers={"Authorization": "Bearer " + ADMIN_KEY})
    check(status == 202, f"POST /admin/drain answered {status}: {body}")
    running_at_drain = json.loads(body)["in_flight"]
    exited_at = []
    watcher = threading.Thread(target=lambda: (victim.proc.wait(90), exited_at.append(time.time())))
    watcher.start()
    for turn in (1, 2):
        batch = [threading.Thread(target=run, args=(c, turn, i % 3 == 0)) for i, c in enumerate(convs)]
        for t in batch:
            t.start()
        for t in batch:
            t.join(120)
    for t in threads:
        t.join(120)
    watcher.join(90)
    check(exited_at, f"the drained replica did not exit:\n{victim.text()[-3000:]}")
    code = victim.proc.returncode
    drain_s = exited_at[0] - t0
    refused = len(re.findall(r"answered 503: the server is draining", victim.text()))
    failed = [(c.key, s, r, e) for c, _, s, r, e, _ in results if s != 200 or e is not None]
    moved = sum(1 for c, _, s, r, _, _ in results if c in on_victim and r and r != victim.name)
    check(code == 0, f"the drained replica exited {code}:\n{victim.text()[-3000:]}")
    check(not failed, f"requests failed during the drain: {failed}")
    check("Drained in" in victim.text(), "the drained replica did not log its drain")
    # Every answer is the greedy answer: the same messages evaluated afresh (unscoped, so no cache) on a
    # surviving replica give the same text.
    survivor = next(r for r in d.replicas if r is not victim)
    mismatches = 0
    for c in on_victim:
        for i, (msgs, max_tokens, answer) in enumerate(c.turns):
            status, _, body = request("127.0.0.1", survivor.port, "POST", "/v1/chat/completions",
                                      {"messages": msgs, "max_tokens": max_tokens, "temperature": 0},
                                      {"X-Conversation-Id": f"fresh-{c.key}-{i}"})
            check(status == 200, f"replay on {survivor.name}: {status} {body}")
            fresh = json.loads(body)["choices"][0]["message"]["content"]
            if fresh != answer:
                mismatches += 1
                print(f"deploy: {c.key}: {answer!r} != fresh {fresh!r}")
    print(f"deploy: (b) drain: {len(results)} requests during the drain, {len(failed)} failed; {moved} turns of the "
          f"{len(on_victim)} drained conversations moved to another replica ({refused} refused by the draining replica "
          f"and retried by HAProxy); the drained replica had "
          f"{running_at_drain} requests admitted at the drain and exited 0 after {drain_s:.2f} s "
          f"({re.search(r'Drained in ([0-9.]+ s)', victim.text()).group(1)} to answer them); {mismatches} answers differ from a fresh greedy evaluation")
    check(mismatches == 0, f"{mismatches} answers differ from a fresh evaluation")
    d.replicas.remove(victim)


def test_kill(d, convs):
    victim = d.replicas[0]
    mine = [c for c in convs if c.replicas[-1] == victim.name]
    check(len(mine) >= 3, f"only {len(mine)} conversations on {victim.name}")
    results, lock = [], threading.Lock()
    first = threading.Event()

    def run(c, long):
        body = c.body("Kill turn: count slowly.", 8000 if long else 8)
        if long:
            body["ignore_eos"] = True
        t0 = time.time()
        out = stream("127.0.0.1", d.lb_port, body, c.headers(), on_first=first.set if long else None, timeout=60)
        with lock:
            results.append((c, long, out, time.time() - t0))

    running = threading.Thread(target=run, args=(mine[0], True))
    running.start()
    check(first.wait(30), "the long stream did not start")
    # Queued behind the running stream on the victim: not started when it dies.
    queued = [threading.Thread(target=run, args=(c, False)) for c in mine[1:3]]
    for t in queued:
        t.start()
    until = time.time() + 20
    while True:
        _, _, text = request("127.0.0.1", victim.port, "GET", "/metrics")
        m = re.search(r"\nstrata_queue_waiting (\d+)", text)
        if m and int(m.group(1)) >= 2:
            break
        check(time.time() < until, "the requests did not queue on the replica to kill")
        time.sleep(0.02)
    t_kill = time.time()
    victim.proc.send_signal(signal.SIGKILL)
    victim.proc.wait()
    # New requests for its conversations, sent right after the kill (before a health check notices).
    after = [threading.Thread(target=run, args=(c, False)) for c in mine[3:6]]
    for t in after:
        t.start()
    for t in [running, *queued, *after]:
        t.join(90)
        check(not t.is_alive(), "a request hung after the kill")
    elapsed = time.time() - t_kill
    cut = [(c.key, o) for c, long, o, _ in results if long]
    short = [(c.key, o) for c, long, o, _ in results if not long]
    check(len(cut) == 1 and cut[0][1][3] is not None and "[DONE]" not in cut[0][1][2],
          f"the stream in flight did not end with an error: {cut}")
    bad = [(k, o[0], o[3]) for k, o in short if o[0] != 200 or o[3] is not None]
    check(not bad, f"requests not started on the killed replica were not retried: {bad}")
    print(f"deploy: (c) SIGKILL: the stream in flight ended with an error ({cut[0][1][3]}) after "
          f"{len(cut[0][1][2])} events; {len(short)} requests not yet started (2 queued, {len(after)} sent after the "
          f"kill) all answered 200 by {sorted({o[1] for _, o in short})}; everything ended {elapsed:.2f} s after "
          f"the kill")
    d.replicas.remove(victim)


def test_manifests(k8s_dir, tmp):
    import yaml
    p = subprocess.run(["kubectl", "kustomize", k8s_dir], capture_output=True, text=True, timeout=60)
    check(p.returncode == 0, f"kubectl kustomize {k8s_dir}: {p.stderr}")
    docs = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(p.stdout) if d}
    for key in (("Deployment", "strata"), ("Service", "strata-replicas"), ("ConfigMap", "strata-haproxy"),
                ("Deployment", "strata-haproxy"), ("Service", "strata")):
        check(key in docs, f"the manifests have no {key[0]} {key[1]}: {sorted(docs)}")
    pod = docs[("Deployment", "strata")]["spec"]["template"]["spec"]
    c = pod["containers"][0]
    args = c["args"]
    drain = float(args[args.index("--drain-timeout") + 1])
    pre_stop = int(c["lifecycle"]["preStop"]["exec"]["command"][-1])
    check(pod["terminationGracePeriodSeconds"] >= drain + pre_stop,
          f"terminationGracePeriodSeconds {pod['terminationGracePeriodSeconds']} is shorter than --drain-timeout "
          f"{drain:g} + preStop {pre_stop}")
    check(c["readinessProbe"]["httpGet"]["path"] == "/health/ready", "the readiness probe is not /health/ready")
    check(c["livenessProbe"]["httpGet"]["path"] == "/health/live", "the liveness probe is not /health/live")
    check(all(r in c["resources"]["requests"] for r in ("cpu", "memory")), "the pod requests no cpu or memory")
    cfg = os.path.join(tmp, "k8s-haproxy.cfg")
    with open(cfg, "w") as f:
        f.write(docs[("ConfigMap", "strata-haproxy")]["data"]["haproxy.cfg"])
    p = subprocess.run(["haproxy", "-c", "-f", cfg], capture_output=True, text=True, timeout=60)
    check(p.returncode == 0, f"haproxy -c on the ConfigMap's configuration: {p.stdout}{p.stderr}")
    with open(ARGS.config) as f:
        shipped = f.read()
    for line in ("balance hash var(txn.conversation)", "hash-type consistent", "option http-buffer-request",
                 "retry-on conn-failure empty-response 503", "option httpchk GET /health/ready"):
        check(line in shipped and line in docs[("ConfigMap", "strata-haproxy")]["data"]["haproxy.cfg"],
              f"'{line}' is not in both HAProxy configurations")
    print(f"deploy: manifests: {len(docs)} objects render offline, grace period {pod['terminationGracePeriodSeconds']} s "
          f">= drain {drain:g} s + preStop {pre_stop} s, the ConfigMap's HAProxy configuration is valid")


def main():
    global ARGS
    p = argparse.ArgumentParser()
    p.add_argument("--server", required=True)
    p.add_argument("--make-model", required=True)
    p.add_argument("--config", required=True)
    p.add_argument("--k8s", required=True)
    ARGS = p.parse_args()
    missing = [n for n in ("haproxy", "promtool", "kubectl") if not shutil.which(n)]
    try:
        import yaml  # noqa: F401 (python3-yaml, for the manifests)
    except ImportError:
        missing.append("python3-yaml")
    if missing:
        print(f"deploy: skipped: {', '.join(missing)} not installed (tools/install-deps.sh installs them)")
        return 77
    with tempfile.TemporaryDirectory(prefix="strata-deploy-") as tmp:
        passed = 0
        try:
            test_manifests(ARGS.k8s, tmp)
            passed += 1
        except AssertionError as e:
            print(f"deploy: FAILED: {e}")
            return 1
        d = Deployment(tmp)
        try:
            convs = [Conversation(i) for i in range(CONVERSATIONS)]
            for test in (test_metrics, test_affinity, test_drain, test_kill):
                t0 = time.time()
                test(d) if test is test_metrics else test(d, convs)
                passed += 1
                print(f"deploy: {test.__name__} passed in {time.time() - t0:.1f} s")
        except AssertionError as e:
            print(f"deploy: FAILED: {e}")
            with open(os.path.join(tmp, "haproxy.log")) as f:
                print("haproxy log (tail):\n" + f.read()[-4000:])
            return 1
        finally:
            d.close()
        print(f"deploy: {passed} passed, 0 failed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
