"""A two-rank legacy experience step in CPU mode, shaped like the final legacy release's own experience test
(spawned ranks, a Gemini strategy falling back to ddp, experience made and gathered, the group left for exit to
end), run RUNS times: no rank may abort at exit ("terminate called without an active exception", SIGABRT). About
15-40 s a run on a 2-core host, hence few runs."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.slow

RUNS = 5

PROBE = textwrap.dedent('''\
    import os, sys
    import torch, torch.distributed as dist
    import torch.multiprocessing as mp

    def rank_main(rank, port):
        import warnings
        warnings.simplefilter("ignore")
        os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(port))
        from coati.experience_buffer import NaiveExperienceBuffer
        from coati.experience_maker import NaiveExperienceMaker
        from coati.models.base import RewardModel
        from coati.models.gpt import GPTActor, GPTCritic
        from coati.trainer.strategies import GeminiStrategy
        from transformers import GPT2Config

        config = GPT2Config(n_embd=32, n_layer=2, n_head=2, vocab_size=64, n_positions=64)
        strategy = GeminiStrategy(placement_policy="static")
        actor, critic = GPTActor(config=config).cuda(), GPTCritic(config=config).cuda()
        initial, reward = GPTActor(config=config).cuda(), RewardModel(model=GPTCritic(config=config).model).cuda()
        actor, critic, initial, reward = strategy.prepare(actor, critic, initial, reward)

        class Tokenizer:
            padding_side, eos_token_id, pad_token_id = "left", 0, 0

        maker = NaiveExperienceMaker(actor, critic, reward, initial, Tokenizer())
        buffer = NaiveExperienceBuffer(2, cpu_offload=False)
        for _ in range(2):
            ids = torch.randint(1, 64, (4, 6), device="cuda")
            experience = maker.make_experience(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True,
                                               max_length=12)
            gathered = [torch.empty_like(experience.sequences) for _ in range(2)]
            dist.all_gather(gathered, experience.sequences.contiguous())
            buffer.append(experience)
        for batch in strategy.setup_dataloader(buffer):
            dist.all_reduce(batch.advantages.sum().reshape(1))

    if __name__ == "__main__":
        mp.spawn(rank_main, args=(int(sys.argv[1]),), nprocs=2)
        print("ranks done")
''')


def test_no_rank_aborts_at_exit_in_cpu_mode(tmp_path):
    from coati_relay.training.distributed import PROCESS_GROUP_ENV, free_port

    script = tmp_path / "experience_ranks.py"
    script.write_text(PROBE)
    env = {k: v for k, v in os.environ.items() if k not in PROCESS_GROUP_ENV}
    env.update(COATI_RELAY_CPU_MODE="1", HF_HUB_OFFLINE="1", PYTHONFAULTHANDLER="1")
    aborted = []
    for run in range(RUNS):
        proc = subprocess.run([sys.executable, str(script), str(free_port())], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=300)
        output = proc.stdout + proc.stderr
        if "terminate called" in output or "SIGABRT" in output:
            aborted.append((run, proc.returncode, output[-3000:]))
        else:
            assert proc.returncode == 0 and "ranks done" in output, output[-4000:]
    assert not aborted, f"{len(aborted)} of {RUNS} runs aborted; the first: {aborted[0]}"
