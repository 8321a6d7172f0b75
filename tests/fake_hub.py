"""A Hugging Face Hub on loopback for `fairpool fetch-model`'s tests: the HTTP the
`huggingface_hub` client speaks to download a snapshot (repository info, the file tree,
HEAD and GET of `resolve` URLs), with the Hub's answers for gated repositories, unknown
revisions, private repositories and bad tokens (status codes and `X-Error-Code`).

The real Hub cannot be reached from the tests; this is its protocol, not a stub of the
client: the client under test is the real `huggingface_hub`.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass, field

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from fairpool.runtime import ServerInThread
from fairpool_gateway.server import bind


@dataclass
class Repository:
    files: dict[str, bytes]
    gated: bool = False
    private: bool = False
    branches: dict[str, str] = field(default_factory=dict)  # branch -> commit

    def __post_init__(self) -> None:
        if not self.branches:
            digest = hashlib.sha1(repr(sorted(self.files.items())).encode()).hexdigest()
            self.branches["main"] = digest


@dataclass
class Hub:
    repositories: dict[str, Repository] = field(default_factory=dict)
    #: token -> the gated or private repositories it may read
    tokens: dict[str, set[str]] = field(default_factory=dict)
    #: GETs of file contents, by (repository, path)
    downloads: Counter[tuple[str, str]] = field(default_factory=Counter)

    def commit(self, repo: Repository, revision: str) -> str | None:
        if revision in repo.branches:
            return repo.branches[revision]
        return revision if revision in repo.branches.values() else None

    def refusal(self, request: Request, repo_id: str, for_files: bool) -> Response | None:
        """The Hub's answer when the caller may not see `repo_id` (None: it may)."""
        repo = self.repositories.get(repo_id)
        token = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
        if token and token not in self.tokens:
            return error(401, "", "Invalid credentials in Authorization header")
        allowed = repo_id in self.tokens.get(token, set())
        if repo is None or (repo.private and not allowed):
            return error(401 if not token else 404, "RepoNotFound", "Repository not found")
        if repo.gated and for_files and not allowed:
            return error(401 if not token else 403, "GatedRepo", "Access to model is restricted")
        return None

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/{rest:path}", self.route, methods=["GET", "HEAD"])])

    async def route(self, request: Request) -> Response:
        parts = request.path_params["rest"].split("/")
        if parts[:2] == ["api", "models"] and len(parts) >= 6:
            repo_id, kind, revision = "/".join(parts[2:4]), parts[4], "/".join(parts[5:])
            if kind == "revision":
                return self.info(request, repo_id, revision)
            if kind == "tree":
                return self.tree(request, repo_id, revision)
        if len(parts) >= 5 and parts[2] == "resolve":
            return self.resolve(request, "/".join(parts[:2]), parts[3], "/".join(parts[4:]))
        return error(404, "", "Not found")

    def lookup(
        self, request: Request, repo_id: str, revision: str, for_files: bool
    ) -> tuple[Repository, str] | Response:
        """The repository and the commit a revision names, or the Hub's refusal."""
        refused = self.refusal(request, repo_id, for_files)
        if refused is not None:
            return refused
        repo = self.repositories[repo_id]
        sha = self.commit(repo, revision)
        if sha is None:
            return error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        return repo, sha

    def info(self, request: Request, repo_id: str, revision: str) -> Response:
        found = self.lookup(request, repo_id, revision, for_files=False)
        if isinstance(found, Response):
            return found
        repo, sha = found
        siblings = [{"rfilename": path} for path in sorted(repo.files)]
        body = {"id": repo_id, "modelId": repo_id, "sha": sha, "siblings": siblings}
        body |= {"private": repo.private, "gated": "manual" if repo.gated else False}
        return JSONResponse(body)

    def tree(self, request: Request, repo_id: str, revision: str) -> Response:
        found = self.lookup(request, repo_id, revision, for_files=False)
        if isinstance(found, Response):
            return found
        repo, _ = found
        entries = [
            {"type": "file", "oid": blob_id(content), "size": len(content), "path": path}
            for path, content in sorted(repo.files.items())
        ]
        return JSONResponse(entries)

    def resolve(self, request: Request, repo_id: str, revision: str, path: str) -> Response:
        found = self.lookup(request, repo_id, revision, for_files=True)
        if isinstance(found, Response):
            return found
        repo, sha = found
        if path not in repo.files:
            return error(404, "EntryNotFound", "Entry not found")
        content = repo.files[path]
        headers = {"X-Repo-Commit": sha, "ETag": f'"{blob_id(content)}"'}
        if request.method == "HEAD":
            return Response(headers={**headers, "Content-Length": str(len(content))})
        self.downloads[repo_id, path] += 1
        return Response(content, headers=headers, media_type="application/octet-stream")


def blob_id(content: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


def error(status: int, code: str, message: str) -> Response:
    headers = {"X-Error-Message": message}
    if code:
        headers["X-Error-Code"] = code
    return JSONResponse({"error": message}, status_code=status, headers=headers)


class HubServer:
    """`Hub` served on a free loopback port, in a thread."""

    def __init__(self, hub: Hub) -> None:
        self.hub = hub
        listening = bind("127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{listening.getsockname()[1]}"
        config = uvicorn.Config(hub.app(), log_level="warning", lifespan="off")
        self._running = ServerInThread(uvicorn.Server(config), [listening], "hub")

    def __enter__(self) -> HubServer:
        self._running.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._running.stop()
