"""An HTTP server for the remote-mount tests: serves the files of a
directory with HEAD and GET, honouring Range (one range) and If-Match, with
an ETag per object generation; counts requests and injects faults.

    python3 range_server.py DIR [LATENCY_MS]

LATENCY_MS (default 0) delays every data answer, as a remote store's time
to first byte would (for the benchmark).

Listens on 127.0.0.1 and a free port, prints "PORT <n>" on stdout, and
exits when stdin closes (or it is killed). Control requests (not counted):

    GET /__stats                 {"requests": n, "log": [[method, path, range], ...],
                                  "referers": [each request's Referer or null, ...]}
    GET /__reset                 zero the counts and clear every fault (and
                                 /__chunked)
    GET /__fault?kind=K&count=N[&status=S][&secs=T][&path=/x]
        the next N data requests (GET with a Range, to path if given) fail:
        drop    send the headers and half the body, then close the connection
        status  answer S (500, 503) instead
        stall   wait T seconds before answering (past the client's timeout)
        gzip    send the range gzip-compressed, with Content-Encoding: gzip
                (a server or CDN that compresses unasked)
        long    send the range and 4096 bytes more (Content-Length says so)
    GET /__claim?path=/x&size=N
        HEAD answers for /x give its size as N bytes (a server that lies)
    GET /__replace?path=/x&from=/y
        the object /x now has the bytes of /y, and a new ETag
    GET /__sign?path=/x&sig=S[&expired=1]
        /x is served only to a GET whose query has sig=S, as an S3
        presigned URL is (403 otherwise); HEAD of it answers 403 (the URL
        is signed for GET alone); with expired=1 every request for it
        answers 403, as S3 does once a presigned URL's time is past
    GET /__redirect?path=/x&to=URL
        GETs of /x answer 302 to URL
    GET /__nohead
        every HEAD answers 405 (a server that does not offer HEAD)
    GET /__noranges
        every GET ignores Range and answers 200 with the whole object
    GET /__chunked
        every GET's body is sent chunked (Transfer-Encoding: chunked, no
        Content-Length), as HTTP/1.1 allows
    GET /__mode?m=M
        from now on, the validators sent (If-Match is then ignored):
        no_etag    no ETag (nginx's `etag off`): an object is known by its
                   Last-Modified, which a replace moves on by a second
        head_etag  the ETag on HEAD answers only, Last-Modified as no_etag
        none       neither ETag nor Last-Modified
        drop_etag  the ETag until the object is replaced, none after, and a
                   Last-Modified a replace does not move (a server that
                   drops the ETag and ignores If-Match)
        weak_etag  the ETag weak (W/"..."), and If-Match compared strongly,
                   as RFC 9110 says and nginx does: any If-Match but * fails
                   with 412
"""

import gzip
import json
import os
import re
import sys
import threading
import time
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qs, urlsplit

import serving

ROOT = os.path.abspath(sys.argv[1])
LATENCY = float(sys.argv[2]) / 1000 if len(sys.argv) > 2 else 0.0
LOCK = threading.Lock()
STATE = {"requests": 0, "log": [], "faults": [], "gen": {}, "data": {}}
STARTED = time.time()
S3_ERROR = b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>%s</Code></Error>"


class Stored:
    """An object's bytes: a file on disk (read by range), or bytes."""

    def __init__(self, path=None, data=None):
        self.path, self.data = path, data
        self.size = len(data) if data is not None else os.path.getsize(path)

    def read(self, start, end):
        if self.data is not None:
            return self.data[start:end]
        with open(self.path, "rb") as f:
            f.seek(start)
            return f.read(end - start)


def load(path):
    """The bytes and ETag of the object at `path`, or None."""
    with LOCK:
        if path in STATE["data"]:
            data = STATE["data"][path]
            return Stored(data=data), '"%s-%d"' % (abs(hash(path)) % 10**8, STATE["gen"][path])
    full = os.path.realpath(os.path.join(ROOT, path.lstrip("/")))
    if not full.startswith(ROOT + os.sep) or not os.path.isfile(full):
        return None
    return Stored(path=full), '"%s-0"' % (abs(hash(path)) % 10**8)


