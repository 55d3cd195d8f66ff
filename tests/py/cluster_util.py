"""Processes of a potserve cluster on loopback, for the cluster tests: a
redis-server (AOF, appendfsync always), potserve replicas on a shared
--store redis://..., and an nginx that routes by session id with
`hash ... consistent` (docker/nginx-cluster.conf's rules). No containers:
the Debian packages redis-server and nginx(-light)."""
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import threading
import time

from server_util import Server

ROOT = pathlib.Path(__file__).resolve().parents[2]
NGINX_TEMPLATE = ROOT / "docker" / "nginx-cluster.conf"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def have_cluster_tools():
    return all(shutil.which(t) or os.path.exists(f"/usr/sbin/{t}") for t in ("redis-server", "redis-cli", "nginx"))


class Redis:
    def __init__(self, workdir):
        self.dir = pathlib.Path(workdir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.proc = None

    @property
    def url(self):
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self):
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir),
             "--save", "", "--appendonly", "yes", "--appendfsync", "always", "--daemonize", "no",
             "--logfile", str(self.dir / "redis.log")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 20
        while time.time() < deadline:
            try:
                if self.cli("PING") == "PONG":
                    return self
            except subprocess.CalledProcessError:
                pass
            time.sleep(0.05)
        raise AssertionError("redis-server did not start")

    def cli(self, *args, raw=False):
        out = subprocess.run(["redis-cli", "-p", str(self.port), *map(str, args)], capture_output=True,
                             check=True, timeout=30).stdout
        return out if raw else out.decode("latin-1").strip()

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(20)


class RedisProxy:
    """A TCP proxy in front of a Redis (pass it as replica()'s redis) that injects one fault:
    stall = bytes: the next command holding them never reaches Redis and is never answered;
    cut = bytes: the next command holding them reaches Redis, its answer is dropped and the
    client's connection closed, and for loading_s seconds after that new connections are
    answered -LOADING (a Redis that died after running it and is starting again)."""

    def __init__(self, redis, loading_s=0.0):
        self.target = redis.port
        self.port = free_port()
        self.stall = self.cut = None
        self.loading_s = loading_s
        self.loading_until = 0
        self.hits = []
        self.listener = socket.create_server(("127.0.0.1", self.port))
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self):
        return f"redis://127.0.0.1:{self.port}/0"

    def _accept(self):
        while True:
            c, _ = self.listener.accept()
            if time.time() < self.loading_until:
                threading.Thread(target=self._loading, args=(c,), daemon=True).start()
                continue
            u = socket.create_connection(("127.0.0.1", self.target))
            state = {"mute": False}
            threading.Thread(target=self._up, args=(c, u, state), daemon=True).start()
            threading.Thread(target=self._down, args=(c, u, state), daemon=True).start()

    def _loading(self, c):
        try:
            if c.recv(1 << 20):
                self.hits.append("loading")
                c.sendall(b"-LOADING Redis is loading the dataset in memory\r\n")
            time.sleep(0.2)
        finally:
            c.close()

    def _up(self, c, u, state):
        try:
            while True:
                d = c.recv(1 << 20)
                if not d:
                    break
                if self.stall and self.stall in d:
                    self.stall = None
                    self.hits.append("stall")
                    while c.recv(1 << 20):
                        pass
                    break
                if self.cut and self.cut in d:
                    self.cut = None
                    self.hits.append("cut")
                    state["mute"] = True
                    u.sendall(d)
                    time.sleep(0.3)  # Redis runs it
                    self.loading_until = time.time() + self.loading_s
                    break
                u.sendall(d)
        except OSError:
            pass
        for s in (c, u):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def _down(self, c, u, state):
        try:
            while True:
                d = u.recv(1 << 20)
                if not d:
                    break
                if not state["mute"]:
                    c.sendall(d)
        except OSError:
            pass


def replica(data_dir, redis, name, *flags, lease_ms=1000, env=None):
    return Server(data_dir, "--store", redis.url, "--replica-name", name, "--lease-ms", str(lease_ms),
                  "--access-log", "false", *flags, env=env)


