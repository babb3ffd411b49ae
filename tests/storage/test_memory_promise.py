"""The memory promise, measured from outside: peak RSS(big) <= peak RSS(tiny) + cap."""

import subprocess
import sys

import numpy as np

WRAP = ("import resource, subprocess, sys\n"
        "r = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL).returncode\n"
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024, r)")
INGEST = [sys.executable, "-c",
          "import sys; from ooc_learn.cli import ingest_main; sys.exit(ingest_main())"]


def child_peak_rss(cmd):
    out = subprocess.run([sys.executable, "-c", WRAP, *map(str, cmd)], capture_output=True,
                         text=True, timeout=600)
    rss, rc = out.stdout.split()
    assert int(rc) == 0, out.stderr
    return int(rss)


def write_source(path, n_rows, rng):
    # ~100 bytes a row: 10 random features of 1000, 6-digit values
    with open(path, "w") as fh:
        for a in range(0, n_rows, 20000):
            m = min(20000, n_rows - a)
            idx = np.sort(rng.integers(1, 1000, size=(m, 10)), axis=1)
            val = rng.random((m, 10))
            lab = rng.choice(["1", "-1"], m)
            fh.write("".join(
                lab[i] + " " + " ".join(f"{j}:{v:.6f}" for j, v in zip(idx[i], val[i])) + "\n"
                for i in range(m) if len(set(idx[i])) == 10))


def test_ingest_of_a_source_10x_the_cap_stays_within_tiny_run_plus_cap(tmp_path, rng):
    cap = 4 << 20
    big = tmp_path / "big.svm"
    write_source(big, 400_000, rng)
    assert big.stat().st_size > 10 * cap
    tiny = tmp_path / "tiny.svm"
    tiny.write_text("1 1:0.5 3:1\n-1 2:0.25\n" * 20)
    common = ["--quiet", "--memory", str(cap), "--overwrite", "--no-index"]
    base = child_peak_rss(INGEST + [tiny, "-o", tmp_path / "tiny.store"] + common)
    peak = child_peak_rss(INGEST + [big, "-o", tmp_path / "big.store"] + common)
    # a few % of slack for allocator and page-cache noise, as the promise states
    assert peak <= base * 1.03 + cap, (peak - base) / 2**20