def take_fault(path):
    with LOCK:
        for f in STATE["faults"]:
            if f["count"] > 0 and f.get("path") in (None, path):
                f["count"] -= 1
                return dict(f)
    return None


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def control(self, url):
        q = {k: v[0] for k, v in parse_qs(url.query).items()}
        body = b"ok"
        with LOCK:
            if url.path == "/__stats":
                body = json.dumps(
                    {
                        "requests": STATE["requests"],
                        "log": STATE["log"],
                        "referers": STATE.get("referers", []),
                    }
                ).encode()
            elif url.path == "/__reset":
                STATE["requests"] = 0
                STATE["log"] = []
                STATE["referers"] = []
                STATE["faults"] = []
                STATE["chunked"] = False
            elif url.path == "/__mode":
                STATE["mode"] = q["m"]
            elif url.path == "/__sign":
                STATE.setdefault("signed", {})[q["path"]] = (q["sig"], q.get("expired") == "1")
            elif url.path == "/__redirect":
                STATE.setdefault("redirects", {})[q["path"]] = q["to"]
            elif url.path == "/__nohead":
                STATE["no_head"] = True
            elif url.path == "/__noranges":
                STATE["no_ranges"] = True
            elif url.path == "/__chunked":
                STATE["chunked"] = True
            elif url.path == "/__claim":
                STATE.setdefault("claims", {})[q["path"]] = int(q["size"])
            elif url.path == "/__fault":
                f = {"kind": q["kind"], "count": int(q.get("count", "1"))}
                f["status"] = int(q.get("status", "503"))
                f["secs"] = float(q.get("secs", "5"))
                if "path" in q:
                    f["path"] = q["path"]
                STATE["faults"].append(f)
        if url.path == "/__replace":
            src, _ = load(q["from"])
            data = src.read(0, src.size)
            with LOCK:
                STATE["data"][q["path"]] = data
                STATE["gen"][q["path"]] = STATE["gen"].get(q["path"], 0) + 1
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_HEAD(self):
        self.serve(head=True)

    def do_GET(self):
        self.serve(head=False)

    def serve(self, head):
        url = urlsplit(self.path)
        if url.path.startswith("/__"):
            return self.control(url)
        rng = self.headers.get("Range")
        with LOCK:
            STATE["requests"] += 1
            STATE["log"].append(["HEAD" if head else "GET", url.path, rng])
            STATE.setdefault("referers", []).append(self.headers.get("Referer"))
        to = STATE.get("redirects", {}).get(url.path)
        if to is not None and not head:
            self.send_response(302)
            self.send_header("Location", to)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if head and STATE.get("no_head"):
            return self.answer(405, b"method not allowed")
        signed = STATE.get("signed", {}).get(url.path)
        if signed is not None:
            sig, expired = signed
            if head or parse_qs(url.query).get("sig") != [sig]:
                return self.answer(403, S3_ERROR % b"SignatureDoesNotMatch")
            if expired:
                return self.answer(403, S3_ERROR % b"AccessDenied</Code><Message>Request has expired")
        got = load(url.path)
        if got is None:
            return self.answer(404, b"no such object")
        data, etag = got
        mode = STATE.get("mode", "all")
        want = self.headers.get("If-Match")
        if mode == "all" and want is not None and want != etag and want != "*":
            return self.answer(412, b"precondition failed")
        if mode == "weak_etag" and want is not None and want != "*":
            return self.answer(412, b"precondition failed")
        if STATE.get("no_ranges"):
            rng = None
        fault = None if head or rng is None else take_fault(url.path)
        if fault and fault["kind"] == "status":
            return self.answer(fault["status"], b"injected failure")
        if fault and fault["kind"] == "stall":
            time.sleep(fault["secs"])
        if LATENCY and not head:
            time.sleep(LATENCY)
        size = data.size
        start, end = 0, size
        status = 200
        if rng is not None:
            m = re.fullmatch(r"bytes=(\d*)-(\d*)", rng.strip())
            if not m or (m.group(1) == "" and m.group(2) == ""):
                return self.answer(416, b"bad range")
            if m.group(1) == "":
                start = max(0, size - int(m.group(2)))
            else:
                start = int(m.group(1))
                if m.group(2) != "":
                    end = min(size, int(m.group(2)) + 1)
            if start >= size or start >= end:
                return self.answer(416, b"range not satisfiable")
            status = 206
        body = b"" if head else data.read(start, end)
        kind = fault["kind"] if fault else None
        if kind == "gzip":
            body = gzip.compress(body)
        elif kind == "long":
            body += b"\xa5" * 4096
        self.send_response(status)
        claimed = STATE.get("claims", {}).get(url.path) if head else None
        length = len(body) if kind in ("gzip", "long") else end - start
        chunked = STATE.get("chunked") and not head
        if chunked:
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.send_header("Content-Length", str(length if claimed is None else claimed))
        if kind == "gzip":
            self.send_header("Content-Encoding", "gzip")
        first = STATE["gen"].get(url.path, 0) == 0
        if mode == "all" or (mode == "head_etag" and head) or (mode == "drop_etag" and first):
            self.send_header("ETag", etag)
        if mode == "weak_etag":
            self.send_header("ETag", "W/" + etag)
        if mode in ("all", "drop_etag", "weak_etag"):
            self.send_header("Last-Modified", formatdate(STARTED, usegmt=True))
        elif mode != "none":
            gen = STATE["gen"].get(url.path, 0)
            self.send_header("Last-Modified", formatdate(STARTED + gen, usegmt=True))
        self.send_header("Accept-Ranges", "bytes")
        if status == 206:
            self.send_header("Content-Range", "bytes %d-%d/%d" % (start, end - 1, size))
        self.end_headers()
        if head:
            return
        if fault and fault["kind"] == "drop":
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            self.close_connection = True
            try:
                self.connection.shutdown(2)
            except OSError:
                pass
            return
        if chunked:
            body = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body) if body else b"0\r\n\r\n"
        self.wfile.write(body)

    def answer(self, status, body):
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)


Server = serving.QuietServer


if __name__ == "__main__":
    serving.serve(Server, Handler)
