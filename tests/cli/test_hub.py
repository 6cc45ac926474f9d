"""``quant-studio-cli hub`` against the fake Hub."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from studio.cli import main
from studio.core.hub.auth import get_token as _REAL_GET_TOKEN
from tests.core.chat import fixtures as _fixtures
from tests.core.hub.fakehub import FakeHub, prepare_env

# shared session fixtures (exports are cached in that module)
chat_model = _fixtures.chat_model
gguf_of = _fixtures.gguf_of


@pytest.fixture
def hub(monkeypatch, tmp_path):
    with FakeHub() as server:
        server.cache_dir = prepare_env(monkeypatch, tmp_path, server)
        # No token from a keyring or a login file on the test machine.
        monkeypatch.setattr("studio.core.hub.auth.get_token", lambda: (None, None))
        yield server


def _run(capsys, *argv):
    code = main(["hub", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_search_json_and_table(hub, capsys):
    code, out, _ = _run(capsys, "search", "tiny", "--json")
    assert code == 0
    data = json.loads(out)
    assert [d["id"] for d in data] == ["tiny-org/tiny-llama", "tiny-org/tiny-llama-GGUF"]
    assert data[0]["downloads"] == 1500 and data[0]["params"] == 65792
    code, out, _ = _run(capsys, "search", "tiny", "--sort", "likes", "--limit", "1")
    assert code == 0 and "tiny-org/tiny-llama-GGUF" in out and "tiny-org/tiny-llama " not in out


def test_info_json(hub, capsys):
    code, out, _ = _run(capsys, "info", "tiny-org/tiny-llama-GGUF", "--json")
    assert code == 0
    data = json.loads(out)
    assert data["id"] == "tiny-org/tiny-llama-GGUF"
    assert {f["name"]: f["quant_type"] for f in data["files"]}["tiny-llama-IQ4_XS.gguf"] == "IQ4_XS"
    code, out, _ = _run(capsys, "info", "tiny-org/tiny-llama")
    assert code == 0 and "apache-2.0" in out and "model.safetensors" in out


def test_download_json_then_cache_list_and_delete(hub, capsys):
    code, out, err = _run(capsys, "download", "tiny-org/tiny-llama", "--include", "*.json", "--json")
    assert code == 0, err
    data = json.loads(out)
    path = Path(data["path"])
    assert (path / "config.json").read_bytes() == hub.repos["tiny-org/tiny-llama"].files["config.json"]
    assert sorted(data["files"]) == ["config.json", "tokenizer.json", "tokenizer_config.json"]
    code, out, _ = _run(capsys, "download", "tiny-org/tiny-llama")
    assert code == 0 and Path(out.strip()) == path and (path / "model.safetensors").is_file()
    code, out, _ = _run(capsys, "cache", "--json")
    assert code == 0 and [m["repo_id"] for m in json.loads(out)] == ["tiny-org/tiny-llama"]
    code, out, _ = _run(capsys, "cache", "--delete", "tiny-org/tiny-llama")
    assert code == 0 and "deleted tiny-org/tiny-llama" in out
    code, out, _ = _run(capsys, "cache", "--json")
    assert json.loads(out) == []


def test_errors_are_one_line_exit_2(hub, capsys):
    code, out, err = _run(capsys, "download", "nobody/nothing")
    assert code == 2
    assert err.strip().count("\n") == 0 and "does not exist on the Hub" in err
    code, _, err = _run(capsys, "download", "gated-org/gated-llama")
    assert code == 2 and "gated" in err and "Traceback" not in err


def test_cache_options_that_do_not_go_together_are_refused(hub, capsys):
    # regression: --revision without --delete was silently ignored and the listing printed instead
    code, out, err = _run(capsys, "cache", "--revision", "abc")
    assert code == 2 and out == "" and "--revision goes with --delete" in err
    code, out, err = _run(capsys, "cache", "--delete", "tiny-org/tiny-llama", "--cleanup")
    assert code == 2 and out == "" and "not both" in err


def test_info_shows_fit_badges(hub, capsys, monkeypatch):
    from studio.core.hardware import Backend, GpuInfo, HardwareInfo

    gpu = GpuInfo(0, "Test GPU", Backend.CUDA, 8 * 1024**3, 8 * 1024**3)
    hw = HardwareInfo(
        cpu_name="cpu",
        cpu_cores=4,
        ram_total_bytes=16 * 1024**3,
        ram_available_bytes=8 * 1024**3,
        gpus=(gpu,),
    )
    monkeypatch.setattr("studio.core.hardware.detect", lambda probe_torch=True: hw)
    code, out, _ = _run(capsys, "info", "tiny-org/tiny-llama", "--json")
    fit = json.loads(out)["fit"]
    assert code == 0 and fit["preset"] == "Q4_K_M" and fit["verdict"] == "fits on the GPU"
    assert [e["preset"] for e in fit["estimates"]][:2] == ["F16", "Q8_0"] and fit["best_preset"] == "F16"
    code, out, _ = _run(capsys, "info", "tiny-org/tiny-llama-GGUF")
    assert code == 0 and "Q4_K_M: fits on the GPU" in out
    assert "tiny-llama-IQ4_XS.gguf" in out and "IQ4_XS: fits on the GPU" in out


def test_upload_after_eval_carries_the_measured_numbers_into_the_card(
    hub, monkeypatch, capsys, tmp_path, chat_model, gguf_of
):
    from studio.core.hub import auth

    # The token comes from HF_TOKEN (no keyring, no login file under the test's HF_HOME).
    monkeypatch.setattr(auth, "get_token", _REAL_GET_TOKEN)
    monkeypatch.setattr(auth, "_keyring", lambda: None)
    monkeypatch.setenv("HF_TOKEN", "hf_write_token")
    monkeypatch.setattr("huggingface_hub.utils._http.time.sleep", lambda s: None)
    q4 = tmp_path / "tiny-Q4_K_M.gguf"
    q4.write_bytes(gguf_of(chat_model, "Q4_K_M").read_bytes())
    code = main(["eval", "--original", str(chat_model), "--variant", str(q4), "--ctx", "64", "--chunks", "2",
                 "--device", "cpu", "--json"])  # fmt: skip
    assert code == 0
    (ev,) = json.loads(capsys.readouterr().out)["variants"]
    code, out, err = _run(capsys, "upload", str(q4), "--repo", "alice/tiny-GGUF", "--private", "--json")
    assert code == 0, err
    res = json.loads(out)
    repo = hub.repos["alice/tiny-GGUF"]
    assert repo.private and repo.files[q4.name] == q4.read_bytes() and res["sha256"] == repo.sha256(q4.name)
    card = repo.files["README.md"].decode()
    assert card == res["card"] and "**Q4_K_M**" in card
    row = f"| Q4_K_M | {ev['ppl']:.4f} |"
    assert row in card and f"{ev['kld_mean']:.6f}" in card and f"{ev['same_top_pct']:.2f} %" in card
    assert "hf_write_token" not in out + err


def test_upload_errors_are_one_line_exit_2(hub, monkeypatch, capsys, tmp_path, chat_model, gguf_of):
    monkeypatch.setattr("studio.commands.hub._token", lambda: "hf_write_token")
    q4 = gguf_of(chat_model, "Q4_K_M")
    code, out, err = _run(capsys, "upload", str(q4), "--repo", "bob/theirs")
    errors = [ln for ln in err.splitlines() if ln.startswith("error:")]  # above it: progress lines
    assert code == 2 and out == "" and err.strip().splitlines()[-1] == errors[0] and len(errors) == 1
    assert "HTTP 403" in errors[0] and "nothing was created on the Hub" in errors[0]
    code, out, err = _run(capsys, "upload", str(q4), "--repo", "no-namespace")
    assert code == 2 and "USER/NAME" in err
