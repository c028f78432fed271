"""Token corpora on disk (``dynlab.lm.data.tokens``): memory when reading from a large token
folder, and the speed of ``prepare_tokens`` against the tokenizer library alone.

(a) Memory. A synthetic token folder of ``--big-tokens`` random uint16 ids (600 M: 1.2 GB;
    written directly, with its record, not tokenized) and a 1 MB one. A fresh subprocess per
    folder imports numpy and dynlab, opens the folder (``open_token_folder``) and reads
    ``--batches`` batches of ``--batch`` random windows of ``--length`` + 1 ids each, as a
    training loop does (``np.asarray(mm[s:s + L + 1]).astype(np.int64)``). Reported: the
    resident set after the imports (``VmRSS``) and the peak by then (``ru_maxrss``: the
    imports of torch peak above what stays), the peak at the end and its growth over the
    peak after the imports, and, after the imports and at the end, the resident
    anonymous memory (``RssAnon``: the process's own) and the resident pages of mapped
    files (``RssFile``: the page cache mapped in, which the kernel can drop at any time).
    The big folder is read twice: just written (its pages in the page cache), and after
    dropping its pages from the cache (``posix_fadvise(DONTNEED)`` on that file only), as
    a corpus larger than the cache is read. It is deleted afterwards.

(b) Speed. ``--text-mb`` MB of generated English-like text as one JSON-lines file of many
    documents, and a byte-level BPE tokenizer of ``--vocab`` ids trained here on a sample
    of it. Alternating ``--repeats`` times in one process: ``prepare_tokens`` of the file
    into a fresh folder (reading, hashing, tokenizing, writing, splitting) against the
    ``tokenizers`` library's own ``Tokenizer.encode_batch`` over the same documents, held
    in memory as a list, in one call. Both run on every core. Reported: each time, and the
    median over the repeats of the ratio prepare / encode_batch (target: at most 1.5), of
    wall times and of CPU times (every thread of the process: steadier on a shared machine).
    Then ``prepare_tokens`` once more in a fresh process: its peak RSS growth.

    python benchmarks/bench_tokens.py                      # both parts, the recorded sizes
    python benchmarks/bench_tokens.py --part speed --text-mb 10
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

READER = r"""
import resource, sys
def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1])  # kB
def maxrss():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # kB on Linux
import numpy as np
from dynlab.lm.data.tokens import open_token_folder
base = [status("VmRSS"), maxrss(), status("RssAnon"), status("RssFile")]
folder, batches, batch, length = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
mm = open_token_folder(folder).train
rng = np.random.default_rng(0)
total = 0
for _ in range(batches):
    starts = rng.integers(0, len(mm) - length - 1, size=batch)
    x = np.stack([np.asarray(mm[s:s + length + 1]).astype(np.int64) for s in starts])
    total += int(x[:, -1].sum())
