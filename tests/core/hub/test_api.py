"""Search, model details, GGUF quant types and fit badges against the fake Hub."""

from __future__ import annotations

import struct

import pytest

from studio.core.hub import AuthRequired, RepoNotFound, model_details, search
from studio.core.hub.api import http_error
from studio.core.hub.errors import OfflineError, RateLimited
from studio.core.hub.fit import fit_badge, fit_for_repo, gguf_fit
from studio.core.hub.gguf_quant import quant_type, quant_type_from_header, quant_type_from_name
from studio.core.jobs import JobContext
from tests.core.hub.fakehub import CONFIG, Fault, make_gguf


def test_search_sorts_filters_and_pages(hub):
    by_downloads = [m.id for m in search("", sort="downloads")]
    assert by_downloads == [
        "other-org/bert-mini",
        "tiny-org/tiny-llama",
        "tiny-org/tiny-llama-GGUF",
        "gated-org/gated-llama",
    ]
    assert [m.id for m in search("", sort="likes")][0] == "tiny-org/tiny-llama-GGUF"
    assert [m.id for m in search("", sort="last_modified")][0] == "tiny-org/tiny-llama-GGUF"
    assert [m.id for m in search("tiny", task="feature-extraction")] == []
    assert [m.id for m in search("", library="gguf")] == ["tiny-org/tiny-llama-GGUF"]
    hits = search("tiny-llama")
    top = hits[0]
    assert top.id == "tiny-org/tiny-llama" and top.downloads == 1500 and top.likes == 12
    assert top.params == 65792 and top.pipeline_tag == "text-generation" and top.library == "transformers"
    assert top.last_modified is not None and top.last_modified.year == 2025
    assert hits[1].is_gguf and not top.is_gguf
    assert [m.id for m in search("", limit=1)] == ["other-org/bert-mini"]


def test_search_paging_follows_link_pages(hub):
    hub.page_size = 1  # force the Hub's Link-header pagination
    page2 = search("", sort="downloads", limit=2, offset=2)
    assert [m.id for m in page2] == ["tiny-org/tiny-llama-GGUF", "gated-org/gated-llama"]
    assert sum(1 for r in hub.requests if r.path == "/api/models") == 4  # one request per page of one


def test_search_rejects_unknown_sort(hub):
    with pytest.raises(Exception, match="Unknown sort"):
        search("x", sort="stars")


def test_model_details_files_params_license_card(hub):
    repo = hub.repos["tiny-org/tiny-llama"]
    d = model_details("tiny-org/tiny-llama")
    assert d.sha == repo.commit
    sizes = {f.name: f.size for f in d.files}
    assert sizes == {n: len(b) for n, b in repo.files.items()}
    st = next(f for f in d.files if f.name == "model.safetensors")
    assert st.is_lfs and st.sha256 == repo.sha256("model.safetensors")
    assert not next(f for f in d.files if f.name == "config.json").is_lfs
    assert d.params == 65792 and d.params_by_dtype == {"F32": 65792}
    assert d.license == "apache-2.0"
    assert not d.gated and not d.private
    assert "# Tiny Llama" in d.card and "**tiny**" in d.card
    assert d.config is not None and d.config["model_type"] == "llama"
    assert d.total_size == sum(len(b) for b in repo.files.values())


def test_params_from_safetensors_header_when_hub_does_not_say(hub):
    hub.repos["tiny-org/tiny-llama"].safetensors_params = None
    d = model_details("tiny-org/tiny-llama", with_card=False)
    assert d.params == 256 * 256 + 256
    # huggingface_hub read the header with a Range request instead of downloading the weights.
    assert any(r.range for r in hub.file_requests("model.safetensors"))


