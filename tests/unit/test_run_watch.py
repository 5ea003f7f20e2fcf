"""What a user sees of a run: the progress line per round on stderr (whatever the logging set-up), the known
third-party warnings filtered while ours show, the end-of-run summary, and the export and model-path keywords."""
from __future__ import annotations

import logging
import re
import warnings
from pathlib import Path

import pytest
from small_run import small_run_kwargs

from coati_relay.assembly.build import ConfigError, build_run_config
from coati_relay.observe.metrics import ProgressBar
from coati_relay.observe.run_result import RunResult

LINE = re.compile(r"GRPO toy: step (\d+)/3 reward=0\.500 loss=0\.012 kl=1\.5e-05 samples/s=41\.3 eta=\d+:\d\d:\d\d$")


def test_progress_line_per_step_goes_to_stderr_with_logging_unconfigured(capsys):
    root = logging.getLogger()
    assert not root.handlers or all(type(h).__module__.startswith("_pytest") for h in root.handlers)
    bar = ProgressBar(3, desc="GRPO toy")
    assert bar.mode == "line"  # captured stderr is no terminal
    for step in range(3):
        bar.update(step, {"reward": 0.5, "loss": 0.01234, "kl": 1.5e-5, "samples_per_s": 41.26, "lr": 1.0})
    bar.close()
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert out == "" and [int(LINE.match(line).group(1)) for line in lines] == [1, 2, 3], lines
    assert lines[-1].endswith("eta=0:00:00")


def test_progress_line_leaves_out_what_the_run_lacks(capsys):
    bar = ProgressBar(4, desc="PPO x", first_step=2)  # resumed at step 2: the ETA counts from there
    bar.update(2, {"reward": 1.0, "kl": float("nan")})
    assert re.fullmatch(r"PPO x: step 3/4 reward=1\.000 eta=0:00:\d\d\n", capsys.readouterr().err)


def test_progress_false_silences_the_line_and_the_bar(capsys):
    for force_bar in (False, True):
        bar = ProgressBar(2, enabled=False, force_bar=force_bar)
        bar.update(0, {"reward": 1.0})
        bar.close()
        assert bar.mode == "off"
    assert capsys.readouterr() == ("", "")


def test_terminal_bar_shows_the_same_fields(tmp_path):
    out = open(tmp_path / "bar.txt", "w+")
    with ProgressBar(4, desc="ppo", force_bar=True, file=out) as bar:
        bar.update(1, {"reward": 0.5, "loss": 0.25, "kl": 0.125, "samples_per_s": 8.0})
    out.seek(0)
    text = out.read()
    assert "2/4" in text and all(f in text for f in ("reward=0.500", "loss=0.250", "kl=0.125", "samples/s=8.0"))


def test_known_third_party_warnings_are_filtered_ours_are_not():
    from coati_relay.assembly.build import HostDifferenceWarning
    from coati_relay.observe import quiet_warnings

    noise = [("Please install the latest tensornvme to use async save. pip install git+https://github.com/hpcaitech/"
              "TensorNVMe.git", UserWarning, "colossalai.utils.safetensors"),
             ("Please install apex from source (https://github.com/NVIDIA/apex) to use the fused RMSNorm kernel",
              UserWarning, "colossalai.shardformer.layer.normalization"),
             ("`broadcast_buffers` is deprecated. Use `forward_sync_buffers` instead. IMPORTANT: ...", FutureWarning,
              "colossalai.booster.plugin.torch_ddp_plugin")]
    with warnings.catch_warnings(record=True) as caught:
        warnings.resetwarnings()
        warnings.simplefilter("always")
        quiet_warnings.install()
        for message, category, module in noise:
            warnings.warn_explicit(message, category, "x.py", 1, module=module)
        # the same text from elsewhere, and our own warnings, still show
        warnings.warn_explicit(noise[0][0], UserWarning, "x.py", 1, module="someone.else")
        warnings.warn_explicit("this run differs", HostDifferenceWarning, "x.py", 1, module="coati_relay.config")
        warnings.warn_explicit("deprecated", DeprecationWarning, "x.py", 1, module="coati_compat.legacy")
    assert [w.category for w in caught] == [UserWarning, HostDifferenceWarning, DeprecationWarning]


