"""``quant-studio-cli hub`` against a hostile Hub: echoed tokens, terminal escapes, broken listings (issue 25)."""

from __future__ import annotations

import json

import pytest

from studio.cli import main
from tests.core.hub.fakehub import CONFIG, FakeHub, FakeRepo, prepare_env

HF_SHAPED = "hf_" + "Zq8rT2vLm9XwY4bN6cJ1kP3sD5fG7hA0eU"  # what a real Hub token looks like
OTHER_SHAPED = "my-private-token-0123456789"  # any other token (a mirror's own scheme)
EVIL_NAME = "notes\x1b]0;pwned\x07\x1b[2J.txt"
EVIL_LICENSE = "mit\x1b[31m\x1b]8;;https://evil.example\x07click\x1b]8;;\x07"


@pytest.fixture
def hub(monkeypatch, tmp_path):
    repos = {
        "evil-org/escapes": FakeRepo(
            "evil-org/escapes",
            files={"config.json": json.dumps(CONFIG).encode(), EVIL_NAME: b"hello\n"},
            card_data={"license": EVIL_LICENSE},
            tags=["llama"],
        ),
        "evil-org/file-and-folder": FakeRepo(
            "evil-org/file-and-folder",
            files={"config.json": json.dumps(CONFIG).encode(), "config.json/inner.txt": b"x"},
        ),
        "evil-org/deep-config": FakeRepo(
            "evil-org/deep-config",
            files={"config.json": b"[" * 200_000 + b"]" * 200_000, "README.md": b"# deep\n"},
        ),
        "tiny-org/tiny-llama": FakeRepo(
            "tiny-org/tiny-llama", files={"config.json": json.dumps(CONFIG).encode(), "README.md": b"# t\n"}
        ),
    }
    with FakeHub(repos) as server:
        server.cache_dir = prepare_env(monkeypatch, tmp_path, server)
        monkeypatch.setattr("studio.core.hub.auth.get_token", lambda: (None, None))
        yield server


def _run(capsys, *argv):
    code = main(["hub", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def _one_sentence(code, out, err):
    assert code == 2, (out, err)
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.startswith("error")]  # progress lines may come first
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


@pytest.mark.parametrize("token", [HF_SHAPED, OTHER_SHAPED])
@pytest.mark.parametrize(
    ("command", "echo_path"),
    [
        (("info", "tiny-org/tiny-llama"), "/api/models/*"),
        (("download", "tiny-org/tiny-llama"), "/api/models/*"),
        (("download", "tiny-org/tiny-llama"), "*/resolve/*"),
    ],
)
def test_token_echoed_by_a_403_never_reaches_the_error(hub, capsys, monkeypatch, token, command, echo_path):
    monkeypatch.setattr("studio.core.hub.auth.get_token", lambda: (token, None))
    hub.echo_auth_paths = [echo_path]
    code, out, err = _run(capsys, *command)
    line = _one_sentence(code, out, err)
    assert any(r.authorization == f"Bearer {token}" for r in hub.requests)  # the server did see it
    assert "403" in line and "hf_***" in line  # the server's message is there, the token is not
    assert token not in out + err
    assert token[:12] not in out + err


def test_info_escapes_control_characters_of_hub_text(hub, capsys):
    hub.repos["evil-org/escapes"].files.pop(EVIL_NAME)
    hub.repos["evil-org/escapes"].files["weights\x1b[8m.bin"] = b"\0" * 8
    code, out, err = _run(capsys, "info", "evil-org/escapes")
    # the listing itself is refused (a control character in a file name), in one escaped sentence
    line = _one_sentence(code, out, err)
    assert "\x1b" not in out + err and "\\x1b" in line
    hub.repos["evil-org/escapes"].files.pop("weights\x1b[8m.bin")
    code, out, err = _run(capsys, "info", "evil-org/escapes")
    assert code == 0, err
    assert "\x1b" not in out + err and "\x07" not in out + err
    assert "license: mit\\x1b[31m\\x1b]8;;https://evil.example\\x07click" in out


def test_file_name_with_control_characters_is_refused_and_nothing_is_created(hub, capsys):
    code, out, err = _run(capsys, "download", "evil-org/escapes")
    line = _one_sentence(code, out, err)
    assert "\x1b" not in err and "\x07" not in err
    assert "unsafe file name" in line or "invalid file name" in line
    created = [p for p in hub.cache_dir.rglob("*") if "\x1b" in p.name or p.is_symlink()]
    assert created == []
    assert not any(p.name == "snapshots" for p in hub.cache_dir.rglob("*"))


def test_listing_with_a_file_that_is_also_a_folder_gives_one_sentence_and_no_symlink(hub, capsys):
    code, out, err = _run(capsys, "download", "evil-org/file-and-folder")
    line = _one_sentence(code, out, err)
    assert "config.json" in line and "both as a file and as a folder" in line
    links = [p for p in hub.cache_dir.rglob("*") if p.is_symlink()]
    assert links == []
    code, out, err = _run(capsys, "info", "evil-org/file-and-folder")
    _one_sentence(code, out, err)


def test_deeply_nested_config_json_is_ignored_not_a_traceback(hub, capsys):
    code, out, err = _run(capsys, "info", "evil-org/deep-config")
    assert code == 0, err
    assert "Traceback" not in err and "evil-org/deep-config" in out
    code, out, err = _run(capsys, "info", "evil-org/deep-config", "--json")
    assert code == 0 and json.loads(out)["fit"] is None


def test_progress_line_escapes_control_characters():
    import io

    from studio.commands._common import ProgressLine

    buf = io.StringIO()
    with ProgressLine(stream=buf) as line:
        line.show("file a\x1b[2Jb", final=True)
        line.log("log \x9b31m line")
    assert "\x1b" not in buf.getvalue() and "\x9b" not in buf.getvalue()
    assert "a\\x1b[2Jb" in buf.getvalue()
