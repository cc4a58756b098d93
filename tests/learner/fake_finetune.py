"""A real local HTTP server speaking the fine-tuning APIs of OpenAI and Together.

Like tests/fakes/openai_server.py, only the remote API is faked, over real HTTP: it keeps what
was uploaded (parsed multipart), answers job creation and status polls (a job runs for
`polls_until_done` polls, then succeeds with a fine-tuned model, unless cancelled), and serves chat completions
for the fine-tuned model through a scripted agent, so the trained name can be run.
"""

from __future__ import annotations

import email.parser
import email.policy
import itertools
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

_ids = itertools.count(1)


@dataclass
class Upload:
    """A file the client uploaded."""

    path: str
    fields: dict[str, str]
    filename: str
    content: bytes

    def rows(self) -> list[dict[str, Any]]:
        """The JSONL rows of the file."""
        return [json.loads(line) for line in self.content.decode().splitlines() if line.strip()]


@dataclass
class FakeFineTuning:
    """The server state; start() serves it in a thread, stop() frees the port."""

    provider: str  # "openai" or "together"
    api_key: str = "sk-test"
    polls_until_done: int = 2
    chat: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    uploads: list[Upload] = field(default_factory=list)
    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)
    chat_bodies: list[dict[str, Any]] = field(default_factory=list)
    unauthorized: int = 0

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        """The /v1 base URL."""
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/v1"

    def start(self) -> FakeFineTuning:
        """Serve in a background thread."""
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving."""
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def __enter__(self) -> FakeFineTuning:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- routes ------------------------------------------------------------------------------

    def _upload(self, path: str, content_type: str, raw: bytes) -> dict[str, Any]:
        message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
            f"Content-Type: {content_type}\r\n\r\n".encode() + raw
        )
        fields: dict[str, str] = {}
        filename, content = "", b""
        for part in message.iter_parts():
            name = part.get_param("name", header="content-disposition")
            if part.get_filename():
                filename, content = part.get_filename(), part.get_payload(decode=True)
            else:
                fields[name] = part.get_content().strip()
        self.uploads.append(Upload(path, fields, filename, content))
        return {"id": f"file-{next(_ids)}", "object": "file", "filename": filename}

    def _create(self, body: dict[str, Any]) -> dict[str, Any]:
        job_id = f"ftjob-{next(_ids)}"
        self.jobs[job_id] = {"body": body, "polls": 0}
        return {"id": job_id, "status": "queued" if self.provider == "openai" else "pending"}

    def _cancel(self, job_id: str) -> tuple[int, dict[str, Any]]:
        job = self.jobs.get(job_id)
        if job is None:
            return 404, {"error": {"message": f"no job {job_id}"}}
        job["cancelled"] = True
        return 200, {"id": job_id, "status": "cancelled"}

    def _status(self, job_id: str) -> tuple[int, dict[str, Any]]:
        job = self.jobs.get(job_id)
        if job is None:
            return 404, {"error": {"message": f"no job {job_id}"}}
        if job.get("cancelled"):
            return 200, {"id": job_id, "status": "cancelled"}
        job["polls"] += 1
        done = job["polls"] > self.polls_until_done
        base = job["body"]["model"]
        suffix = job["body"].get("suffix") or "x"
        if self.provider == "openai":
            return 200, {
                "id": job_id,
                "status": "succeeded" if done else "running",
                "fine_tuned_model": f"ft:{base}:acme:{suffix}:{job_id}" if done else None,
                "trained_tokens": 1234 if done else None,
            }
        return 200, {
            "id": job_id,
            "status": "completed" if done else "running",
            "output_name": f"acme/{base.split('/')[-1]}-{suffix}" if done else None,
            "total_steps": 4,
            "steps_completed": 4 if done else min(4, job["polls"]),
        }

    def _events(self, job_id: str) -> dict[str, Any]:
        job = self.jobs.get(job_id, {"polls": 0})
        step = min(4, job["polls"] + 1)
        return {
            "data": [
                {
                    "type": "metrics",
                    "data": {"step": step, "total_steps": 4, "train_loss": 1 / step},
                }
            ]
        }

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True

            def log_message(self, *args: Any) -> None:
                pass

            def _authorized(self) -> bool:
                if self.headers.get("Authorization") == f"Bearer {fake.api_key}":
                    return True
                fake.unauthorized += 1
                self._send(401, {"error": {"message": "bad key"}})
                return False

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if not self._authorized():
                    return
                path = self.path.split("?")[0]
                with fake._lock:
                    if path in ("/v1/files", "/v1/files/upload"):
                        self._send(200, fake._upload(path, self.headers["Content-Type"], raw))
                    elif path in ("/v1/fine_tuning/jobs", "/v1/fine-tunes"):
                        self._send(200, fake._create(json.loads(raw)))
                    elif path.endswith("/cancel") and path.startswith(
                        ("/v1/fine_tuning/jobs/", "/v1/fine-tunes/")
                    ):
                        self._send(*fake._cancel(path.split("/")[-2]))
                    elif path == "/v1/chat/completions" and fake.chat is not None:
                        body = json.loads(raw)
                        fake.chat_bodies.append(body)
                        self._send(200, fake.chat(body))
                    else:
                        self._send(404, {"error": {"message": f"no route {path}"}})

            def do_GET(self) -> None:
                if not self._authorized():
                    return
                path = self.path.split("?")[0]
                parts = path.strip("/").split("/")
                with fake._lock:
                    if path.startswith("/v1/fine_tuning/jobs/") and parts[-1] == "events":
                        self._send(200, fake._events(parts[-2]))
                    elif path.startswith(("/v1/fine_tuning/jobs/", "/v1/fine-tunes/")):
                        self._send(*fake._status(parts[-1]))
                    else:
                        self._send(404, {"error": {"message": f"no route {path}"}})

            def _send(self, status: int, body: dict[str, Any]) -> None:
                payload = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        return Handler
