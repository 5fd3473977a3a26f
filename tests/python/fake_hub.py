"""A stand-in for the Hugging Face Hub's HTTP protocol, for the hf://
tests (tests/hub.rs): the parts `huggingface_hub` and ztensor-mount use.

    python3 fake_hub.py CONFIG.json [LATENCY_MS]

CONFIG names the repos:

    {"tokens": ["hf_ok"],                       # tokens that may read gated repos
     "renamed": {"old/name": "org/name"},       # repos moved: 307 to the new name
     "moved_away": {"gone/name": "org/name"},   # 307 to the new name on the CDN's host
     "repos": {"org/name": {"gated": false,
                            "refs": {"main": SHA, "v1": SHA},
                            "commits": {SHA: {"PATH": "/abs/local/file", ...}}}}}

Listens on 127.0.0.1 and a free port, prints "PORT <n>" on stdout, and
exits when stdin closes (or it is killed). The Hub is the host the client
names (127.0.0.1:PORT); a large file's bytes are on "the CDN", the same
port under the host name localhost: a second host, as the real Hub's CDN
is. Routes, as the Hub answers them:

    GET  /api/models/ORG/NAME[/revision/REV][?blobs=true]
         {"id", "sha", "siblings": [{"rfilename", "blobId", "size", "lfs"}], ...}
         (/api/datasets/..., /api/spaces/...: the repos named
         "datasets/ORG/NAME", "spaces/ORG/NAME" in CONFIG)
    HEAD|GET /ORG/NAME/resolve/REV/PATH (/datasets/ORG/NAME/resolve/..., ...)
         a small file (not .safetensors/.gguf/.bin/...): 200, its ETag, the
         bytes; a large (LFS) one: 302 to a signed CDN URL, with
         X-Linked-Size, X-Linked-Etag and X-Repo-Commit
    HEAD|GET http://localhost:PORT/__cdn/SHA256?sig=N
         the bytes, honouring Range (206 + Content-Range); 403 once the
         signature has expired
    a renamed repo's old name, in the API or resolve: 307 to the same path
    with the new name (relative, on the Hub's host; for "moved_away", on
    the host localhost), as the Hub answers
    errors: 401 + X-Error-Code: GatedRepo (gated, no token), 403 GatedRepo
    (a token not granted), 401/404 RepoNotFound, 404 RevisionNotFound,
    404 EntryNotFound, each with X-Error-Message

Control requests (not counted):

    GET /__stats    {"hub_requests", "cdn_requests", "cdn_bytes", "cdn_auth",
                     "log": [[host, method, path, range], ...]}
    GET /__reset    zero the counts, clear the faults
    GET /__fault?kind=K&count=N[&status=S][&secs=T][&on=cdn|hub]
        the next N requests to the CDN (GET) or the Hub (API, resolve) fail:
        status  answer S (429, 500, 503) instead (429 with Retry-After: 0)
        stall   wait T seconds, then answer
        drop    (CDN) send the headers and half the body, then close
        misframed (CDN) send the body chunked, its first chunk's size
                that of the whole body, so the next chunk's size line
                lands inside it before the framing fails
    GET /__linked_size?delta=D   resolve's X-Linked-Size is D bytes off
                    the file's (the CDN sends the file as it is)
    GET /__many?count=N   every repo's file list also names N small files
                    (data/part-NNNNNNN.json), as a dataset's does
    GET /__expire   every signed URL issued so far is expired (403)
    GET /__move?repo=ORG/NAME&ref=REF&to=SHA   a branch now points elsewhere
    GET /__cdn_etag?value=V   the CDN gives ETag V for every file (its
                    object there replaced; the Hub's X-Linked-Etag stays)
"""

import hashlib
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qs, quote, unquote, urlsplit

import serving

