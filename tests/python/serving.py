"""How the tests' HTTP servers run (range_server.py, tls_server.py,
fake_hub.py): on 127.0.0.1 at a port the system picks, printed as
`PORT N` on stdout, until stdin closes, which happens when the test that
started the server ends, however it ends."""

import sys
import threading
from http.server import ThreadingHTTPServer


class QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        # A client that went away (a dropped body, a timeout, a killed
        # mount) is part of the tests, not news.
        pass


def serve(server_class, handler):
    srv = server_class(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    print("PORT %d" % srv.server_address[1], flush=True)
    sys.stdin.read()
    srv.shutdown()
