#!/usr/bin/env python3
"""The published gpt-oss model's outputs on a checkpoint, as a fixture for meshtest's tests.

Loads the published PyTorch gpt-oss code (the package gpt_oss.torch of the repository given by
--gpt-oss; it stays outside meshtest), runs it on the CPU on a checkpoint that meshtest wrote
(`meshtest-run gpt-oss --make-tiny-checkpoint DIR --tiny-dtype bf16 --seed N`) and writes
DIR/reference.safetensors with, for the published precision (bf16) and for f32 (the same model
with every parameter upcast, `Transformer.float()`):

  <dtype>.logits.layers<N>   f32 [T, vocab]: the logits of the model cut after its first N blocks
                             (embedding, N blocks, the final norm, the unembedding), N = 0 .. L;
                             bf16 values are stored exactly (upcast)
  tokens                     i64 [T]: the token ids

meshtest's test (tests/test_gpt_oss_published.cpp) reads the checkpoint and this file. Needs
torch and safetensors (the published loader's); numpy is not needed.

  python3 tools/gpt_oss_reference.py --gpt-oss ~/src/gpt-oss --tokens 3,17,99,42,5,127,64 \\
      tests/fixtures/gpt_oss_published/seed0 ...
"""

import argparse
import copy
import json
import struct
import sys
from pathlib import Path


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpt-oss", required=True, type=Path,
                    help="the published gpt-oss repository (holds gpt_oss/torch/model.py)")
    ap.add_argument("--tokens", required=True,
                    help="comma-separated token ids, e.g. 3,17,99 (each below the vocabulary)")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch CPU threads (default 1: one summation order)")
    ap.add_argument("checkpoints", nargs="+", type=Path,
                    help="checkpoint directories (config.json + *.safetensors); the fixture is "
                         "written into each")
    a = ap.parse_args(argv)
    model_py = a.gpt_oss / "gpt_oss" / "torch" / "model.py"
    if not model_py.is_file():
        ap.error(f"--gpt-oss {a.gpt_oss}: no {model_py.relative_to(a.gpt_oss)} there")
    try:
        a.tokens = [int(t) for t in a.tokens.split(",")]
    except ValueError:
        ap.error(f"--tokens {a.tokens!r}: expected comma-separated integers")
    for c in a.checkpoints:
        if not (c / "config.json").is_file():
            ap.error(f"{c}: not a checkpoint directory (no config.json)")
    return a


def write_safetensors(path, tensors, metadata):
    """tensors: name -> (dtype code "F32" / "I64", shape, little-endian bytes)."""
    header, offset = {"__metadata__": metadata}, 0
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(shape),
                        "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for _, _, data in tensors.values():
            f.write(data)


def f32_bytes(torch, t):
    return bytes(t.detach().to(torch.float32).contiguous().cpu().untyped_storage())


def cut_logits(torch, model, tokens):
    """logits of the model cut after 0 .. L blocks."""
    out = []
    with torch.inference_mode():
        x = model.embedding(tokens)
        out.append(model.unembedding(model.norm(x)))
        for block in model.block:
            x = block(x)
            out.append(model.unembedding(model.norm(x)))
    return out


def main(argv):
    a = parse_args(argv)
    sys.path.insert(0, str(a.gpt_oss))
    import torch
    from gpt_oss.torch.model import Transformer

    torch.set_num_threads(a.threads)
    tokens = torch.tensor(a.tokens, dtype=torch.int64)
    for ckpt in a.checkpoints:
        vocab = json.loads((ckpt / "config.json").read_text())["vocab_size"]
        bad = [t for t in a.tokens if not 0 <= t < vocab]
        if bad:
            sys.exit(f"{ckpt}: tokens {bad} lie outside the vocabulary [0, {vocab})")
        model = Transformer.from_checkpoint(str(ckpt), device="cpu")
        tensors = {"tokens": ("I64", [len(a.tokens)], struct.pack(f"<{len(a.tokens)}q", *a.tokens))}
        for name, m in (("bf16", model), ("f32", copy.deepcopy(model).float())):
            for n, logits in enumerate(cut_logits(torch, m, tokens)):
                tensors[f"{name}.logits.layers{n}"] = ("F32", logits.shape, f32_bytes(torch, logits))
        meta = {"torch": torch.__version__, "threads": str(a.threads),
                "producer": "tools/gpt_oss_reference.py"}
        write_safetensors(ckpt / "reference.safetensors", tensors, meta)
        print(f"{ckpt}: {len(tensors) - 1} logits tensors, torch {torch.__version__}")


if __name__ == "__main__":
    main(sys.argv[1:])