CONFIG = json.load(open(sys.argv[1]))
LATENCY = float(sys.argv[2]) / 1000 if len(sys.argv) > 2 else 0.0
LOCK = threading.Lock()
STATE = {"hub": 0, "cdn": 0, "bytes": 0, "auth": 0, "log": [], "faults": [], "sig": 0, "expired": 0}
HASHES = {}
# The API's repo types, and the prefix of their names in CONFIG.
KINDS = {"models": "", "datasets": "datasets/", "spaces": "spaces/"}
LFS = (".safetensors", ".gguf", ".bin", ".pt", ".pth", ".npz", ".onnx", ".h5", ".zt", ".dt")


def hashes(path):
    """(sha256, git blob sha1) of a local file, computed once."""
    with LOCK:
        if path in HASHES:
            return HASHES[path]
    sha256, sha1 = hashlib.sha256(), hashlib.sha1()
    size = os.path.getsize(path)
    sha1.update(b"blob %d\0" % size)
    with open(path, "rb") as f:
        while True:
            b = f.read(1 << 20)
            if not b:
                break
            sha256.update(b)
            sha1.update(b)
    h = (sha256.hexdigest(), sha1.hexdigest())
    with LOCK:
        HASHES[path] = h
    return h


def by_sha256(sha):
    for repo in CONFIG["repos"].values():
        for files in repo["commits"].values():
            for local in files.values():
                if hashes(local)[0] == sha:
                    return local
    return None


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def do_HEAD(self):
        self.route()

    def do_GET(self):
        self.route()

    def route(self):
        url = urlsplit(self.path)
        q = parse_qs(url.query)
        if url.path.startswith("/__") and not url.path.startswith("/__cdn/"):
            return self.control(url.path, q)
        host = (self.headers.get("Host") or "").split(":")[0]
        cdn = url.path.startswith("/__cdn/")
        with LOCK:
            STATE["cdn" if cdn else "hub"] += 1
            STATE["log"].append([host, self.command, url.path, self.headers.get("Range")])
            if cdn and self.headers.get("Authorization"):
                STATE["auth"] += 1
            fault = None
            for f in STATE["faults"]:
                if f["count"] > 0 and f["on"] == ("cdn" if cdn else "hub") and (
                    not cdn or self.command == "GET"
                ):
                    f["count"] -= 1
                    fault = f
                    break
        if fault and fault["kind"] == "stall":
            time.sleep(fault["secs"])
        elif fault and fault["kind"] not in ("drop", "misframed"):
            hdrs = {"Retry-After": "0"} if fault["status"] == 429 else {}
            return self.error(fault["status"], "", "injected", hdrs)
        if cdn:
            if host != "localhost":
                return self.error(404, "", "the CDN is at localhost")
            kind = fault["kind"] if fault else None
            return self.serve_cdn(url.path[len("/__cdn/"):], q, kind)
        parts = [unquote(p) for p in url.path.split("/")[1:]]
        moved = self.renamed(parts, "renamed")
        away = self.renamed(parts, "moved_away")
        if moved is not None or away is not None:
            to = "/" + "/".join(quote(p, safe="") for p in (moved or away))
            to += "?" + url.query if url.query else ""
            if away is not None:
                to = "http://localhost:%d%s" % (self.server.server_address[1], to)
            return self.send(307, b"", {"Location": to})
        if parts[0] == "api" and len(parts) >= 6 and parts[1] in KINDS and parts[4] == "revision":
            return self.api(KINDS[parts[1]], "/".join(parts[2:4]), "/".join(parts[5:]), "blobs" in q)
        if parts[0] == "api" and len(parts) == 4 and parts[1] in KINDS:
            return self.api(KINDS[parts[1]], "/".join(parts[2:4]), "main", "blobs" in q)
        # A dataset's or space's files are under datasets/ or spaces/.
        prefix = parts[0] + "/" if parts[0] in ("datasets", "spaces") else ""
        rest = parts[1:] if prefix else parts
        if len(rest) >= 5 and rest[2] == "resolve":
            return self.resolve(prefix + "/".join(rest[:2]), rest[3], "/".join(rest[4:]))
        self.error(404, "", "no such route")

    def renamed(self, parts, key):
        """The path's parts with the old name of a repo moved (CONFIG[key])
        replaced by the new one, or None."""
        at = 2 if parts[0] == "api" else 0
        name = "/".join(parts[at : at + 2])
        new = CONFIG.get(key, {}).get(name)
        if new is None or len(parts) < at + 2:
            return None
        return parts[:at] + new.split("/") + parts[at + 2 :]

    def control(self, path, q):
        one = lambda k, d=None: q.get(k, [d])[0]
        with LOCK:
            if path == "/__stats":
                body = json.dumps(
                    {
                        "hub_requests": STATE["hub"],
                        "cdn_requests": STATE["cdn"],
                        "cdn_bytes": STATE["bytes"],
                        "cdn_auth": STATE["auth"],
                        "log": STATE["log"],
                    }
                ).encode()
            elif path == "/__reset":
                STATE.update(hub=0, cdn=0, bytes=0, auth=0, log=[], faults=[], cdn_etag=None)
                body = b"ok"
            elif path == "/__fault":
                STATE["faults"].append(
                    {
                        "kind": one("kind"),
                        "count": int(one("count", "1")),
                        "status": int(one("status", "503")),
                        "secs": float(one("secs", "0")),
                        "on": one("on", "cdn"),
                    }
                )
                body = b"ok"
            elif path == "/__linked_size":
                STATE["linked_delta"] = int(one("delta", "0"))
                body = b"ok"
            elif path == "/__many":
                STATE["many"] = int(one("count", "0"))
                body = b"ok"
            elif path == "/__expire":
                STATE["expired"] = STATE["sig"]
                body = b"ok"
            elif path == "/__cdn_etag":
                STATE["cdn_etag"] = one("value")
                body = b"ok"
            elif path == "/__move":
                CONFIG["repos"][one("repo")]["refs"][one("ref")] = one("to")
                body = b"ok"
            else:
                return self.error(404, "", "no such control")
        self.send(200, body, {"Content-Type": "application/json"})

    def error(self, status, code, msg, extra=None):
        h = {"X-Error-Message": msg, "Content-Type": "application/json"}
        if code:
            h["X-Error-Code"] = code
        h.update(extra or {})
        self.send(status, json.dumps({"error": msg}).encode(), h)

    def send(self, status, body, headers):
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def lookup(self, name, rev):
        """(repo, commit sha) or None after answering the error."""
        repo = CONFIG["repos"].get(name)
        auth = self.headers.get("Authorization", "")
        token = auth[len("Bearer "):] if auth.startswith("Bearer ") else None
        if repo is None:
            status = 404 if token else 401
            self.error(status, "RepoNotFound", "Repository Not Found for url: %s." % self.path)
            return None
        if repo.get("gated"):
            if token is None:
                self.error(
                    401,
                    "GatedRepo",
                    "Access to model %s is restricted. You must have access to it and be "
                    "authenticated to access it. Please log in." % name,
                )
                return None
            if token not in CONFIG.get("tokens", []):
                self.error(
                    403,
                    "GatedRepo",
                    "Access to model %s is restricted and you are not in the authorized list."
                    % name,
                )
                return None
        sha = repo["refs"].get(rev, rev if rev in repo["commits"] else None)
        if sha is None:
            self.error(404, "RevisionNotFound", "Invalid rev id: %s" % rev)
            return None
        return repo, sha

    def api(self, prefix, name, rev, blobs):
        found = self.lookup(prefix + name, unquote(rev))
        if not found:
            return
        repo, sha = found
        siblings = []
        for path, local in sorted(repo["commits"][sha].items()):
            s = {"rfilename": path}
            if blobs:
                sha256, sha1 = hashes(local)
                size = os.path.getsize(local)
                s.update(blobId=sha1, size=size)
                if path.endswith(LFS):
                    s["lfs"] = {"sha256": sha256, "size": size, "pointerSize": 134}
            siblings.append(s)
        with LOCK:
            many = STATE.get("many", 0)
        siblings += [
            {"rfilename": "data/part-%07d.json" % i, "blobId": "0" * 40, "size": 100}
            for i in range(many)
        ]
        body = {
            "_id": "0" * 24,
            "id": name,
            "modelId": name,
            "author": name.split("/")[0],
            "sha": sha,
            "lastModified": "2024-01-01T00:00:00.000Z",
            "createdAt": "2024-01-01T00:00:00.000Z",
            "private": False,
            "gated": "auto" if repo.get("gated") else False,
            "disabled": False,
            "downloads": 0,
            "likes": 0,
            "tags": [],
            "siblings": siblings,
        }
        self.send(200, json.dumps(body).encode(), {"Content-Type": "application/json"})

    def resolve(self, name, rev, path):
        found = self.lookup(name, unquote(rev))
        if not found:
            return
        repo, sha = found
        local = repo["commits"][sha].get(path)
        if local is None:
            return self.error(404, "EntryNotFound", "%s does not exist on %s" % (path, rev))
        sha256, sha1 = hashes(local)
        size = os.path.getsize(local)
        h = {"X-Repo-Commit": sha, "Accept-Ranges": "bytes"}
        if not path.endswith(LFS):
            with open(local, "rb") as f:
                body = f.read()
            h.update({"ETag": '"%s"' % sha1, "Content-Type": "application/octet-stream"})
            return self.send(200, body, h)
        with LOCK:
            STATE["sig"] += 1
            sig = STATE["sig"]
        port = self.server.server_address[1]
        h.update(
            {
                "Location": "http://localhost:%d/__cdn/%s?sig=%d" % (port, sha256, sig),
                "X-Linked-Size": str(size + STATE.get("linked_delta", 0)),
                "X-Linked-Etag": '"%s"' % sha256,
                "ETag": '"%s"' % sha1,
            }
        )
        self.send(302, b"", h)

    def serve_cdn(self, sha, q, fault=None):
        try:
            sig = int(q.get("sig", ["0"])[0])
        except ValueError:
            sig = 0
        with LOCK:
            expired = sig <= STATE["expired"]
        if expired or sig == 0:
            return self.send(
                403,
                b"<Error><Code>AccessDenied</Code><Message>Request has expired</Message></Error>",
                {"Content-Type": "application/xml"},
            )
        local = by_sha256(sha)
        if local is None:
            return self.error(404, "", "no such object")
        size = os.path.getsize(local)
        start, end, status = 0, size, 200
        rng = self.headers.get("Range")
        if rng and rng.startswith("bytes="):
            a, _, b = rng[len("bytes="):].partition("-")
            start = int(a) if a else size - int(b)
            end = min(int(b) + 1, size) if a and b else size
            if start >= size or start >= end:
                return self.send(416, b"", {"Content-Range": "bytes */%d" % size})
            status = 206
        if LATENCY and self.command == "GET":
            time.sleep(LATENCY)
        self.send_response(status)
        if fault == "misframed":
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.send_header("Content-Length", str(end - start))
        self.send_header("ETag", STATE.get("cdn_etag") or '"cdn-%s"' % sha[:16])
        self.send_header("Accept-Ranges", "bytes")
        if status == 206:
            self.send_header("Content-Range", "bytes %d-%d/%d" % (start, end - 1, size))
        self.end_headers()
        if self.command == "HEAD":
            return
        if fault == "misframed":
            with open(local, "rb") as f:
                f.seek(start)
                body = f.read(end - start)
            half = len(body) // 2
            self.wfile.write(b"%x\r\n%s\r\n%x\r\n%s\r\n0\r\n\r\n" % (
                len(body), body[:half], len(body) - half, body[half:]))
            self.close_connection = True
            return
        with open(local, "rb") as f:
            f.seek(start)
            left = (end - start) // 2 if fault == "drop" else end - start
            while left > 0:
                b = f.read(min(left, 1 << 20))
                if not b:
                    break
                try:
                    self.wfile.write(b)
                except OSError:
                    return
                left -= len(b)
                with LOCK:
                    STATE["bytes"] += len(b)
        if cut:
            self.close_connection = True
            try:
                self.connection.shutdown(2)
            except OSError:
                pass


if __name__ == "__main__":
    serving.serve(serving.QuietServer, Handler)
