"""A fake Hugging Face Hub for tests: a threaded HTTP server on 127.0.0.1 with switchable faults.

It serves the subset of the Hub API that huggingface_hub and studio.core.hub call:
``GET /api/models`` (search, Link paging), ``GET /api/models/{repo}[/revision/{rev}]``,
``GET /api/models/{repo}/tree/{rev}[/{path}]`` and ``HEAD``/``GET /{repo}/resolve/{rev}/{file}``
with ``X-Repo-Commit``, ``ETag``, ``X-Linked-Etag``, ``X-Linked-Size``, ``Content-Length`` and
``Range``. LFS files can be served through a redirect to ``/cdn/<sha256>`` on another host name
(``localhost`` instead of ``127.0.0.1``), as the real Hub redirects to its CDN.

Faults (``hub.add_fault(Fault(...))``) apply to requests whose path matches a glob, a number of
times: ``drop`` (close after N body bytes, optionally with a TCP reset), ``ignore_range`` (200 with
the whole body), ``short`` (declare and send k bytes fewer), ``flip`` (one byte inverted), ``status``
(429/5xx with headers such as Retry-After), ``slow`` (a pause per chunk), ``stall`` (a pause before
the body) and ``huge`` (a huge declared size). Every request is recorded in ``hub.requests``.

Uploads go through the endpoints huggingface_hub's ``HfApi`` calls (checked against its 2.x sources):
``POST /api/repos/create``, ``DELETE /api/repos/delete``, ``POST /api/validate-yaml``,
``POST /api/models/{repo}/preupload/{rev}``, the Git LFS batch API
``POST /{repo}.git/info/lfs/objects/batch`` (basic or multipart transfer), ``PUT`` of the bytes to a
separate storage host (``localhost``, as S3 is elsewhere; one ``PUT`` per part and a completion
``POST`` for multipart), ``POST /{repo}.git/info/lfs/objects/verify`` and the ndjson
``POST /api/models/{repo}/commit/{rev}``, which applies every operation at once or none. Writes need
a token from ``hub.write_tokens`` whose namespaces include the repository's (401 without a valid
token, 403 for another namespace). The ``drop_request`` fault closes the connection after reading
``after_bytes`` of a request body, without an answer; ``drop_response`` does the work and then
loses the answer (a commit that landed although the client saw the connection drop).
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import random
import re
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlencode, urlsplit

# -- repository content --------------------------------------------------------------------------


def git_blob_id(data: bytes) -> str:
    """The git blob sha1 the Hub uses as ETag of a non-LFS file."""
    return hashlib.sha1(b"blob %d\x00" % len(data) + data).hexdigest()


def make_safetensors(hidden: int = 256, seed: int = 0) -> tuple[bytes, int]:
    """A small valid safetensors file (F32) and its parameter count."""
    rng = random.Random(seed)
    tensors = [("model.embed_tokens.weight", [hidden, hidden]), ("model.norm.weight", [hidden])]
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    n_params = 0
    for name, shape in tensors:
        n = 1
        for d in shape:
            n *= d
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + 4 * n]}
        offset += 4 * n
        n_params += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    body = struct.pack(f"<{offset // 4}f", *(rng.uniform(-1, 1) for _ in range(offset // 4)))
    return struct.pack("<Q", len(raw)) + raw + body, n_params


def make_gguf(file_type: int, pad: int = 4096) -> bytes:
    """A minimal GGUF v3 header (no tensors) with ``general.architecture`` and ``general.file_type``."""

    def s(text: str) -> bytes:
        b = text.encode()
        return struct.pack("<Q", len(b)) + b

    kv = s("general.architecture") + struct.pack("<I", 8) + s("llama")
    kv += s("general.file_type") + struct.pack("<I", 4) + struct.pack("<I", file_type)
    return b"GGUF" + struct.pack("<IQQ", 3, 0, 2) + kv + bytes(pad)


CARD = """---
license: apache-2.0
pipeline_tag: text-generation
tags:
- llama
- tiny
---
# Tiny Llama

A **tiny** Llama-shaped model used by the Quant Studio tests.

