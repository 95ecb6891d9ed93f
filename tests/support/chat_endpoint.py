"""A real local OpenAI-compatible chat-completions endpoint for the abstractive summary tests.

A ``ThreadingHTTPServer`` on a free port answers ``POST /v1/chat/completions``
like an OpenAI-compatible server: the reply is ``ABSTRACT: `` and the first
evidence line, which is recognisably not an extractive pick. It records every
request (path, headers, JSON body). ``fail=True`` answers 500 to everything.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

PREFIX = "ABSTRACT: "


@dataclass
class ChatEndpoint:
    url: str
    requests: list[dict[str, Any]] = field(default_factory=list)


@contextmanager
def chat_endpoint(*, fail: bool = False, model_reply: str | None = None) -> Iterator[ChatEndpoint]:
    endpoint = ChatEndpoint("")

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass  # keep pytest's output clean

        def do_POST(self) -> None:
            length = int(self.headers.get("content-length", "0"))
            body = json.loads(self.rfile.read(length) or b"{}")
            endpoint.requests.append({"path": self.path, "headers": dict(self.headers), "body": body})
            if fail or self.path != "/v1/chat/completions":
                self.send_response(500 if fail else 404)
                self.end_headers()
                self.wfile.write(b'{"error": {"message": "model unavailable"}}')
                return
            evidence = body["messages"][-1]["content"].splitlines()
            reply = model_reply if model_reply is not None else PREFIX + evidence[0].removeprefix("- ")
            answer = {"id": "chatcmpl-test", "object": "chat.completion", "model": body["model"],
                      "choices": [{"index": 0, "finish_reason": "stop",
                                   "message": {"role": "assistant", "content": reply}}]}
            data = json.dumps(answer).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    endpoint.url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield endpoint
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