def test_gguf_repo_lists_quant_type_per_file(hub):
    d = model_details("tiny-org/tiny-llama-GGUF")
    quants = {f.name: f.quant_type for f in d.files}
    assert quants == {
        "README.md": None,
        "tiny-llama-F16.gguf": "F16",
        "tiny-llama-IQ4_XS.gguf": "IQ4_XS",
        "tiny-llama-Q4_K_M.gguf": "Q4_K_M",
    }
    assert d.is_gguf and d.params == 65792


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("Llama-3-8B-Q4_K_M.gguf", "Q4_K_M"),
        ("model.IQ4_XS.gguf", "IQ4_XS"),
        ("mistral-7b-instruct-v0.2.Q5_K_S.gguf", "Q5_K_S"),
        ("phi-3-mini-f16.gguf", "F16"),
        ("qwen2-0_5b-instruct-bf16.gguf", "BF16"),
        ("tiny-q8_0.gguf", "Q8_0"),
        ("big-IQ2_XXS-00001-of-00003.gguf", "IQ2_XXS"),
        ("sub/dir/model-Q3_K_L.gguf", "Q3_K_L"),
        ("llama-f16-Q4_0.gguf", "Q4_0"),
        ("model.gguf", None),
        ("README.md", None),
    ],
)
def test_quant_type_from_name(name, expected):
    assert quant_type_from_name(name) == expected


def test_quant_type_from_header(tmp_path):
    p = tmp_path / "renamed-without-quant.gguf"
    p.write_bytes(make_gguf(15))
    assert quant_type_from_header(p) == "Q4_K_M"
    assert quant_type(p) == "Q4_K_M"
    (tmp_path / "x-IQ4_XS.gguf").write_bytes(make_gguf(30))
    assert quant_type(tmp_path / "x-IQ4_XS.gguf") == "IQ4_XS"


@pytest.mark.parametrize(
    "payload",
    [
        b"GGUF" + struct.pack("<IQQ", 3, 0, 2**64 - 1),  # absurd n_kv
        b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 2**40),  # 1 TB key length
        b"GGUF" + struct.pack("<IQQ", 1, 0, 1),  # version 1
        b"GGML" + bytes(40),
        b"",
    ],
    ids=["n_kv", "key_len", "version", "magic", "empty"],
)
def test_quant_type_from_hostile_header_is_none(tmp_path, payload):
    p = tmp_path / "bad.gguf"
    p.write_bytes(payload)
    assert quant_type_from_header(p) is None


def test_missing_repo_says_it_does_not_exist(hub):
    with pytest.raises(RepoNotFound, match="'nobody/nothing' does not exist on the Hub"):
        model_details("nobody/nothing")


def test_invalid_repo_id_is_refused_before_any_request(hub):
    with pytest.raises(RepoNotFound, match="not a valid Hub repository id"):
        model_details("../etc/passwd")
    assert hub.requests == []


def test_model_info_429_is_retried_after_retry_after(hub, waits):
    hub.add_fault(
        Fault(
            "status",
            path="/api/models/tiny-org/tiny-llama*",
            times=2,
            status=429,
            headers={"Retry-After": "2"},
        )
    )
    lines: list[str] = []
    d = model_details(
        "tiny-org/tiny-llama", with_card=False, with_config=False, ctx=JobContext(on_log=lines.append)
    )
    assert d.id == "tiny-org/tiny-llama"
    assert lines == ["rate-limited, waiting 2 s", "rate-limited, waiting 2 s"]
    assert sum(waits) == pytest.approx(4.0)


def test_model_info_429_forever_is_a_clear_error(hub, waits):
    hub.add_fault(Fault("status", path="/api/models/*", times=None, status=429, headers={"Retry-After": "1"}))
    with pytest.raises(RateLimited, match="rate-limiting"):
        model_details("tiny-org/tiny-llama")
    assert sum(1 for r in hub.requests if r.path.startswith("/api/models/")) == 5


