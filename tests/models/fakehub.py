"""A hub on loopback for the online path of reasonrl.models.hub: the few routes huggingface_hub's
snapshot_download and list_repo_files call (repo info, tree, resolve), from files in memory, with
every request logged. Only the network is made up: the client code is huggingface_hub's own."""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlparse


class FakeHub:
    def __init__(self) -> None:
        self.repos: dict[tuple[str, str], tuple[str, dict[str, bytes]]] = {}  # (kind, repo id) → (commit, files)
        self.requests: list[str] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # (quiet)
                pass

            def do_HEAD(self) -> None:
                hub.serve(self, body=False)

            def do_GET(self) -> None:
                hub.serve(self, body=True)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def add(self, kind: str, repo_id: str, commit: str, files: dict[str, bytes]) -> None:
        self.repos[(kind, repo_id)] = (commit, files)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _reply(self, h: BaseHTTPRequestHandler, code: int, data: bytes, headers: dict[str, str], body: bool) -> None:
        h.send_response(code)
        for k, v in {"Content-Length": str(len(data)), **headers}.items():
            h.send_header(k, v)
        h.end_headers()
        if body:
            h.wfile.write(data)

    def _repo(self, kind: str, repo_id: str, rev: str) -> tuple[str, dict[str, bytes]] | str:
        if (kind, repo_id) not in self.repos:
            return "RepoNotFound"
        commit, files = self.repos[(kind, repo_id)]
        return (commit, files) if rev in ("main", commit) else "RevisionNotFound"

    def serve(self, h: BaseHTTPRequestHandler, body: bool) -> None:
        path = unquote(urlparse(h.path).path)
        self.requests.append(f"{h.command} {path}")
        parts = path.strip("/").split("/")
        json_headers = {"Content-Type": "application/json"}
        if parts[0] == "api":  # /api/{models,datasets}/ORG/NAME/{revision,tree}/REV[/...]
            kind, repo_id, what, rev = parts[1].rstrip("s"), "/".join(parts[2:4]), parts[4], parts[5]
            found = self._repo(kind, repo_id, rev)
            if isinstance(found, str):
                return self._reply(h, 404, b"{}", {**json_headers, "X-Error-Code": found, "X-Error-Message": found}, body)
            commit, files = found
            if what == "revision":
                doc = {"id": repo_id, "sha": commit, "siblings": [{"rfilename": p} for p in files], "private": False}
            else:
                doc = [{"type": "file", "path": p, "size": len(b), "oid": hashlib.sha1(b).hexdigest()} for p, b in files.items()]
            return self._reply(h, 200, json.dumps(doc).encode(), json_headers, body)
        kind = "dataset" if parts[0] == "datasets" else "model"  # /[datasets/]ORG/NAME/resolve/REV/FILE
        parts = parts[1:] if kind == "dataset" else parts
        repo_id, rev, name = "/".join(parts[0:2]), parts[3], "/".join(parts[4:])
        found = self._repo(kind, repo_id, rev)
        if isinstance(found, str) or name not in found[1]:
            code = found if isinstance(found, str) else "EntryNotFound"
            return self._reply(h, 404, b"", {"X-Error-Code": code, "X-Error-Message": code}, body)
        commit, files = found
        data = files[name]
        return self._reply(h, 200, data, {"X-Repo-Commit": commit, "ETag": f'"{hashlib.sha256(data).hexdigest()}"',
                                          "Content-Type": "application/octet-stream"}, body)
