"""`coati-relay export`: a real GRPO run's checkpoint (torch DDP, colocated) and a real LoRA policy's checkpoint
(`TrainingBackend` after an optimizer step, saved by `save_checkpoint`) exported, loaded back with
``AutoModelForCausalLM.from_pretrained`` / peft / vLLM, compared weight for weight and greedy token for token with the
trained policy."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from coati_relay.export import EXPORT_FILE, export_checkpoint

pytestmark = pytest.mark.slow
PROMPTS = [[3, 40, 41, 42, 43, 44], [7, 8, 9], [100, 101, 102, 103]]


def _greedy(model, prompts=PROMPTS, new_tokens=10):
    model.eval()
    out = []
    with torch.no_grad():
        for prompt in prompts:
            ids = torch.tensor([prompt])
            seq = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                                 do_sample=False, pad_token_id=0)
            out.append(seq[0, len(prompt):].tolist())
    return out


def _from_pretrained(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)


def _trained_policy(model_path, step_dir, lora=None):
    """The policy as the engine restores it from a checkpoint: `TrainingBackend.load` of ``step_dir/policy``."""
    from coati_relay.training.booster_backend import TrainingBackend, load_causal_lm

    backend = TrainingBackend(load_causal_lm(model_path, lora=lora), lr=1e-3, plugin="ddp", allow_cpu_fallback=True)
    backend.load(Path(step_dir) / "policy")
    return backend


@pytest.fixture(scope="module")
def grpo_run(tiny_model_path, tmp_path_factory):
    """A colocated GRPO run of 3 one-round episodes on the toy task: a checkpoint after each (ColossalChat's
    cadence saves at every episode's end), and the default export of the last one to ``run/hf_model``."""
    from run_helpers import run_kwargs

    from coati_relay import launch_distributed
    from coati_relay.toy import write_toy_dataset

    root = tmp_path_factory.mktemp("export-run")
    data = write_toy_dataset(root / "toy.jsonl", num_prompts=8)
    kw = run_kwargs(tiny_model_path, data, root / "run", "GRPO", "transformers", rounds=3, num_producers=1,
                    num_consumer_procs=1, inference_batch_size=8, train_batch_size=8, save_interval=2,
                    colocate=True, export_dir=True)
    result = launch_distributed(**kw)
    assert [Path(c).name for c in result.checkpoints] == ["step-000001", "step-000002", "step-000003"]
    assert result.export_dir == root / "run" / "hf_model"
    return root / "run"


def test_a_run_exports_its_final_policy_at_the_end(grpo_run, tiny_model_path):
    out = grpo_run / "hf_model"
    assert json.loads((out / EXPORT_FILE).read_text())["step"] == 3
    policy = _trained_policy(tiny_model_path, grpo_run / "checkpoints" / "step-000003")
    assert _greedy(_from_pretrained(out)) == _greedy(policy.unwrapped())


def test_export_of_a_run_dir_takes_its_latest_checkpoint(grpo_run, tiny_model_path, tmp_path):
    out = export_checkpoint(grpo_run, tmp_path / "hf")
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", EXPORT_FILE} <= names, names
    assert not any(n.endswith((".pt", ".bin")) for n in names)
    record = json.loads((out / EXPORT_FILE).read_text())
    assert record["step"] == 3 and record["form"] == "full"
    assert Path(record["model_path"]) == Path(tiny_model_path).resolve()

    exported = _from_pretrained(out)
    saved = torch.load(grpo_run / "checkpoints" / "step-000003" / "policy" / "model.pt", map_location="cpu")
    mine = exported.state_dict()
    assert mine.keys() == saved.keys()
    assert all(torch.equal(mine[k], saved[k]) for k in saved)
    base = _from_pretrained(tiny_model_path).state_dict()
    assert any(not torch.equal(base[k], saved[k]) for k in saved), "the run trained the weights"

    policy = _trained_policy(tiny_model_path, grpo_run / "checkpoints" / "step-000003")
    assert _greedy(exported) == _greedy(policy.unwrapped())
    from transformers import AutoTokenizer

    assert AutoTokenizer.from_pretrained(out).get_vocab() == AutoTokenizer.from_pretrained(tiny_model_path).get_vocab()


def test_export_of_one_checkpoint_through_the_command(grpo_run, tmp_path):
    step2 = grpo_run / "checkpoints" / "step-000002"
    done = subprocess.run([sys.executable, "-m", "coati_relay.cli", "export", str(step2), str(tmp_path / "hf"),
                           "--dtype", "bfloat16"], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == str(tmp_path / "hf")
    assert json.loads((tmp_path / "hf" / EXPORT_FILE).read_text())["step"] == 2
    from transformers import AutoModelForCausalLM

    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    saved = torch.load(step2 / "policy" / "model.pt", map_location="cpu")
    mine = exported.state_dict()
    assert all(mine[k].dtype == torch.bfloat16 and torch.equal(mine[k], saved[k].to(torch.bfloat16)) for k in saved)

    again = subprocess.run([sys.executable, "-m", "coati_relay.cli", "export", str(step2), str(tmp_path / "hf")],
                           capture_output=True, text=True, timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert again.returncode == 2 and "not an empty directory" in again.stderr
    adapter = subprocess.run([sys.executable, "-m", "coati_relay.cli", "export", str(step2), str(tmp_path / "a"),
                              "--adapter"], capture_output=True, text=True, timeout=600,
                             env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert adapter.returncode == 2 and "holds no LoRA adapters" in adapter.stderr


def test_checkpoint_written_without_a_model_description_needs_model(grpo_run, tiny_model_path, tmp_path):
    """Checkpoints from before runs saved config.json: the error names --model, which then rebuilds the model."""
    import shutil

    from coati_relay.export import ExportError

    old = tmp_path / "step-000003"
    shutil.copytree(grpo_run / "checkpoints" / "step-000003", old)
    for name in ("config.json", "source.json"):
        (old / "policy" / name).unlink()
    with pytest.raises(ExportError, match="--model MODEL_DIR"):
        export_checkpoint(old, tmp_path / "no")
    out = export_checkpoint(old, tmp_path / "hf", model=tiny_model_path)
    saved = torch.load(old / "policy" / "model.pt", map_location="cpu")
    mine = _from_pretrained(out).state_dict()
    assert all(torch.equal(mine[k], saved[k]) for k in saved)


LORA = {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj", "up_proj"]}


@pytest.fixture(scope="module")
def lora_checkpoint(tiny_model_path, tmp_path_factory):
    """A LoRA policy after three optimizer steps of next-token loss (its B matrices are no longer zero), saved as a
    run checkpoint; and its merged weights as the producers get them."""
    from coati_relay.checkpoint import save_checkpoint
    from coati_relay.training.booster_backend import TrainingBackend, load_causal_lm

    torch.manual_seed(0)
    backend = TrainingBackend(load_causal_lm(tiny_model_path, lora=LORA), lr=5e-2, plugin="ddp",
                              allow_cpu_fallback=True)
    ids = torch.tensor(PROMPTS[0] * 3).unsqueeze(0)
    for _ in range(3):
        backend.backward(backend.model(input_ids=ids, labels=ids).loss)
        backend.step()
        backend.zero_grad()
    run_dir = tmp_path_factory.mktemp("lora-run")
    save_checkpoint(run_dir, 3, {"policy": backend}, {})
    return run_dir, backend


def test_lora_checkpoint_exports_merged_weights(lora_checkpoint, tiny_model_path, tmp_path):
    run_dir, backend = lora_checkpoint
    out = export_checkpoint(run_dir, tmp_path / "merged")
    assert json.loads((out / EXPORT_FILE).read_text())["form"] == "merged"
    assert not (out / "adapter_config.json").exists()
    exported = _from_pretrained(out)
    merged = backend.state_dict_for_inference()
    mine = exported.state_dict()
    assert mine.keys() == merged.keys() and all(torch.equal(mine[k], merged[k]) for k in merged)
    base = _from_pretrained(tiny_model_path).state_dict()
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(mine[q], base[q]), "the adapters were folded in"
    restored = _trained_policy(tiny_model_path, run_dir / "checkpoints" / "step-000003", lora=LORA)
    assert _greedy(exported) == _greedy(restored.unwrapped())


def test_lora_checkpoint_exports_the_adapter_on_request(lora_checkpoint, tiny_model_path, tmp_path):
    from peft import PeftModel

    run_dir, backend = lora_checkpoint
    out = export_checkpoint(run_dir, tmp_path / "adapter", adapter=True)
    assert {"adapter_config.json", "adapter_model.safetensors", "tokenizer.json"} <= {p.name for p in out.iterdir()}
    assert not (out / "model.safetensors").exists()
    config = json.loads((out / "adapter_config.json").read_text())
    assert Path(config["base_model_name_or_path"]) == Path(tiny_model_path).resolve()
    assert config["r"] == 4 and config["lora_alpha"] == 8
    loaded = PeftModel.from_pretrained(_from_pretrained(config["base_model_name_or_path"]), out)
    trained = {k: v for k, v in backend.unwrapped().state_dict().items() if "lora_" in k}
    mine = {k: v for k, v in loaded.state_dict().items() if "lora_" in k}
    assert mine.keys() == trained.keys() and all(torch.equal(mine[k], trained[k]) for k in trained)
    assert _greedy(loaded) == _greedy(backend.unwrapped())


def test_sharded_model_directory_is_read_shard_by_shard(grpo_run, tiny_model_path, tmp_path):
    """``model.pt`` as ColossalAI's sharded directory (index + shards), as `TrainingBackend.save_model(shard=True)`
    writes it: the export reads every shard and gets the same model as from the single file."""
    import shutil

    step = tmp_path / "step-000003"
    shutil.copytree(grpo_run / "checkpoints" / "step-000003", step)
    policy = _trained_policy(tiny_model_path, step)
    (step / "policy" / "model.pt").unlink()
    policy.save_model(step / "policy" / "model.pt", shard=True, size_per_shard=1)
    shards = [p for p in (step / "policy" / "model.pt").iterdir() if not p.name.endswith(".json")]
    assert len(shards) > 1, "the tiny model spans several shards"
    out = export_checkpoint(step, tmp_path / "hf")
    saved = torch.load(grpo_run / "checkpoints" / "step-000003" / "policy" / "model.pt", map_location="cpu")
    mine = _from_pretrained(out).state_dict()
    assert mine.keys() == saved.keys() and all(torch.equal(mine[k], saved[k]) for k in saved)


def test_export_loads_in_vllm_and_decodes_greedily_as_transformers(grpo_run, tmp_path):
    from vllm import LLM, SamplingParams

    out = export_checkpoint(grpo_run, tmp_path / "hf")
    llm = LLM(model=str(out), dtype="float32", enforce_eager=True, max_model_len=64, seed=0)
    try:
        results = llm.generate([{"prompt_token_ids": p} for p in PROMPTS],
                               SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True), use_tqdm=False)
    finally:
        del llm
    hf = _greedy(_from_pretrained(out))
    assert [list(r.outputs[0].token_ids) for r in results] == hf


def test_lora_grpo_run_exports_the_weights_its_producers_generated_with(ray_cluster, tiny_model_path, tmp_path):
    """A real LoRA GRPO run (disaggregated: colocated runs refuse LoRA): the merged export equals the restored
    policy's merged weights and decodes as it does; the adapter export carries the trained adapters."""
    from run_helpers import run_kwargs

    from coati_relay import launch_distributed
    from coati_relay.toy import write_toy_dataset

    data = write_toy_dataset(tmp_path / "toy.jsonl", num_prompts=8)
    result = launch_distributed(**run_kwargs(
        tiny_model_path, data, tmp_path / "run", "GRPO", "transformers", rounds=2, num_producers=1,
        num_consumer_procs=1, inference_batch_size=8, train_batch_size=8,
        train_model_config={"path": tiny_model_path, "lora": LORA}))
    step_dir = Path(result.checkpoints[-1])
    merged = _from_pretrained(export_checkpoint(tmp_path / "run", tmp_path / "merged"))
    restored = _trained_policy(tiny_model_path, step_dir, lora=LORA)
    expected = restored.state_dict_for_inference()
    mine = merged.state_dict()
    assert mine.keys() == expected.keys() and all(torch.equal(mine[k], expected[k]) for k in expected)
    base = _from_pretrained(tiny_model_path).state_dict()
    assert any(not torch.equal(base[k], expected[k]) for k in expected), "the run trained the adapters"
    assert _greedy(merged) == _greedy(restored.unwrapped())
    out = export_checkpoint(step_dir, tmp_path / "adapter", adapter=True)
    assert json.loads((out / "adapter_config.json").read_text())["r"] == LORA["r"]