def test_http_error_sentences_never_contain_the_token():
    err = http_error(401, {"X-Error-Code": "GatedRepo"}, repo_id="a/b", had_token=True)
    assert isinstance(err, AuthRequired) and err.gated
    assert "hf_" not in str(err)


def test_offline_mode_refuses_lookups(hub, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(OfflineError, match="Offline mode"):
        search("tiny")
    assert hub.requests == []


# -- fit badges --------------------------------------------------------------------------------------


def _hw(gpu_gib: float | None, ram_gib: float = 16):
    from studio.core.hardware import Backend, GpuInfo, HardwareInfo

    gib = 1024**3
    gpus = (
        ()
        if gpu_gib is None
        else (GpuInfo(0, "Fake GPU", Backend.CUDA, int(gpu_gib * gib), int(gpu_gib * gib)),)
    )
    return HardwareInfo("cpu", 8, int(ram_gib * gib), int(ram_gib * gib), gpus)


def test_fit_badge_tracks_hardware():
    cfg = dict(CONFIG, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
               num_key_value_heads=8, vocab_size=128256)  # fmt: skip
    n = 8_030_000_000
    big_gpu = fit_badge(cfg, n, _hw(24))
    small_gpu = fit_badge(cfg, n, _hw(4, ram_gib=64))
    nothing = fit_badge(cfg, n, _hw(None, ram_gib=2))
    assert big_gpu.preset == "Q4_K_M" and big_gpu.verdict == "fits on the GPU" and big_gpu.ok
    assert small_gpu.verdict == "fits with partial offload"
    assert nothing.verdict == "does not fit" and not nothing.ok and nothing.best_preset is None
    assert big_gpu.best_preset in ("Q8_0", "Q6_K", "F16")
    assert fit_badge(cfg, None, _hw(24)) is None
    assert gguf_fit(2 * 1024**3, _hw(24)) == "fits on the GPU"


def test_fit_for_repo_reads_config_from_hub(hub):
    badge = fit_for_repo("tiny-org/tiny-llama", 65792, _hw(8))
    assert badge is not None and badge.verdict == "fits on the GPU"
    assert any(r.path.endswith("/config.json") for r in hub.requests)
    # A GGUF-only repository has no config.json: typical bits per weight still give a badge.
    assert fit_for_repo("tiny-org/tiny-llama-GGUF", 65792, _hw(8)) is not None


def test_hanging_metadata_call_times_out_and_is_retried(hub, waits, monkeypatch):
    monkeypatch.setenv("HF_HUB_ETAG_TIMEOUT", "1")  # huggingface_hub parses it as an int at import
    hub.add_fault(Fault("stall", path="/api/models/tiny-org/tiny-llama", delay=2.5))
    lines: list[str] = []
    d = model_details(
        "tiny-org/tiny-llama", with_card=False, with_config=False, ctx=JobContext(on_log=lines.append)
    )
    assert d.id == "tiny-org/tiny-llama"
    assert lines == ["network error, waiting 1 s"]


def test_search_does_not_retry_around_huggingface_hubs_own_retries(hub, waits, monkeypatch, capfd):
    # regression: list_models already retries 5xx/429/dropped connections (http_backoff); our loop
    # around it multiplied that to 30 requests and over two minutes for an unreachable Hub
    import huggingface_hub.utils._http as hf_http

    from studio.core.errors import HubError

    monkeypatch.setattr(hf_http.time, "sleep", lambda s: None)
    hub.add_fault(Fault("status", path="/api/models", times=None, status=503))
    with pytest.raises(HubError, match="503|Hub"):
        search("tiny")
    n = sum(1 for r in hub.requests if r.path == "/api/models")
    # exactly huggingface_hub's own tries (1 + its default max_retries), nothing on top
    import inspect

    tries = 1 + inspect.signature(hf_http.http_backoff).parameters["max_retries"].default
    assert tries == 6 and n == tries
    err = capfd.readouterr().err
    assert "thrown while requesting" not in err and "Retrying in" not in err
