"""The lab's subcommands: ``sweep``, ``memory``, ``qat`` and ``eval --kv-type``, with --json and one-line errors."""

from __future__ import annotations

import json

import pytest

from studio.cli import main
from tests.core.chat import fixtures as _fixtures
from tests.core.lab import conftest as _lab_fixtures

chat_model = _fixtures.chat_model
f32_gguf = _fixtures.f32_gguf
gguf_of = _fixtures.gguf_of
one_torch_thread = _lab_fixtures.one_torch_thread

GIB = 1024**3


def _run(capsys, *argv: str) -> tuple[int, dict | None, str]:
    rc = main(list(argv))
    cap = capsys.readouterr()
    return rc, (json.loads(cap.out) if rc == 0 and "--json" in argv else None), cap.err


def test_memory_shape_json_is_the_sanity_point(capsys):
    rc, d, _ = _run(
        capsys,
        "memory",
        "--params",
        "70553706496",
        "--layers",
        "80",
        "--kv-heads",
        "8",
        "--head-dim",
        "128",
        "--ctx",
        "32768",
        "--json",
    )
    assert rc == 0
    assert d["kv_cache_bytes"] == 10 * GIB
    fp16 = next(r for r in d["rows"] if r["precision"] == "FP16/BF16")
    assert fp16["weights_bytes"] == 2 * 70553706496
    assert set(fp16["fits"]) == {"8GB", "12GB", "16GB", "24GB", "48GB", "80GB", "this_machine"}
    assert {"precision", "weights_bytes", "total_bytes", "fits"} <= set(fp16)
    assert "KV cache = 2" in d["formulas"]


def test_memory_of_a_model_with_a_quantized_cache(capsys, chat_model):
    rc, d, _ = _run(capsys, "memory", str(chat_model), "--ctx", "2048", "--kv-type", "q4_0", "--json")
    assert rc == 0 and d["kv_type"] == "q4_0"
    assert d["kv_cache_bytes"] == 2 * d["layers"] * d["kv_heads"] * d["head_dim"] * 2048 * 18 // 32
    assert {r["bpw_source"] for r in d["rows"]} == {"format", "plan"}
    rc = main(["memory", str(chat_model), "--ctx", "2048"])
    out = capsys.readouterr().out
    assert rc == 0 and "Formulas:" in out and "Q4_K_M (plan)" in out


@pytest.mark.parametrize(
    "argv",
    [
        ["memory", "--params", "7e9", "--ctx", "4096"],  # shape incomplete
        ["memory", "--params", "7e9", "--layers", "32", "--kv-heads", "8", "--head-dim", "128", "--ctx", "0"],
        ["memory", "/nowhere/model", "--ctx", "4096"],
        ["sweep", "/nowhere/model", "--tensor", "x"],
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys, argv):
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("error: ") and err.count("\n") == 1


def test_sweep_json(capsys, chat_model):
    rc, d, _ = _run(
        capsys, "sweep", str(chat_model), "--tensor", "model.layers.1.self_attn.o_proj.weight", "--json"
    )
    assert rc == 0 and d["shape"] == [256, 256]
    row = d["rows"][0]
    assert set(row) >= {"bits", "granularity", "group", "symmetric", "snr_db", "mse", "cosine", "bpw"}
    assert {r["bits"] for r in d["rows"] if r["granularity"] == "per-channel"} >= {2, 3, 4, 5, 6, 8, 16}
    assert d["cliff_snr_db"] == 12.0 and d["cliffs"]


@pytest.mark.usefixtures("one_torch_thread")
def test_qat_json(capsys, chat_model, tmp_path):
    text = tmp_path / "train.txt"
    text.write_text(_fixtures_text(), encoding="utf-8")
    rc, d, _ = _run(
        capsys,
        "qat",
        str(chat_model),
        "--bits",
        "3",
        "--group",
        "64",
        "--steps",
        "2",
        "--text",
        str(text),
        "--seq-len",
        "32",
        "--threads",
        "1",  # the fixture puts torch's thread count back afterwards
        "--eval-chunks",
        "1",
        "--lr",
        "1e-3",
        "--json",
    )
    assert rc == 0
    assert {"float_loss", "ptq_loss", "qat_loss", "train_seconds", "peak_rss_bytes"} <= set(d)
    assert d["bits"] == 3 and d["group"] == 64 and d["steps"] == 2 and d["output"] is None
    rc = main(
        ["qat", str(chat_model), "--bits", "3", "--steps", "1", "--text", str(tmp_path / "missing.txt")]
    )
    assert rc == 2 and "missing.txt" in capsys.readouterr().err
    rc = main(["qat", str(chat_model), "--bits", "3", "--steps", "1", "--text", str(text), "--threads", "0"])
    assert rc == 2 and "--threads" in capsys.readouterr().err


def _fixtures_text() -> str:
    from studio.core.factory import TEXT_PATH

    return TEXT_PATH.read_text(encoding="utf-8")


def test_eval_kv_type_and_verdict(capsys, chat_model, f32_gguf):
    argv = ["eval", "--original", str(chat_model), "--variant", str(f32_gguf), "--kv-type", "q8_0"]
    argv += ["--ctx", "64", "--chunks", "1", "--device", "cpu"]
    rc, d, _ = _run(capsys, *argv, "--json")
    assert rc == 0
    (v,) = d["variants"]
    assert v["kv_type"] == "q8_0" and v["kv_cache_bytes"] > 0
    assert v["verdict"] == v["verdict_detail"]["verdict"] == "excellent"  # F32 weights, Q8_0 cache
    rc = main(argv)
    out = capsys.readouterr().out
    assert rc == 0 and "verdict" in out and "[KV q8_0]" in out


def test_memory_of_a_hub_id_fetches_only_its_config(capsys, monkeypatch):
    from types import SimpleNamespace

    from studio.core.hub import api

    cfg = {"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32}
    cfg |= {"num_key_value_heads": 8}
    monkeypatch.setattr(
        api, "model_details", lambda repo_id, **kw: SimpleNamespace(params=8 * 10**9, config=cfg)
    )
    # not a folder and not in the Hugging Face cache: only the Hub's details are asked for
    rc, d, _ = _run(capsys, "memory", "org/not-cached-model", "--ctx", "8192", "--json")
    assert rc == 0 and d["model"] == "org/not-cached-model"
    assert d["kv_cache_bytes"] == 2 * 32 * 8 * 128 * 8192 * 2 == GIB
