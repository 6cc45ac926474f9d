"""Uploading a GGUF to the (fake) Hub: the bytes, the model card, and every failure leaving the Hub as it was."""

from __future__ import annotations

import errno
import json
import logging
from pathlib import Path

import pytest

from studio.core.errors import HubError
from studio.core.evaluate.record import EvalRecord, last_evaluation, record_path
from studio.core.hub import upload as up
from studio.core.hub.errors import UploadError
from studio.core.hub.model_card import card_facts, merge_card
from studio.core.jobs import JobCancelled, JobContext
from tests.core.hub.fakehub import Fault

TOKEN = "hf_write_token"
REPO = "alice/tiny-llama-GGUF"


@pytest.fixture(scope="module")
def q4(tmp_path_factory, llama_model) -> Path:
    """The tiny Llama as Q4_K_M, exported as if it came from the Hub repo tiny-org/tiny-llama."""
    from studio.core.export.run import export_gguf

    out = tmp_path_factory.mktemp("upload") / "tiny-llama-Q4_K_M.gguf"
    export_gguf(llama_model, out, "Q4_K_M", source_repo="tiny-org/tiny-llama")
    return out


@pytest.fixture
def gguf(q4, tmp_path) -> Path:
    """A private copy (tests add records and break reads)."""
    p = tmp_path / q4.name
    p.write_bytes(q4.read_bytes())
    return p


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch, waits):
    """huggingface_hub's own backoff sleeps (up to 8 s each) are skipped; ours are recorded by ``waits``."""
    monkeypatch.setattr("huggingface_hub.utils._http.time.sleep", lambda s: None)


def _upload(path: Path, repo: str = REPO, token: str | None = TOKEN, **kw):
    return up.upload_gguf(path, repo, token=token, **kw)


def _writes(hub) -> list[str]:
    return [f"{r.method} {r.path}" for r in hub.requests if r.method != "GET"]


def _fails(hub, path: Path, repo: str = REPO, token: str | None = TOKEN, **kw) -> UploadError:
    with pytest.raises(UploadError) as info:
        _upload(path, repo, token, **kw)
    err = info.value
    text = str(err)
    assert "\n" not in text and text.endswith(".") and "Traceback" not in text
    assert TOKEN not in text and (token is None or token not in text)
    return err


def test_upload_sends_the_exact_bytes_through_lfs_with_a_card(hub, gguf):
    res = _upload(gguf)
    repo = hub.repos[REPO]
    assert repo.files[gguf.name] == gguf.read_bytes() and gguf.name in repo.lfs
    assert res.created_repo and res.card_written and res.sha256 == repo.sha256(gguf.name)
    card = repo.files["README.md"].decode()
    assert card == res.card
    assert "license: apache-2.0" in card  # carried from tiny-org/tiny-llama's card
    assert "base_model: tiny-org/tiny-llama" in card and "**Q4_K_M**" in card
    assert "| attn_v | Q4_K ×1, Q6_K ×1 | 2 |" in card  # the plan table by role, from the file itself
    assert "Not measured before upload" in card
    # The large-file path: upload mode, LFS batch, the bytes to the storage host, verify, one commit.
    w = _writes(hub)
    assert w[0] == "POST /api/repos/create" and w[-1] == f"POST /api/models/{REPO}/commit/main"
    assert f"POST /api/models/{REPO}/preupload/main" in w
    assert (
        f"POST /{REPO}.git/info/lfs/objects/batch" in w and f"POST /{REPO}.git/info/lfs/objects/verify" in w
    )
    (put,) = [r for r in hub.requests if r.method == "PUT"]
    assert put.host == "localhost" and put.authorization is None  # the token never goes to storage
    assert all(
        r.authorization == f"Bearer {TOKEN}"
        for r in hub.requests
        if r.host == "127.0.0.1" and r.method != "GET"
    )
    assert hub.commits == [
        {
            "repo": REPO,
            "summary": f"Upload {gguf.name} (Q4_K_M) with Quant Studio",
            "operations": [("lfsFile", gguf.name), ("file", "README.md")],
        }
    ]