def test_the_summary_names_where_everything_is(tmp_path):
    result = RunResult(history=[{}] * 20, checkpoints=[str(tmp_path / "checkpoints" / "step-000020")],
                       run_dir=tmp_path, summary={"steps": 20, "reward_start": 0.041344, "reward_end": 0.87617,
                                                  "wall_s": 19.98765},
                       counters={}, setup_s=4.123, export_dir=tmp_path / "hf_model")
    lines = result.report().splitlines()
    assert lines == [f"run dir         {tmp_path}", "steps           20", "reward          0.041 -> 0.876",
                     "wall time       20.0s (+4.1s set-up)",
                     f"checkpoints     {tmp_path / 'checkpoints'} (latest: step-000020)",
                     f"exported model  {tmp_path / 'hf_model'}"]
    empty = RunResult(history=[], checkpoints=[], run_dir=tmp_path, summary={}, counters={})
    assert "reward          - -> -" in empty.report() and empty.report().endswith("exported model  -")


def test_export_dir_default_path_and_off(tmp_path, tiny_model_path):

    assert build_run_config(**small_run_kwargs(tmp_path, tiny_model_path)).checkpointing.export_dir == \
        tmp_path / "run" / "hf_model"
    for off in (False, None):
        kw = small_run_kwargs(tmp_path, tiny_model_path, export_dir=off)
        assert build_run_config(**kw).checkpointing.export_dir is None
    kw = small_run_kwargs(tmp_path, tiny_model_path, export_dir=str(tmp_path / "mine"))
    assert build_run_config(**kw).checkpointing.export_dir == tmp_path / "mine"


def test_export_dir_bad_values_are_named(tmp_path, tiny_model_path):

    with pytest.raises(ConfigError, match=r"export_dir must be True \(run_dir/hf_model\), a directory path"):
        build_run_config(**small_run_kwargs(tmp_path, tiny_model_path, export_dir=3))
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="exists and is neither empty nor an earlier export"):
        build_run_config(**small_run_kwargs(tmp_path, tiny_model_path, export_dir=str(tmp_path / "taken")))
    (tmp_path / "earlier").mkdir()
    (tmp_path / "earlier" / "coati_relay_export.json").write_text("{}")
    kw = small_run_kwargs(tmp_path, tiny_model_path, export_dir=str(tmp_path / "earlier"))
    assert build_run_config(**kw).checkpointing.export_dir == tmp_path / "earlier"  # a resumed run replaces it


def test_colocated_run_takes_the_model_path_once(tmp_path, tiny_model_path):

    kw = small_run_kwargs(tmp_path, tiny_model_path, colocate=True)
    del kw["inference_model_config"]
    models = build_run_config(**kw).models
    assert Path(models.model_path).resolve() == Path(models.train_path).resolve() == Path(tiny_model_path).resolve()
    kw = small_run_kwargs(tmp_path, tiny_model_path)
    del kw["inference_model_config"]
    with pytest.raises(ConfigError, match=r"inference_model_config\['path'\] is required"):
        build_run_config(**kw)  # producers on their own need to know what they generate with


def test_the_missing_kernels_message_of_bitsandbytes_is_dropped_other_failures_show(caplog):
    import logging

    from coati_relay.observe import quiet_warnings

    quiet_warnings.install()
    quiet_warnings.install()  # once is enough, twice is the same
    log = logging.getLogger("bitsandbytes.backends.cpu.ops")
    message = ("Failed to load CPU gemm_4bit_forward from kernels-community: %s. Please make sure you already "
               "`pip install kernels` and the kernels >= 0.11.1")
    with caplog.at_level(logging.WARNING):
        log.warning(message, ModuleNotFoundError("No module named 'kernels'"))
        log.warning(message, RuntimeError("hub unreachable"))
    assert [r.args[0].args[0] for r in caplog.records] == ["hub unreachable"]
    assert len(log.filters) == 1


def test_vllms_start_up_noise_without_a_tokenizer_is_dropped_other_warnings_show(caplog):
    import logging

    from coati_relay.observe import quiet_warnings

    quiet_warnings.install()
    renderer, worker = logging.getLogger("vllm.renderers.base"), logging.getLogger("vllm.v1.worker.cpu_worker")
    with caplog.at_level(logging.WARNING):
        for cause in (ValueError("Tokenizer not available when `skip_tokenizer_init=True`"), OSError("disk full")):
            try:
                raise cause
            except Exception:
                renderer.warning("Chat template warmup failed", exc_info=True)
        worker.warning("CPU backend doesn't allow to use `torch.set_num_threads` after the thread binding, skip it.")
        worker.warning("KV cache of 0 bytes")
    assert [(r.getMessage(), str(r.exc_info[1]) if r.exc_info else None) for r in caplog.records] == [
        ("Chat template warmup failed", "disk full"), ("KV cache of 0 bytes", None)]
