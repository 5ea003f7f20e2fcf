"""Writes ``migration_guide/api_map.md`` from the deprecation table: one section per legacy module, one anchored
line per legacy module or name, so that every link a warning prints lands on its entry.

``python -m coati_compat.api_map [PATH]`` rewrites the file; a test keeps the committed file equal to the output.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Dict, List

from coati_compat.imports.deprecations import DEPRECATIONS, Deprecation

HEADER = """# API map: legacy names and what replaces them

Every legacy name that coati-relay still serves, with what to use instead. Each one keeps working until the
removal version and warns (`FutureWarning`) at the line of your script that uses it. The anchors below are the
ones the warnings link to. How each concept moved is in [README.md](README.md); what behaves differently from
the legacy code on purpose is in [deviations.md](deviations.md).
"""


# Prose shown under a module's heading, before its entries.
NOTES: Dict[str, str] = {
    "coati.dataset": (
        "The final release's datasets, as plain tokenisation: `PromptDataset` (instructions of a JSON list),\n"
        "`SFTDataset` / `SupervisedDataset` (`prompt + completion + eos` to `max_length`, labels `IGNORE_INDEX`\n"
        "on the prompt and the padding; ChatGLM-6B's `[gMASK] <bos>` layout for a tokenizer with\n"
        "`gmask_token_id`), `RmStaticDataset` / `HhRlhfDataset` (chosen and rejected texts plus the end token).\n"
        "Scripts that load tokenizers by hub name (`gpt2`, `facebook/opt-350m`, `bigscience/bloom-560m`,\n"
        "`hf-internal-testing/llama-tokenizer`) run offline on tiny stand-ins:\n"
        "`python -m coati_compat.hub_standins DIR` writes them into `DIR` as a Hugging Face hub cache; then run\n"
        "with `HF_HUB_CACHE=DIR HF_HUB_OFFLINE=1`. Their vocabularies are characters, so token ids differ from the\n"
        "real tokenizers'; an entry already holding a real download is left alone. `THUDM/chatglm-6b` has no\n"
        "stand-in (`ChatGLMTokenizer` is not served). `--datasets-cache DDIR` also writes the hub datasets the\n"
        "legacy scripts and tests load (`Anthropic/hh-rlhf` whole and with `data_dir` `harmless-base` or\n"
        "`helpful-base`, `Dahoas/rm-static`, `yizhongw/self_instruct` config `super_natural_instructions`) into\n"
        "`DDIR` as the `datasets` library's own cache, which is what `datasets.load_dataset` reads offline (it\n"
        "does not read dataset repositories from the hub cache then); run with `HF_DATASETS_CACHE=DDIR` as well\n"
        "(or write into `H/hub` and `H/datasets` and run with `HF_HOME=H`). They hold made-up rows (40 per split,\n"
        "`train` and `test`) with the columns the legacy classes read (`chosen`/`rejected`; `prompt`/`response`/\n"
        "`chosen`/`rejected`; `prompt`/`completion`), not the real data."
    ),
}


def _line(name: str, entry: Deprecation) -> str:
    kind = "module" if entry.is_module else "name"
    shown = name if entry.is_module else name.rpartition(".")[2]
    return (f"- **`{shown}`** ({kind}, removed in {entry.removal}; served from `{entry.target}`): "
            f"use {entry.replacement}.")


def render() -> str:
    """The page: sections in table order, each a module followed by the names served from it."""
    sections: Dict[str, List[str]] = {}
    for name, entry in DEPRECATIONS.items():
        module = name if entry.is_module else name.rpartition(".")[0]
        sections.setdefault(module, [])
    seen_anchors = set()
    for name, entry in DEPRECATIONS.items():
        module = name if entry.is_module else name.rpartition(".")[0]
        anchor = entry.anchor.partition("#")[2]
        lines = sections[module]
        if anchor not in seen_anchors:
            lines.append(f'<a id="{anchor}"></a>')
            seen_anchors.add(anchor)
        lines.append(_line(name, entry))
    parts = [HEADER]
    for module, lines in sections.items():
        note = f"{NOTES[module]}\n\n" if module in NOTES else ""
        parts.append(f"## `{module}`\n\n{note}" + "\n".join(lines) + "\n")
    return "\n".join(parts) + "\n"


def main(argv: List[str]) -> int:
    path = Path(argv[0]) if argv else Path(__file__).resolve().parents[2] / "migration_guide" / "api_map.md"
    path.write_text(render())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
