#!/usr/bin/env python3
"""Demo backends for `make run`: each port answers with its pod name."""
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def serve(name: str, port: int) -> None:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            body = f"{name}\n".encode()
            self.send_response(200)
            self.send_header("content-type", "text/plain")
            self.send_header("x-backend", name)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


if __name__ == "__main__":
    # usage: demo-backends.py pod-a=18081 pod-b=18082 ...
    for spec in sys.argv[1:]:
        name, port = spec.split("=")
        threading.Thread(target=serve, args=(name, int(port)), daemon=True).start()
    print("demo backends:", " ".join(sys.argv[1:]), flush=True)
    threading.Event().wait()