| property | value |
|---|---|
| layers | 2 |
| hidden | 256 |
"""

CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "vocab_size": 256,
    "max_position_embeddings": 4096,
    "torch_dtype": "float32",
}


@dataclass
class FakeRepo:
    """One model repository: files (name -> bytes), which of them are LFS, and the metadata the API shows."""

    repo_id: str
    files: dict[str, bytes]
    lfs: set[str] = field(default_factory=set)
    downloads: int = 0
    likes: int = 0
    last_modified: str = "2025-01-01T00:00:00.000Z"
    pipeline_tag: str | None = "text-generation"
    library_name: str | None = "transformers"
    tags: list[str] = field(default_factory=list)
    gated: str | bool = False
    private: bool = False
    card_data: dict[str, Any] | None = None
    safetensors_params: int | None = None  # shown in model_info (None: clients must read headers)
    gguf_total: int | None = None

    n_commits: int = 0  # commits made through the fake's commit endpoint

    @property
    def commit(self) -> str:
        seed = "commit:" + self.repo_id + (f":{self.n_commits}" if self.n_commits else "")
        return hashlib.sha1(seed.encode()).hexdigest()

    def sha256(self, name: str) -> str:
        return hashlib.sha256(self.files[name]).hexdigest()

    def etag(self, name: str) -> str:
        return self.sha256(name) if name in self.lfs else git_blob_id(self.files[name])


def default_repos() -> dict[str, FakeRepo]:
    """The repositories the fake Hub serves unless a test adds its own."""
    st, n_params = make_safetensors()
    tokenizer = json.dumps({"version": "1.0", "model": {"type": "BPE", "vocab": {"a": 0, "b": 1}}}).encode()
    llama = FakeRepo(
        "tiny-org/tiny-llama",
        files={
            "README.md": CARD.encode(),
            "config.json": json.dumps(CONFIG, indent=2).encode(),
            "tokenizer.json": tokenizer,
            "tokenizer_config.json": b'{"model_max_length": 4096}',
            "model.safetensors": st,
        },
        lfs={"model.safetensors"},
        downloads=1500,
        likes=12,
        last_modified="2025-03-01T10:00:00.000Z",
        tags=["transformers", "safetensors", "llama", "text-generation", "license:apache-2.0"],
        card_data={"license": "apache-2.0", "pipeline_tag": "text-generation"},
        safetensors_params=n_params,
    )
    gguf = FakeRepo(
        "tiny-org/tiny-llama-GGUF",
        files={
            "README.md": b"# Tiny Llama GGUF\n\nQuantized files.\n",
            "tiny-llama-Q4_K_M.gguf": make_gguf(15),
            "tiny-llama-IQ4_XS.gguf": make_gguf(30),
            "tiny-llama-F16.gguf": make_gguf(1),
        },
        lfs={"tiny-llama-Q4_K_M.gguf", "tiny-llama-IQ4_XS.gguf", "tiny-llama-F16.gguf"},
        downloads=800,
        likes=30,
        last_modified="2025-05-01T10:00:00.000Z",
        library_name="gguf",
        tags=["gguf", "llama", "text-generation"],
        gguf_total=n_params,
    )
    gated = FakeRepo(
        "gated-org/gated-llama",
        files={"config.json": json.dumps(CONFIG).encode(), "model.safetensors": st},
        lfs={"model.safetensors"},
        downloads=50,
        likes=3,
        gated="manual",
        tags=["transformers", "llama"],
        safetensors_params=n_params,
    )
    bert = FakeRepo(
        "other-org/bert-mini",
        files={"config.json": b'{"model_type": "bert"}', "README.md": b"# bert mini\n"},
        downloads=90000,
        likes=1,
        last_modified="2024-01-01T00:00:00.000Z",
        pipeline_tag="feature-extraction",
        library_name="sentence-transformers",
        tags=["sentence-transformers", "bert"],
    )
    return {r.repo_id: r for r in (llama, gguf, gated, bert)}


# -- faults and the request log --------------------------------------------------------------------


@dataclass
class Fault:
    """A misbehaviour applied to matching requests, ``times`` times (None: always)."""

    kind: str  # drop | ignore_range | short | flip | status | slow | stall | huge | drop_request | drop_response
    path: str = "*"  # fnmatch glob over the decoded request path
    times: int | None = 1
    methods: tuple[str, ...] = ("GET",)
    after_bytes: int = 0  # drop: body bytes sent before the connection goes away
    reset: bool = False  # drop: RST instead of FIN
    missing: int = 16  # short: bytes left out (and left out of Content-Length)
    offset: int = 100  # flip: file offset of the inverted byte
    status: int = 429  # status
    headers: dict[str, str] = field(default_factory=dict)  # status: e.g. {"Retry-After": "1"}
    delay: float = 0.01  # slow: seconds per chunk; stall: seconds before the body
    chunk: int = 16384  # slow: bytes per chunk
    size: int = 60 * 10**9  # huge: the declared size
    used: int = 0


@dataclass(frozen=True)
class RequestRecord:
    """One request the fake Hub received."""

    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    host: str

    @property
    def range(self) -> str | None:
        return self.headers.get("range")

    @property
    def authorization(self) -> str | None:
        return self.headers.get("authorization")


class FakeHub:
    """The server; use as a context manager, then point ``HF_ENDPOINT`` at ``hub.url``."""

    def __init__(self, repos: dict[str, FakeRepo] | None = None) -> None:
        self.repos = repos if repos is not None else default_repos()
        self.faults: list[Fault] = []
        self.requests: list[RequestRecord] = []
        self.tokens = {"hf_good_token"}  # tokens that may read gated/private repos
        self.redirect_lfs = False
        self.page_size = 1000
        self.server_errors: list[str] = []
        self.list_blobs = True  # False: model_info lists names only, so clients must HEAD each file
        self.unreachable = False  # True: every request is answered by closing the connection
        # Globs of paths answered 403 with the request's Authorization header echoed in the message
        # and the body (a careless proxy or server), to check that no error sentence repeats the token.
        self.echo_auth_paths: list[str] = []
        # Uploads: token -> namespaces it may write to; LFS objects by sha256; multipart above a size.
        self.write_tokens: dict[str, set[str]] = {"hf_write_token": {"alice", "alice-org"}}
        self.lfs_objects: dict[str, bytes] = {}
        self.multipart_threshold: int | None = None
        self.part_size = 64 * 1024
        self._parts: dict[tuple[str, int], bytes] = {}
        self.commits: list[dict[str, Any]] = []  # every applied commit: repo, summary, operations
        self.deleted_repos: list[str] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- life --
    def start(self) -> FakeHub:
        hub = self

        class Handler(_Handler):
            fake = hub

        class Server(ThreadingHTTPServer):
            def handle_error(self, request: Any, client_address: Any) -> None:
                # Clients that hang up mid-answer (cancel, timeout tests) are expected; keep stderr clean.
                import traceback

                hub.server_errors.append(traceback.format_exc())

        self._server = Server(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self.unreachable = True  # kept-alive client connections must fail too, not keep working
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FakeHub:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        assert self._server is not None
        return self._server.server_address[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # -- helpers for tests --
    def add_fault(self, fault: Fault) -> Fault:
        with self._lock:
            self.faults.append(fault)
        return fault

    def clear(self) -> None:
        with self._lock:
            self.faults.clear()
            self.requests.clear()

    def take_fault(self, kind: str, method: str, path: str) -> Fault | None:
        with self._lock:
            for f in self.faults:
                if f.kind != kind or method not in f.methods or not fnmatch.fnmatch(path, f.path):
                    continue
                if f.times is not None and f.used >= f.times:
                    continue
                f.used += 1
                return f
        return None

    def peek_fault(self, kind: str, path: str) -> Fault | None:
        with self._lock:
            for f in self.faults:
                if f.kind == kind and fnmatch.fnmatch(path, f.path) and (f.times is None or f.used < f.times):
                    return f
        return None

    def file_requests(self, name: str, method: str = "GET") -> list[RequestRecord]:
        """GET requests (resolve or CDN) that fetched file ``name``, in order."""
        out = []
        for r in list(self.requests):
            if r.method != method:
                continue
            if "/resolve/" in r.path and r.path.endswith("/" + name):
                out.append(r)
            elif r.path.startswith("/cdn/"):
                sha = r.path.rsplit("/", 1)[-1]
                if any(name in repo.files and repo.sha256(name) == sha for repo in self.repos.values()):
                    out.append(r)
        return out


class _WriteMixin:
    """The upload side of the fake Hub (see the module docstring)."""

    # -- request bodies --
    def _read_body(self, limit: int | None = None) -> bytes:
        """The request body (Content-Length or chunked), or its first ``limit`` bytes."""
        if (self.headers.get("Transfer-Encoding") or "").lower() == "chunked":
            out = bytearray()
            while limit is None or len(out) < limit:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    self.rfile.readline()
                    break
                out += self.rfile.read(size)
                self.rfile.readline()
            return bytes(out if limit is None else out[:limit])
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n if limit is None else min(n, limit))

    def _hang_up(self, reset: bool = False) -> None:
        """Close the connection without (the rest of) an answer: FIN, or RST with ``reset``."""
        self.close_connection = True
        if reset:
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            return
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _drop(self, fault: Fault) -> None:
        self._read_body(fault.after_bytes)
        self._hang_up(fault.reset)

    def _write_token(self) -> str | None:
        """The bearer token if it is valid; answers 401 itself (and returns None) when not."""
        token = (self.headers.get("Authorization") or "").removeprefix("Bearer ").strip()
        if token and (token in self.fake.write_tokens or token in self.fake.tokens):
            return token
        if token:
            self._error(401, "", "Invalid credentials in Authorization header")
        else:
            self._error(401, "", "Invalid username or password.")
        return None

    def _may_write(self, namespace: str) -> bool:
        token = self._write_token()
        if token is None:
            return False
        if namespace in self.fake.write_tokens.get(token, set()):
            return True
        self._error(
            403, "", f'You don\'t have the rights to create a model under the namespace "{namespace}"'
        )
        return False

    def _json_body(self, raw: bytes) -> Any:
        try:
            return json.loads(raw or b"{}")
        except ValueError:
            self._error(400, "", "invalid JSON body")
            return None

    # -- dispatch --
    def _write_dispatch(self, path: str, query: dict[str, list[str]]) -> None:
        fake = self.fake
        drop = fake.take_fault("drop_request", self.command, path)
        if drop is not None:
            return self._drop(drop)
        self._mute = fake.take_fault("drop_response", self.command, path) is not None
        if path.startswith("/lfs-storage/"):  # the storage host streams its own bodies
            return self._storage(path)
        raw = self._read_body()
        if self._status_fault(path):
            return
        if path == "/api/repos/create" and self.command == "POST":
            return self._create_repo(raw)
        if path == "/api/repos/delete" and self.command == "DELETE":
            return self._delete_repo(raw)
        if path == "/api/validate-yaml" and self.command == "POST":
            return self._validate_yaml(raw)
        if path.startswith("/api/complete-multipart/") and self.command == "POST":
            return self._complete_multipart(path.rsplit("/", 1)[-1], raw)
        if path.startswith("/api/models/") and self.command == "POST":
            rest = path[len("/api/models/") :].split("/")
            repo_id, verb = "/".join(rest[:2]), (rest[2] if len(rest) > 2 else "")
            if verb == "preupload":
                return self._preupload(repo_id, raw)
            if verb == "commit":
                return self._commit(repo_id, raw)
        if ".git/info/lfs/objects/" in path and self.command == "POST":
            repo_id, _, action = path.strip("/").partition(".git/info/lfs/objects/")
            if action == "batch":
                return self._lfs_batch(repo_id, raw)
            if action == "verify":
                return self._lfs_verify(raw)
        self._error(404, "", f"no such endpoint: {self.command} {path}")

    def _repo_for_write(self, repo_id: str) -> FakeRepo | None:
        repo = self.fake.repos.get(repo_id)
        if repo is None:
            self._error(404, "RepoNotFound", "Repository not found")
            return None
        if not self._may_write(repo_id.split("/")[0]):
            return None
        return repo

    # -- repositories --
    def _create_repo(self, raw: bytes) -> None:
        body = self._json_body(raw)
        if body is None:
            return
        name, org = body.get("name"), body.get("organization")
        repo_id = f"{org}/{name}" if org else str(name)
        if not self._may_write(repo_id.split("/")[0]):
            return
        if repo_id in self.fake.repos:
            return self._send(
                409,
                json.dumps(
                    {"error": "You already created this model repo", "url": f"{self.fake.url}/{repo_id}"}
                ).encode(),
            )
        private = body.get("private") or body.get("visibility") == "private"
        self.fake.repos[repo_id] = FakeRepo(repo_id, files={}, private=bool(private), tags=[])
        self._json({"url": f"{self.fake.url}/{repo_id}", "name": repo_id, "id": repo_id})

    def _delete_repo(self, raw: bytes) -> None:
        body = self._json_body(raw)
        if body is None:
            return
        repo_id = (
            f"{body['organization']}/{body['name']}" if body.get("organization") else str(body.get("name"))
        )
        if self._repo_for_write(repo_id) is None:
            return
        del self.fake.repos[repo_id]
        self.fake.deleted_repos.append(repo_id)
        self._json({})

    def _validate_yaml(self, raw: bytes) -> None:
        import yaml

        body = self._json_body(raw)
        if body is None:
            return
        content = str(body.get("content") or "")
        m = re.match(r"---\n(.*?)\n---\n", content, re.S)
        errors = []
        if m:
            try:
                meta = yaml.safe_load(m.group(1))
                if not isinstance(meta, dict):
                    errors.append({"message": "metadata must be a mapping"})
            except yaml.YAMLError as err:
                errors.append({"message": f"invalid YAML: {err}"})
        if errors:
            return self._send(400, json.dumps({"errors": errors, "warnings": []}).encode())
        self._json({"errors": [], "warnings": []})

    # -- upload --
    def _preupload(self, repo_id: str, raw: bytes) -> None:
        repo = self._repo_for_write(repo_id)
        body = self._json_body(raw) if repo is not None else None
        if body is None:
            return
        files = []
        for f in body.get("files", []):
            p = f["path"]
            lfs = p.endswith((".gguf", ".safetensors", ".bin")) or int(f["size"]) > 10 * 1024 * 1024
            oid = repo.etag(p) if p in repo.files else None
            files.append(
                {"path": p, "uploadMode": "lfs" if lfs else "regular", "shouldIgnore": False, "oid": oid}
            )
        self._json({"files": files, "commitOid": repo.commit})

    def _lfs_batch(self, repo_id: str, raw: bytes) -> None:
        repo = self._repo_for_write(repo_id)
        body = self._json_body(raw) if repo is not None else None
        if body is None:
            return
        storage = f"http://localhost:{self.fake.port}/lfs-storage"
        objects = []
        for o in body.get("objects", []):
            oid, size = o["oid"], int(o["size"])
            entry: dict[str, Any] = {"oid": oid, "size": size, "authenticated": True}
            if oid not in self.fake.lfs_objects:
                verify = {"href": f"{self.fake.url}/{repo_id}.git/info/lfs/objects/verify", "header": {}}
                th = self.fake.multipart_threshold
                if th is not None and size > th:
                    n = -(-size // self.fake.part_size)
                    header = {str(i + 1): f"{storage}/{oid}/part/{i + 1}" for i in range(n)}
                    header["chunk_size"] = str(self.fake.part_size)
                    upload = {"href": f"{self.fake.url}/api/complete-multipart/{oid}", "header": header}
                else:
                    upload = {"href": f"{storage}/{oid}", "header": {}}
                entry["actions"] = {"upload": upload, "verify": verify}
            objects.append(entry)
        self._json({"transfer": "basic", "objects": objects, "hash_algo": "sha256"})

    def _storage(self, path: str) -> None:
        # Like S3 behind a presigned URL: no Hub token is needed, and none should arrive here.
        if self.command != "PUT":
            return self._error(405, "", "storage accepts PUT only")
        body = self._read_body()
        if self._status_fault(path):
            return
        rest = path[len("/lfs-storage/") :].split("/")
        oid = rest[0]
        if len(rest) == 3 and rest[1] == "part":
            self.fake._parts[(oid, int(rest[2]))] = body
            etag = hashlib.md5(body).hexdigest()
            return self._send(200, b"", {"ETag": f'"{etag}"'})
        if hashlib.sha256(body).hexdigest() != oid:
            return self._error(400, "BadDigest", "the uploaded bytes do not match the oid")
        self.fake.lfs_objects[oid] = body
        self._send(200, b"")

    def _complete_multipart(self, oid: str, raw: bytes) -> None:
        body = self._json_body(raw)
        if body is None:
            return
        parts = sorted(body.get("parts", []), key=lambda x: x["partNumber"])
        data = bytearray()
        for part in parts:
            chunk = self.fake._parts.get((oid, part["partNumber"]))
            if chunk is None or f'"{hashlib.md5(chunk).hexdigest()}"' != part["etag"]:
                return self._error(
                    400, "InvalidPart", f"part {part['partNumber']} is missing or its etag differs"
                )
            data += chunk
        if hashlib.sha256(data).hexdigest() != oid:
            return self._error(400, "BadDigest", "the assembled parts do not match the oid")
        self.fake.lfs_objects[oid] = bytes(data)
        self._json({"oid": oid})

    def _lfs_verify(self, raw: bytes) -> None:
        if self._write_token() is None:
            return
        body = self._json_body(raw)
        if body is None:
            return
        data = self.fake.lfs_objects.get(body.get("oid"))
        if data is None or len(data) != int(body.get("size", -1)):
            return self._error(404, "", "object not found or of another size")
        self._json({"oid": body["oid"], "size": len(data)})

    def _commit(self, repo_id: str, raw: bytes) -> None:
        import base64

        repo = self._repo_for_write(repo_id)
        if repo is None:
            return
        files = dict(repo.files)
        lfs = set(repo.lfs)
        summary, ops = "", []
        for line in raw.splitlines():
            if not line.strip():
                continue
            item = json.loads(line)
            key, value = item["key"], item["value"]
            if key == "header":
                summary = value.get("summary", "")
            elif key == "file":
                files[value["path"]] = base64.b64decode(value["content"])
                lfs.discard(value["path"])
                ops.append(("file", value["path"]))
            elif key == "lfsFile":
                data = self.fake.lfs_objects.get(value["oid"])
                if data is None or ("size" in value and len(data) != int(value["size"])):
                    return self._error(
                        422, "", f"LFS object {value['oid']} for {value['path']} was never uploaded"
                    )
                files[value["path"]] = data
                lfs.add(value["path"])
                ops.append(("lfsFile", value["path"]))
            elif key == "deletedFile":
                files.pop(value["path"], None)
                lfs.discard(value["path"])
                ops.append(("deletedFile", value["path"]))
            else:
                return self._error(400, "", f"unknown commit operation {key!r}")
        repo.files, repo.lfs = files, lfs  # all at once: a commit that failed above changed nothing
        repo.n_commits += 1
        self.fake.commits.append({"repo": repo_id, "summary": summary, "operations": ops})
        self._json(
            {
                "commitUrl": f"{self.fake.url}/{repo_id}/commit/{repo.commit}",
                "commitOid": repo.commit,
                "success": True,
            }
        )


class _Handler(_WriteMixin, BaseHTTPRequestHandler):
    fake: FakeHub
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - silence the default stderr log
        pass

    # -- plumbing --
    def _record(self) -> tuple[str, dict[str, list[str]]]:
        parts = urlsplit(self.path)
        path = unquote(parts.path)
        query = parse_qs(parts.query)
        host = (self.headers.get("Host") or "").split(":")[0]
        self.fake.requests.append(
            RequestRecord(self.command, path, query, {k.lower(): v for k, v in self.headers.items()}, host)
        )
        return path, query

    def _send(
        self,
        status: int,
        body: bytes = b"",
        headers: dict[str, str] | None = None,
        ctype: str = "application/json",
    ) -> None:
        if getattr(self, "_mute", False):  # drop_response: the work is done, the answer is lost
            return self._hang_up()
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, obj: Any, headers: dict[str, str] | None = None) -> None:
        self._send(200, json.dumps(obj).encode(), headers)

    def _error(self, status: int, code: str, message: str) -> None:
        body = json.dumps({"error": message}).encode()
        self._send(status, body, {"X-Error-Code": code, "X-Error-Message": message})

    def _status_fault(self, path: str) -> bool:
        f = self.fake.take_fault("status", self.command, path)
        if f is None:
            return False
        body = json.dumps({"error": f"fake status {f.status}"}).encode()
        self._send(f.status, body, dict(f.headers))
        return True

    def _auth(self, repo: FakeRepo) -> bool:
        """Whether the request may read ``repo``'s files; answers the error itself when not."""
        if not repo.gated and not repo.private:
            return True
        auth = self.headers.get("Authorization") or ""
        token = auth.removeprefix("Bearer ").strip()
        if token in self.fake.tokens or token in self.fake.write_tokens:
            return True
        if repo.private:
            if token:
                self._error(401, "", "Invalid credentials in Authorization header")
            else:
                self._error(401, "RepoNotFound", "Repository not found")
            return False
        if not token:
            self._error(
                401, "GatedRepo", f"Access to model {repo.repo_id} is restricted. You must be authenticated."
            )
        else:
            self._error(
                403,
                "GatedRepo",
                f"Access to model {repo.repo_id} is restricted and you are not in the authorized list.",
            )
        return False

    def do_HEAD(self) -> None:  # noqa: N802
        self._dispatch()

    def do_GET(self) -> None:  # noqa: N802
        self._dispatch()

    def do_POST(self) -> None:  # noqa: N802
        self._dispatch()

    def do_PUT(self) -> None:  # noqa: N802
        self._dispatch()

    def do_DELETE(self) -> None:  # noqa: N802
        self._dispatch()

    def _dispatch(self) -> None:
        path, query = self._record()
        if self.fake.unreachable:
            # Like a dead network: the connection goes away without an answer (kept-alive ones too).
            return self._hang_up()
        if self.command in ("POST", "PUT", "DELETE"):
            try:
                return self._write_dispatch(path, query)
            except (BrokenPipeError, ConnectionResetError):
                return
        try:
            if self._status_fault(path):
                return
            auth = self.headers.get("Authorization")
            if auth and any(fnmatch.fnmatch(path, g) for g in self.fake.echo_auth_paths):
                msg = f"Authorization header {auth!r} is not allowed for {path}"
                body = json.dumps({"error": msg}).encode()
                return self._send(403, body, {"X-Error-Code": "Forbidden", "X-Error-Message": msg})
            if path.startswith("/api/"):
                stall = self.fake.take_fault("stall", self.command, path)
                if stall is not None:
                    time.sleep(stall.delay)  # a metadata call that hangs (HF_HUB_ETAG_TIMEOUT)
            if path == "/api/models":
                return self._search(query)
            if path.startswith("/api/models/"):
                return self._api_model(path[len("/api/models/") :], query)
            if path.startswith("/cdn/"):
                return self._cdn(path)
            if "/resolve/" in path:
                return self._resolve(path)
            self._error(404, "", "not found")
        except (BrokenPipeError, ConnectionResetError):
            pass

    # -- API --
    def _model_json(self, repo: FakeRepo, blobs: bool) -> dict[str, Any]:
        siblings = []
        for name in sorted(repo.files):
            entry: dict[str, Any] = {"rfilename": name}
            if blobs and self.fake.list_blobs:
                size = len(repo.files[name])
                huge = self.fake.peek_fault("huge", f"/{repo.repo_id}/resolve/{repo.commit}/{name}")
                if huge is not None:
                    size = huge.size
                entry["size"] = size
                entry["blobId"] = git_blob_id(repo.files[name])
                if name in repo.lfs:
                    entry["lfs"] = {"size": size, "sha256": repo.sha256(name), "pointerSize": 134}
            siblings.append(entry)
        data: dict[str, Any] = {
            "_id": hashlib.md5(repo.repo_id.encode()).hexdigest()[:24],
            "id": repo.repo_id,
            "modelId": repo.repo_id,
            "author": repo.repo_id.split("/")[0],
            "sha": repo.commit,
            "lastModified": repo.last_modified,
            "createdAt": "2024-06-01T00:00:00.000Z",
            "private": repo.private,
            "gated": repo.gated,
            "disabled": False,
            "downloads": repo.downloads,
            "likes": repo.likes,
            "library_name": repo.library_name,
            "pipeline_tag": repo.pipeline_tag,
            "tags": list(repo.tags),
            "siblings": siblings,
        }
        if repo.card_data is not None:
            data["cardData"] = dict(repo.card_data)
        if repo.safetensors_params is not None:
            data["safetensors"] = {
                "parameters": {"F32": repo.safetensors_params},
                "total": repo.safetensors_params,
            }
        if repo.gguf_total is not None:
            data["gguf"] = {"total": repo.gguf_total, "architecture": "llama", "context_length": 4096}
        return data

    def _search(self, query: dict[str, list[str]]) -> None:
        text = (query.get("search") or [""])[0].lower()
        task = (query.get("pipeline_tag") or [None])[0]
        filters = query.get("filter") or []
        sort = (query.get("sort") or ["downloads"])[0]
        limit = int((query.get("limit") or ["1000"])[0])
        cursor = int((query.get("cursor") or ["0"])[0])
        hits = [
            r
            for r in self.fake.repos.values()
            if not r.private
            and text in r.repo_id.lower()
            and (task is None or r.pipeline_tag == task)
            and all(f in r.tags or f == r.library_name for f in filters)
        ]
        key = {
            "downloads": lambda r: r.downloads,
            "likes": lambda r: r.likes,
            "lastModified": lambda r: r.last_modified,
        }
        hits.sort(key=key.get(sort, key["downloads"]), reverse=True)
        page = min(limit, self.fake.page_size)
        chunk = hits[cursor : cursor + page]
        items = []
        for r in chunk:
            d = self._model_json(r, blobs=False)
            d.pop("siblings")
            items.append(d)
        headers = {}
        if cursor + page < len(hits):
            q = {k: v for k, v in query.items() if k != "cursor"}
            q["cursor"] = [str(cursor + page)]
            headers["Link"] = f'<{self.fake.url}/api/models?{urlencode(q, doseq=True)}>; rel="next"'
        self._json(items, headers)

    def _api_model(self, rest: str, query: dict[str, list[str]]) -> None:
        parts = rest.split("/")
        repo_id = "/".join(parts[:2])
        repo = self.fake.repos.get(repo_id)
        if repo is None or (repo.private and not self._auth(repo)):
            if repo is None:
                self._error(404, "RepoNotFound", "Repository not found")
            return
        tail = parts[2:]
        blobs = (query.get("blobs") or ["false"])[0].lower() == "true"
        if not tail:
            return self._json(self._model_json(repo, blobs))
        if tail[0] == "revision" and len(tail) >= 2:
            if not self._rev_ok(repo, tail[1]):
                return
            return self._json(self._model_json(repo, blobs))
        if tail[0] == "tree" and len(tail) >= 2:
            if not self._rev_ok(repo, tail[1]):
                return
            prefix = "/".join(tail[2:])
            entries = []
            for name in sorted(repo.files):
                if prefix and not name.startswith(prefix + "/"):
                    continue
                entry: dict[str, Any] = {
                    "type": "file",
                    "oid": git_blob_id(repo.files[name]),
                    "size": len(repo.files[name]),
                    "path": name,
                }
                if name in repo.lfs:
                    entry["lfs"] = {
                        "oid": repo.sha256(name),
                        "size": len(repo.files[name]),
                        "pointerSize": 134,
                    }
                entries.append(entry)
            return self._json(entries)
        self._error(404, "", "not found")

    def _rev_ok(self, repo: FakeRepo, rev: str) -> bool:
        if rev in ("main", repo.commit):
            return True
        self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
        return False

    # -- files --
    def _resolve(self, path: str) -> None:
        before, _, after = path.partition("/resolve/")
        repo_id = before.strip("/")
        repo = self.fake.repos.get(repo_id)
        if repo is None:
            return self._error(404, "RepoNotFound", "Repository not found")
        rev, _, name = after.partition("/")
        if not self._rev_ok(repo, rev):
            return
        if name not in repo.files:
            return self._error(404, "EntryNotFound", f"{name} does not exist")
        if not self._auth(repo):
            return
        data = repo.files[name]
        etag = repo.etag(name)
        size = len(data)
        huge = self.fake.take_fault("huge", self.command, path)
        if huge is None and self.command == "HEAD":
            huge = self.fake.peek_fault("huge", path)
        headers = {"X-Repo-Commit": repo.commit, "ETag": f'"{etag}"', "Accept-Ranges": "bytes"}
        if name in repo.lfs:
            headers["X-Linked-Etag"] = f'"{etag}"'
            headers["X-Linked-Size"] = str(huge.size if huge else size)
            if self.fake.redirect_lfs:
                location = f"http://localhost:{self.fake.port}/cdn/{quote(etag)}"
                self.send_response(302)
                self.send_header("Location", location)
                self.send_header("Content-Length", "0")
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                return
        self._body(path, data, headers, declared=huge.size if huge else None)

    def _cdn(self, path: str) -> None:
        sha = path.rsplit("/", 1)[-1]
        for repo in self.fake.repos.values():
            for name in repo.lfs:
                if repo.sha256(name) == sha:
                    return self._body(path, repo.files[name], {"ETag": f'"{sha}"', "Accept-Ranges": "bytes"})
        self._error(404, "", "no such object")

    def _body(self, path: str, data: bytes, headers: dict[str, str], declared: int | None = None) -> None:
        fake = self.fake
        size = len(data)
        start, end = 0, size - 1
        status = 200
        rng = self.headers.get("Range")
        if rng and fake.take_fault("ignore_range", self.command, path) is None:
            spec = rng.strip().removeprefix("bytes=")
            a, _, b = spec.partition("-")
            start = int(a) if a else 0
            end = int(b) if b else size - 1
            if start >= size:
                return self._send(416, b"", {"Content-Range": f"bytes */{size}"})
            end = min(end, size - 1)
            status = 206
            headers = dict(headers, **{"Content-Range": f"bytes {start}-{end}/{size}"})
        body = bytearray(data[start : end + 1])
        flip = fake.take_fault("flip", self.command, path)
        if flip is not None and start <= flip.offset <= end:
            body[flip.offset - start] ^= 0xFF
        short = fake.take_fault("short", self.command, path)
        if short is not None:
            body = body[: max(0, len(body) - short.missing)]
        drop = fake.take_fault("drop", self.command, path)
        length = declared if declared is not None else len(body)
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(length))
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        if self.command == "HEAD":
            return
        if declared is not None:
            self.wfile.write(bytes(body))
            self.close_connection = True
            return
        stall = fake.take_fault("stall", self.command, path)
        if stall is not None:
            self.wfile.flush()
            time.sleep(stall.delay)
        if drop is not None:
            self.wfile.write(bytes(body[: drop.after_bytes]))
            self.wfile.flush()
            self._hang_up(drop.reset)
            return
        slow = fake.take_fault("slow", self.command, path)
        if slow is not None:
            view = memoryview(bytes(body))
            for i in range(0, len(view), slow.chunk):
                self.wfile.write(view[i : i + slow.chunk])
                self.wfile.flush()
                time.sleep(slow.delay)
            return
        self.wfile.write(bytes(body))


def utcnow_iso() -> str:
    """Now as the Hub writes dates."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.000Z")


def prepare_env(monkeypatch: Any, tmp_path: Any, hub: FakeHub) -> Any:
    """Point the Hub client at ``hub`` with a fresh cache under ``tmp_path``; returns the cache dir.

    Never touches the real ~/.cache: HF_HOME, HF_HUB_CACHE and XDG_CACHE_HOME all go to tmp_path, and
    every token source is cleared.
    """
    home = tmp_path / "hf_home"
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_CACHE", str(home / "hub"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    for var in (
        "HF_HUB_OFFLINE",
        "TRANSFORMERS_OFFLINE",
        "HF_TOKEN",
        "HUGGING_FACE_HUB_TOKEN",
        "HF_HUB_DOWNLOAD_TIMEOUT",
    ):
        monkeypatch.delenv(var, raising=False)
    for var in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    return home / "hub"