def test_the_card_quotes_the_last_evaluation(hub, gguf):
    rec = EvalRecord(
        variant=gguf.name,
        file_bytes=gguf.stat().st_size,
        fingerprint="",
        original="llama",
        original_kind="transformers",
        original_ppl=210.25,
        ppl=212.5,
        ppl_err=3.0,
        kld_mean=0.012345,
        kld_p99=0.0987,
        same_top_pct=91.5,
        bpw=5.0,
        text="sample (resources/eval/sample_en.txt)",
        ctx=64,
        chunks=3,
        n_scored=96,
        runtime="llama-cpp-python 0.3.36",
        when="2026-12-01T10:00:00Z",
    )
    card = merge_card(None, card_facts(gguf, evaluation=rec))
    assert "| original | 210.2500 |" in card
    assert "| Q4_K_M | 212.5000 | +1.07 % | 0.012345 | 0.098700 | 91.50 % |" in card
    assert "3 chunks of 64 tokens, 96 positions scored" in card and "llama-cpp-python 0.3.36" in card


def test_a_second_quantization_adds_its_section_and_keeps_the_first(hub, gguf, tmp_path):
    _upload(gguf)
    other = tmp_path / "tiny-llama-Q8_0.gguf"
    data = bytearray(gguf.read_bytes())
    other.write_bytes(bytes(data))  # same tensors, another file: enough for the card's bookkeeping
    res = _upload(other)
    repo = hub.repos[REPO]
    assert not res.created_repo and set(repo.files) == {gguf.name, other.name, "README.md"}
    card = repo.files["README.md"].decode()
    assert (
        card.count("<!-- quant-studio:file ") == 2
        and f"## {gguf.name}" in card
        and f"## {other.name}" in card
    )


def test_a_readme_written_by_someone_else_is_left_alone(hub, gguf):
    _upload(gguf)
    hub.repos[REPO].files["README.md"] = b"# My own card\n"
    res = _upload(gguf.rename(gguf.with_name("renamed-Q4_K_M.gguf")))
    assert hub.repos[REPO].files["README.md"] == b"# My own card\n"
    assert not res.card_written and any("own README.md" in n for n in res.notes)