class Nginx:
    """nginx in the foreground with docker/nginx-cluster.conf's routing, the
    upstream servers being the given replica ports."""

    def __init__(self, workdir, ports, read_timeout_s=30):
        self.dir = pathlib.Path(workdir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        (self.dir / "potserve-upstreams.conf").write_text(
            "".join(f"server 127.0.0.1:{p} max_fails=1 fail_timeout=5s;\n" for p in ports))
        routing = NGINX_TEMPLATE.read_text()
        routing = routing.replace("listen 8080;", f"listen 127.0.0.1:{self.port};")
        routing = routing.replace("proxy_read_timeout 30s;", f"proxy_read_timeout {read_timeout_s}s;")
        routing = routing.replace("proxy_send_timeout 30s;", f"proxy_send_timeout {read_timeout_s}s;")
        conf = (f"daemon off;\nmaster_process off;\nworker_processes 1;\npid {self.dir}/nginx.pid;\n"
                f"error_log {self.dir}/error.log warn;\nevents {{ worker_connections 1024; }}\n"
                f"http {{\n    access_log off;\n    client_body_temp_path {self.dir}/body;\n"
                f"    proxy_temp_path {self.dir}/proxy;\n{routing}\n}}\n")
        self.conf = self.dir / "nginx.conf"
        self.conf.write_text(conf)
        self.proc = None

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"

    def start(self):
        self.proc = subprocess.Popen(["nginx", "-p", str(self.dir), "-e", str(self.dir / "error.log"), "-c", str(self.conf)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.time() + 20
        while time.time() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return self
            except OSError:
                if self.proc.poll() is not None:
                    raise AssertionError("nginx exited: " + self.proc.stderr.read().decode())
                time.sleep(0.05)
        raise AssertionError("nginx did not start")

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGQUIT)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def redis_command(port, *args):
    """One command over RESP (binary-safe, unlike redis-cli's output): the parsed reply."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        out = b"*%d\r\n" % len(args)
        for a in args:
            a = a if isinstance(a, bytes) else str(a).encode()
            out += b"$%d\r\n%s\r\n" % (len(a), a)
        s.sendall(out)
        f = s.makefile("rb")

        def read():
            line = f.readline()
            kind, rest = line[:1], line[1:-2]
            if kind == b"+":
                return rest.decode()
            if kind == b"-":
                raise RuntimeError(rest.decode())
            if kind == b":":
                return int(rest)
            if kind == b"$":
                n = int(rest)
                if n < 0:
                    return None
                data = f.read(n + 2)
                return data[:-2]
            if kind == b"*":
                n = int(rest)
                return None if n < 0 else [read() for _ in range(n)]
            raise RuntimeError(f"bad RESP line {line!r}")
        return read()


def store_chunks(port, sid):
    """The chunks of session sid's log in Redis: [(seq, final, bytes)], each
    frame's header (server/store_redis.c) and length checked (the server
    checks the CRC-32C when it replays)."""
    import struct
    out = []
    for frame in redis_command(port, "LRANGE", f"potserve:s:{sid}:log", 0, -1):
        assert frame[:4] == b"PSC1", frame[:8]
        final = frame[4]
        seq, n = struct.unpack_from("<QQ", frame, 8)
        assert len(frame) == 32 + n
        out.append((seq, final, frame[32:]))
    return out


class SlowUpload:
    """A chunk upload straight to one replica, its body sent in two parts (a
    replica caught between them, e.g. by SIGSTOP, has the chunk open)."""

    def __init__(self, port, sid, seq, text, final=False, first=80):
        self.text, self.first = text.encode(), first
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.sendall((f"POST /v1/sessions/{sid}/chunks?seq={seq}&final={'true' if final else 'false'} "
                           f"HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\n"
                           f"Content-Length: {len(self.text)}\r\n\r\n").encode() + self.text[:first])

    def finish(self, timeout=60):
        """Sends the rest; (status, parsed JSON body)."""
        import json
        self.sock.sendall(self.text[self.first:])
        self.sock.settimeout(timeout)
        reply = b""
        while not reply.rstrip().endswith(b"}"):
            got = self.sock.recv(65536)
            if not got:
                break
            reply += got
        self.sock.close()
        head, _, body = reply.partition(b"\r\n\r\n")
        return (int(head.split()[1]) if head else 0), (json.loads(body) if body.strip() else None)