print(*base, maxrss(), status("RssAnon"), status("RssFile"), len(mm), total)
"""


def run_fresh(*args: str) -> list[str]:
    """The words ``python -c ARGS…`` prints, run as a child of a shell rather than of this
    process: Linux carries the peak RSS of a process's memory image across ``exec`` into
    ``ru_maxrss``, so a child forked from this (large) process would report this process's
    size as its own peak. The shell forks Python afresh (``"$@"; exit $?``: not ``exec``)."""
    return subprocess.run(["sh", "-c", '"$@"; exit $?', "sh", sys.executable, "-c", *args], capture_output=True,
                          text=True, check=True).stdout.split()


def machine() -> str:
    """CPU model and cores, as ``lscpu`` and the process see them."""
    model = platform.processor() or "unknown CPU"
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        model = next(line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name"))
    except (OSError, subprocess.CalledProcessError, StopIteration):
        pass
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{model}, {os.cpu_count()} cores ({usable} usable)"


def write_synthetic_folder(folder: Path, n_tokens: int, n_ids: int = 50_000, seed: int = 0) -> None:
    """A token folder of ``n_tokens`` random uint16 ids (train) and 1 000 (val), written in
    pieces of 50 M ids, with its record; a byte-tokenizer-free ``hf``-like spec of ``n_ids``."""
    from dynlab.lm.data.tokenizer import TokenizerSpec
    from dynlab.lm.data.tokens import RECORD, TokenCounts, TokenRecord

    folder.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    with open(folder / "train.bin", "wb") as f:
        left = n_tokens
        while left:
            k = min(left, 50_000_000)
            rng.integers(0, n_ids, size=k, dtype=np.uint16).tofile(f)
            left -= k
    rng.integers(0, n_ids, size=1000, dtype=np.uint16).tofile(folder / "val.bin")
    spec = TokenizerSpec(kind="hf", path="/synthetic/tokenizer.json", n_ids=n_ids, sha256="0" * 64)
    record = TokenRecord(dtype="uint16", tokenizer=spec, eos_id=0, val_fraction=1000 / (n_tokens + 1000), sources=[],
                         documents=0, tokens=TokenCounts(train=n_tokens, val=1000))
    (folder / RECORD).write_text(json.dumps(record.model_dump(mode="json")))


def read_windows(folder: Path, batches: int, batch: int, length: int, cold: bool = False) -> dict[str, float]:
    """Numbers (MB) of one subprocess reading windows from ``folder``; ``cold``: its train.bin
    dropped from the page cache first (``posix_fadvise(DONTNEED)``, this file only)."""
    if cold:
        fd = os.open(folder / "train.bin", os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    out = run_fresh(READER, str(folder), str(batches), str(batch), str(length))
    rss0, peak0, anon0, file0, peak, anon, file_, n, _ = (int(x) for x in out)
    return {"tokens": n, "rss0": rss0 / 1024, "peak0": peak0 / 1024, "anon0": anon0 / 1024, "file0": file0 / 1024,
            "peak": peak / 1024, "growth": (peak - peak0) / 1024, "anon": anon / 1024, "file": file_ / 1024}


def memory_part(args: argparse.Namespace, work: Path) -> None:
    print(f"(a) reading {args.batches} batches of {args.batch} x {args.length + 1} random windows, "
          "a fresh process per folder (MB; 'peak' is ru_maxrss, 'anon' RssAnon, 'file' RssFile)")
    small, big = work / "small", work / "big"
    write_synthetic_folder(small, 500_000)  # 1 MB
    t = time.perf_counter()
    write_synthetic_folder(big, args.big_tokens)
    size = (big / "train.bin").stat().st_size
    print(f"    wrote {size / 1e9:.2f} GB of ids in {time.perf_counter() - t:.1f} s")
    try:
        runs = (("1 MB", small, False), (f"{size / 1e9:.1f} GB, in the page cache", big, False),
                (f"{size / 1e9:.1f} GB, dropped from the page cache", big, True))
        for name, folder, cold in runs:
            r = read_windows(folder, args.batches, args.batch, args.length, cold)
            print(f"    {name} ({r['tokens']:,} ids): after imports rss {r['rss0']:.0f}, peak {r['peak0']:.0f} "
                  f"(anon {r['anon0']:.0f}, file {r['file0']:.0f}); at the end peak {r['peak']:.0f} "
                  f"(+{r['growth']:.0f}), anon {r['anon']:.0f}, file {r['file']:.0f}")
    finally:
        shutil.rmtree(big, ignore_errors=True)
        shutil.rmtree(small, ignore_errors=True)


def make_text(n_bytes: int, seed: int = 0) -> list[str]:
    """Documents of English-like text: words of a Zipf-distributed made-up vocabulary of
    20 000 words, sentences of 5–25 words, paragraphs, documents of 200 B–8 KB."""
    rng = random.Random(seed)
    letters = "etaoinshrdlucmfwypvbgkjqxz"
    weights = [12.7, 9.1, 8.2, 7.5, 7.0, 6.7, 6.3, 6.1, 6.0, 4.3, 4.0, 2.8, 2.8, 2.4, 2.4, 2.0, 2.0, 1.9, 1.5, 1.0,
               0.8, 0.2, 0.2, 0.15, 0.1, 0.07]
    vocab = ["".join(rng.choices(letters, weights, k=rng.randint(1, 10))) for _ in range(20_000)]
    zipf = [1 / (i + 1) for i in range(len(vocab))]
    pool = rng.choices(vocab, zipf, k=500_000)  # drawn once: the text repeats the pool's Zipf mix
    docs, total = [], 0
    while total < n_bytes:
        target = rng.randint(200, 8000)
        parts, size = [], 0
        while size < target:
            words = [pool[rng.randrange(len(pool))] for _ in range(rng.randint(5, 25))]
            sentence = " ".join(words).capitalize() + rng.choice([".", ".", ".", "?", "!", ","])
            if rng.random() < 0.1:
                sentence += f" {rng.randint(1, 2000)}"
            parts.append(sentence + ("\n\n" if rng.random() < 0.15 else " "))
            size += len(parts[-1])
        docs.append("".join(parts).strip())
        total += len(docs[-1].encode("utf-8"))
    return docs


def train_bpe(docs: list[str], vocab: int, folder: Path) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(docs, trainer)
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    return folder


PREPARER = r"""
import resource, sys
from dynlab.lm.data.tokenizer import load_tokenizer
from dynlab.lm.data.tokens import prepare_tokens
tok = load_tokenizer(sys.argv[2])
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
prepare_tokens([sys.argv[1]], tok, sys.argv[3])
print(base, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def prepare_memory(src: Path, tok_dir: Path, out: Path) -> tuple[float, float]:
    """Peak RSS (MB) of a fresh process after loading the tokenizer, and after ``prepare_tokens``."""
    got = run_fresh(PREPARER, str(src), str(tok_dir), str(out))
    shutil.rmtree(out, ignore_errors=True)
    return int(got[0]) / 1024, int(got[1]) / 1024


def speed_part(args: argparse.Namespace, work: Path) -> None:
    from dynlab.lm.data.tokenizer import load_tokenizer
    from dynlab.lm.data.tokens import open_token_folder, prepare_tokens

    t = time.perf_counter()
    docs = make_text(int(args.text_mb * 1e6))
    src = work / "corpus.jsonl"
    with open(src, "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps({"text": d}) + "\n")
    sample = docs[: max(1, len(docs) // 25)]
    tok_dir = train_bpe(sample, args.vocab, work / "bpe")
    tok = load_tokenizer(tok_dir)
    print(f"(b) {sum(len(d.encode()) for d in docs) / 1e6:.1f} MB of text in {len(docs):,} documents "
          f"({src.stat().st_size / 1e6:.1f} MB as JSON lines), BPE of {tok.n_ids} ids trained on "
          f"{len(sample):,} of them; set up in {time.perf_counter() - t:.1f} s")
    prep, enc, ratios, cpu_ratios = [], [], [], []
    n_tokens = 0
    for r in range(args.repeats):
        order = ("prepare", "encode") if r % 2 == 0 else ("encode", "prepare")
        times, cpu = {}, {}
        for what in order:
            t, c = time.perf_counter(), time.process_time()  # CPU time of every thread of this process
            if what == "prepare":
                out, _ = prepare_tokens([src], tok, work / "tok", val_fraction=0.01)
                times[what], cpu[what] = time.perf_counter() - t, time.process_time() - c
                rec = open_token_folder(out).record
                n_tokens = rec["tokens"]["train"] + rec["tokens"]["val"]
                shutil.rmtree(out)
            else:
                encodings = tok.tok.encode_batch(docs, add_special_tokens=False)
                times[what], cpu[what] = time.perf_counter() - t, time.process_time() - c
                del encodings
        prep.append(times["prepare"])
        enc.append(times["encode"])
        ratios.append(times["prepare"] / times["encode"])
        cpu_ratios.append(cpu["prepare"] / cpu["encode"])
        print(f"    round {r + 1}: prepare_tokens {times['prepare']:.2f} s ({cpu['prepare']:.2f} s CPU), encode_batch "
              f"{times['encode']:.2f} s ({cpu['encode']:.2f} s CPU); ratio {ratios[-1]:.2f} (CPU {cpu_ratios[-1]:.2f})")
    mb = sum(len(d.encode()) for d in docs) / 1e6
    print(f"    {n_tokens:,} tokens ({n_tokens / len(docs):.0f} a document plus its end id); median prepare_tokens "
          f"{statistics.median(prep):.2f} s ({mb / statistics.median(prep):.1f} MB/s), encode_batch "
          f"{statistics.median(enc):.2f} s ({mb / statistics.median(enc):.1f} MB/s); median ratio "
          f"{statistics.median(ratios):.2f} (target ≤ 1.5), of CPU times {statistics.median(cpu_ratios):.2f}")
    before, after = prepare_memory(src, tok_dir, work / "tok")
    print(f"    prepare_tokens alone in a fresh process: peak RSS {before:.0f} MB after loading the tokenizer, "
          f"{after:.0f} MB at the end (+{after - before:.0f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=("all", "memory", "speed"), default="all")
    parser.add_argument("--big-tokens", type=int, default=600_000_000)
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--length", type=int, default=2048)
    parser.add_argument("--text-mb", type=float, default=50.0)
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--work", type=Path, default=None, help="a folder for the files (default: a temporary one)")
    args = parser.parse_args()
    print(f"machine: {machine()}; python {platform.python_version()}, numpy {np.__version__}; "
          f"{datetime.now(timezone.utc).isoformat(timespec='seconds')}")
    try:
        import tokenizers

        print(f"tokenizers {tokenizers.__version__}")
    except ImportError:
        pass
    work = Path(tempfile.mkdtemp(prefix="bench-tokens-", dir=args.work))
    try:
        if args.part in ("all", "memory"):
            memory_part(args, work)
        if args.part in ("all", "speed"):
            speed_part(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"whole benchmark: peak RSS of this process {peak:.0f} MB")


if __name__ == "__main__":
    main()