def test_multipart_upload_is_byte_identical(hub, gguf):
    hub.multipart_threshold, hub.part_size = 1000, 256 * 1024
    _upload(gguf)
    assert hub.repos[REPO].files[gguf.name] == gguf.read_bytes()
    parts = [r for r in hub.requests if r.method == "PUT"]
    assert len(parts) == -(-gguf.stat().st_size // hub.part_size) > 1
    assert any(r.path.startswith("/api/complete-multipart/") for r in hub.requests)


def test_a_transient_drop_and_429_are_retried_and_the_bytes_still_match(hub, gguf):
    hub.add_fault(Fault("drop_request", path="/lfs-storage/*", methods=("PUT",), after_bytes=4096))
    hub.add_fault(
        Fault("status", path="*/preupload/*", methods=("POST",), status=429, headers={"Retry-After": "0"})
    )
    _upload(gguf)
    assert hub.repos[REPO].files[gguf.name] == gguf.read_bytes()
    assert len([r for r in hub.requests if r.method == "PUT"]) == 2


def test_401_bad_token_creates_nothing(hub, gguf):
    err = _fails(hub, gguf, token="hf_expired_token")
    assert err.kind == "auth" and err.state == up.NOTHING_CREATED
    assert "HTTP 401" in str(err) and "nothing was created on the Hub" in str(err)
    assert REPO not in hub.repos and "hf_expired_token" not in str(err)


def test_no_token_is_one_sentence_and_no_request(hub, gguf):
    err = _fails(hub, gguf, token=None)
    assert err.kind == "auth" and "HF_TOKEN" in str(err) and hub.requests == []


def test_403_another_namespace_creates_nothing(hub, gguf):
    err = _fails(hub, gguf, repo="bob/tiny-llama-GGUF")
    assert err.kind == "forbidden" and err.state == up.NOTHING_CREATED and "HTTP 403" in str(err)
    assert "bob/tiny-llama-GGUF" not in hub.repos


def test_403_on_an_existing_repo_leaves_it_unchanged(hub, gguf):
    before = dict(hub.repos["tiny-org/tiny-llama-GGUF"].files)
    err = _fails(hub, gguf, repo="tiny-org/tiny-llama-GGUF")
    assert err.kind == "forbidden" and err.state == up.UNCHANGED and "is unchanged" in str(err)
    assert hub.repos["tiny-org/tiny-llama-GGUF"].files == before and hub.commits == []


def test_429_on_the_commit_rolls_the_new_repo_back(hub, gguf):
    hub.add_fault(Fault("status", path="*/commit/*", methods=("POST",), times=None, status=429))
    err = _fails(hub, gguf)
    assert err.kind == "rate-limited" and err.state == up.ROLLED_BACK and "HTTP 429" in str(err)
    assert REPO not in hub.repos and hub.deleted_repos == [REPO]


def test_a_connection_that_stays_dropped_rolls_back(hub, gguf):
    hub.add_fault(
        Fault("drop_request", path="/lfs-storage/*", methods=("PUT",), times=None, after_bytes=1000)
    )
    err = _fails(hub, gguf)
    assert err.kind == "network" and err.state == up.ROLLED_BACK and "dropped" in str(err)
    assert REPO not in hub.repos and hub.lfs_objects == {}


def test_a_lost_commit_answer_is_checked_against_the_repo(hub, gguf):
    hub.add_fault(Fault("drop_response", path="*/commit/*", methods=("POST",)))
    res = _upload(gguf)
    assert hub.repos[REPO].files[gguf.name] == gguf.read_bytes()
    assert res.commit is None and any("answer to the commit was lost" in n for n in res.notes)


def test_a_commit_lost_on_the_way_is_rolled_back(hub, gguf):
    hub.add_fault(Fault("drop_request", path="*/commit/*", methods=("POST",)))
    err = _fails(hub, gguf)
    assert err.kind == "network" and err.state == up.ROLLED_BACK and REPO not in hub.repos


def test_when_the_repo_cannot_be_asked_the_state_is_unknown_and_kept(hub, gguf, monkeypatch):
    hub.add_fault(Fault("drop_request", path="*/commit/*", methods=("POST",)))

    def unreachable(*_a):
        hub.unreachable = True  # the network is gone by the time we ask whether the commit landed
        raise ConnectionError("network is unreachable")

    monkeypatch.setattr(up, "_repo_has", unreachable)
    err = _fails(hub, gguf)
    assert err.state == up.UNKNOWN and f"look at {hub.url}/{REPO}" in str(err) and err.kind == "network"
    hub.unreachable = False
    assert REPO in hub.repos and hub.deleted_repos == []  # not deleted on a guess


def test_a_failed_rollback_says_the_empty_repo_is_left(hub, gguf):
    hub.add_fault(Fault("status", path="*/commit/*", methods=("POST",), times=None, status=500))
    hub.add_fault(Fault("status", path="/api/repos/delete", methods=("DELETE",), times=None, status=403))
    err = _fails(hub, gguf)
    assert err.state == up.EMPTY_REPO_LEFT and f"{hub.url}/{REPO}" in str(err)
    assert hub.repos[REPO].files == {}


class _EIOReader(up.UploadReader):
    """Reads fail with EIO once 2000 bytes are read in ``fail_phase`` (0: hashing, 1: uploading)."""

    fail_phase = 0

    def _guard(self, fn):  # noqa: ANN001, ANN202
        if self.phase == self.fail_phase and self.tell() >= 2000:
            return super()._guard(self._eio)
        return super()._guard(fn)

    @staticmethod
    def _eio() -> bytes:
        raise OSError(errno.EIO, "Input/output error")


@pytest.mark.parametrize("phase", [0, 1], ids=["while-hashing", "while-uploading"])
def test_a_disk_error_is_one_sentence_and_leaves_nothing(hub, gguf, monkeypatch, phase):
    def failing(path, ctx, size):
        r = _EIOReader(path, ctx, size)
        r.fail_phase = phase
        return r

    monkeypatch.setattr(up, "open_reader", failing)
    err = _fails(hub, gguf)
    assert err.kind == "disk" and "Input/output error" in str(err) and gguf.name in str(err)
    assert REPO not in hub.repos
    if phase == 0:  # read before the Hub is asked anything
        assert err.state == up.NOTHING_CREATED and "POST /api/repos/create" not in _writes(hub)
    else:
        assert err.state == up.ROLLED_BACK and hub.deleted_repos == [REPO]


def test_cancel_mid_upload_rolls_back(hub, gguf):
    ctx = JobContext()
    seen = []

    def progress(done, total, msg):
        seen.append(msg)
        if msg.startswith("Uploading") and done > total // 2 + 10:
            ctx.cancel()

    ctx.on_progress = progress
    ctx.min_interval = 0.0
    with pytest.raises(JobCancelled):
        _upload(gguf, ctx=ctx)
    assert REPO not in hub.repos and hub.deleted_repos == [REPO] and hub.commits == []


def test_not_a_gguf_or_truncated_is_refused_before_any_request(hub, gguf, tmp_path):
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(gguf.read_bytes()[: gguf.stat().st_size // 2])
    with pytest.raises(HubError, match="cut.gguf"):
        _upload(cut)
    txt = tmp_path / "notes.txt"
    txt.write_text("hello")
    with pytest.raises(HubError, match="not a .gguf file"):
        _upload(txt)
    assert hub.requests == []


def test_the_token_never_reaches_a_log_line(hub, gguf, caplog):
    hub.add_fault(Fault("status", path="*/preupload/*", methods=("POST",), status=503))
    lines: list[str] = []
    with caplog.at_level(logging.DEBUG):
        _upload(gguf, ctx=JobContext(on_log=lines.append))
    assert lines and not any(TOKEN in ln for ln in lines)
    assert TOKEN not in caplog.text


def test_a_record_of_a_changed_file_is_not_quoted(tmp_path, gguf):
    from studio.core.evaluate.record import fingerprint

    size, fp = fingerprint(gguf)
    fields = {
        "version": 1, "variant": gguf.name, "file_bytes": size, "fingerprint": fp, "original": "o",
        "original_kind": "transformers", "original_ppl": 2.0, "ppl": 2.1, "ppl_err": 0.1, "kld_mean": 0.01,
        "kld_p99": 0.1, "same_top_pct": 90.0, "bpw": 5.0, "text": "t", "ctx": 64, "chunks": 1,
        "n_scored": 32, "runtime": "r", "when": "2026-01-01T00:00:00Z",
    }  # fmt: skip
    record_path(gguf).write_text(json.dumps(fields), encoding="utf-8")
    assert last_evaluation(gguf) is not None
    with open(gguf, "r+b") as f:
        f.seek(-1, 2)
        last = f.read(1)
        f.seek(-1, 2)
        f.write(bytes([last[0] ^ 0xFF]))
    assert last_evaluation(gguf) is None


def test_the_source_and_revision_come_from_the_exporters_urls():
    from studio.core.hub.model_card import _source_repo, _source_revision

    rev = "0123456789abcdef0123456789abcdef01234567"
    meta = {
        "general.source.repo_url": "https://huggingface.co/org/model",
        "general.source.url": f"https://huggingface.co/org/model/tree/{rev}",
    }
    assert _source_repo(meta) == "org/model" and _source_revision(meta) == rev
    assert _source_revision({"general.source.url": "https://huggingface.co/org/model"}) is None
